"""The one owner of an experiment directory's own files (logs/<exp>/), as rundir.py owns runs/<id>/.

runs.csv (the run index, with the config generation of each row) and its lock, experiment.yaml,
each run's config.yaml, jobs/jobs.json and jobs/cancelled are written and read here only: the
sweep, the pipeline, status, the local executor, collect and an Optuna worker call this module.

runs.csv lists every run ever swept into the experiment, with the `generation` of the config that
last swept it: results pool only the latest generation (the current config), so changing `train.lr`
and sweeping again never averages the old runs with the new ones under one label.
"""

from __future__ import annotations

import csv
import dataclasses
import fcntl
import io
import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

import hpcrl
from hpcrl.config.build import stored_configs
from hpcrl.config.experiment import Experiment
from hpcrl.config.load import experiment_from_dict
from hpcrl.config.output_dir import RUN_ID
from hpcrl.config.schema import ConfigError
from hpcrl.io import atomic_write_text
from hpcrl.store import rundir
from hpcrl.store.states import State

# libyaml when PyYAML was built with it (the wheels are): a 1000-run sweep writes and status reads
# 1000 run configs, which the pure-Python emitter and parser take ~10 s each for.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

INDEX_LOCK = "runs.csv.lock"
GENERATION = "generation"
"""runs.csv column: the config generation that last swept the run (the newest one is pooled)."""
_FIXED_COLUMNS = ("index", "run_id", "seed", GENERATION)


@dataclass
class Run:
    index: int
    run_id: str
    seed: int
    settings: dict[str, Any]
    """The swept values of this run (dotted key -> value)."""
    config: Experiment

    @property
    def setting_label(self) -> str:
        """What seeds of one setting share: the key under which results are averaged."""
        return setting_label(encoded(self.settings))


def encode_value(value: Any) -> str:
    """How a swept value is written in runs.csv (and so in labels): strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def setting_label(encoded: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(encoded.items())) or "default"


def swept_values(row: dict[str, str]) -> dict[str, str]:
    """The swept values of a runs.csv row, as written there (a run that did not sweep a key has none)."""
    return {k: v for k, v in row.items() if k not in _FIXED_COLUMNS and v != ""}


def row_label(row: dict[str, str]) -> str:
    """The setting label of a runs.csv row, without reading the run's config."""
    return setting_label(swept_values(row))


def encoded(settings: dict[str, Any]) -> dict[str, str]:
    return {k: encode_value(v) for k, v in settings.items()}


def seeded(config: Experiment, seed: int) -> Experiment:
    """A grid point's resolved config for one of its seeds (the seed is all that differs)."""
    return dataclasses.replace(config, sweep=dataclasses.replace(config.sweep, seeds=[seed]))


def runs_dir(experiment_dir: Path) -> Path:
    return experiment_dir / "runs"


def run_dir(experiment_dir: Path, run_id: str) -> Path:
    return runs_dir(experiment_dir) / run_id



def run_values(experiment_dir: Path, run_id: str, seed: int) -> dict[str, str]:
    """What `{run_dir}`, `{checkpoint_dir}`, `{seed}`, `{run_id}` and `{experiment_dir}` stand for in one run."""
    root = experiment_dir.resolve()
    rd = run_dir(root, run_id)
    return {"run_dir": str(rd), "checkpoint_dir": str(rd / rundir.CHECKPOINTS), "seed": str(seed), "run_id": run_id, "experiment_dir": str(root)}


def git_commit(path: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def merge_runs(experiment_dir: Path, runs: list[Run]) -> list[Run]:
    """Keep the indices of runs already on disk; new runs get the next free indices."""
    known = {row["run_id"]: int(row["index"]) for row in read_runs_csv(experiment_dir)}
    next_index = max(known.values(), default=-1) + 1
    merged = []
    for run in runs:
        if run.run_id in known:
            index = known[run.run_id]
        else:
            index, next_index = next_index, next_index + 1
        merged.append(dataclasses.replace(run, index=index))
    return sorted(merged, key=lambda r: r.index)


def read_runs_csv(experiment_dir: Path) -> list[dict[str, str]]:
    """Every row of runs.csv (all generations), checked: a damaged file is a ConfigError naming it and
    the line, never a KeyError or ValueError deep inside a task, collect or status."""
    path = experiment_dir / "runs.csv"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the run index: {getattr(exc, 'strerror', None) or exc}") from None
    damaged = f"{path}: damaged run index (each run's runs/<run id>/config.yaml holds its index, id and seed)"
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        missing = [c for c in ("index", "run_id", "seed") if c not in (reader.fieldnames or ())]
        if missing:
            raise ConfigError(f"{damaged}: no {', '.join(missing)} column")
        if not text.endswith("\n"):  # the writer ends every row with one: a torn copy or a full disk
            raise ConfigError(f"{damaged}: the last line is cut off")
        rows, seen = [], set()
        for row in reader:
            match = RUN_ID.fullmatch(row["run_id"] or "")
            if (
                None in row or None in row.values() or not row["index"].isdigit() or match is None
                or match.group(1) != row["seed"] or not row.get(GENERATION, "0").isdigit()
                or row["index"] in seen or row["run_id"] in seen
            ):  # fmt: skip
                raise ConfigError(f"{damaged}: line {reader.line_num}: {','.join(v for v in row.values() if isinstance(v, str))[:80]!r}")
            seen.update((row["index"], row["run_id"]))
            rows.append(row)
    except csv.Error as exc:
        raise ConfigError(f"{damaged}: {exc}") from None
    return rows  # no rows: an Optuna study before its first trial (hpcrl.sweep.study)


def generation(row: dict[str, str]) -> int:
    """The config generation of a runs.csv row; rows written before generations existed are 0."""
    return int(row.get(GENERATION) or 0)


def split_generations(rows: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(rows of the current config, rows of earlier ones). Results pool only the first."""
    latest = max(map(generation, rows), default=0)
    return [r for r in rows if generation(r) == latest], [r for r in rows if generation(r) != latest]


def current_rows(experiment_dir: Path) -> list[dict[str, str]]:
    """The runs.csv rows of the config last swept into the experiment: what collect pools."""
    return split_generations(listed_runs(experiment_dir))[0]


def listed_runs(experiment_dir: Path) -> list[dict[str, str]]:
    """read_runs_csv for those who report on the runs (status, collect): a runs.csv that lists no run while
    runs/ holds runs that began (a marker, a log or a checkpoint) lost its rows, and is a ConfigError naming it
    and the way back, not an experiment of no runs ("0 runs", a collect of nothing that exits 1). A run
    directory that holds nothing more is no sign of damage: an Optuna worker writes its trial's directory
    just before the trial's row, and one killed between the two leaves it so. A sweep reads runs.csv with
    read_runs_csv, and that is the way back: the same config expands to the same run ids, so it lists them
    again, and trains only the runs that are not done."""
    rows = read_runs_csv(experiment_dir)
    if rows:
        return rows
    try:
        with os.scandir(runs_dir(experiment_dir)) as entries:
            dirs = [Path(e.path) for e in entries if RUN_ID.fullmatch(e.name) and e.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        dirs = []
    begun = sorted(d.name for d in dirs if rundir.run_state(d) != State.NEW)
    if begun:
        raise ConfigError(
            f"{experiment_dir / 'runs.csv'}: damaged run index: it lists no run, but runs/ holds {len(begun)} runs that began "
            f"({begun[0]}{', ...' if len(begun) > 1 else ''}); `hpcrl sweep` of the experiment's config, with the same -p values, "
            "lists them again (it trains only the runs not done)"
        )
    return rows


def left_out_note(experiment_dir: Path) -> str | None:
    """One line for collect when runs of earlier configs exist: how many were left out, how to see them."""
    current, earlier = split_generations(read_runs_csv(experiment_dir))
    if not earlier:
        return None
    latest = generation(current[0])
    return (
        f"left out {len(earlier)} runs of earlier configs of this experiment (runs.csv rows with generation < {latest}; "
        "their run directories are kept): sweep an earlier config again to make it current (done runs are not retrained)"
    )


@contextmanager
def index_lock(experiment_dir: Path) -> Iterator[None]:
    """Held while runs.csv is read and rewritten: by a sweep, and by an Optuna worker adding the run
    of its trial while other workers (on other nodes) add theirs. An flock on a file beside it,
    which NFS v3/v4 clients turn into a lock on the server (see hpcrl.store.runlock.run_lock)."""
    experiment_dir.mkdir(parents=True, exist_ok=True)
    with open(experiment_dir / INDEX_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def add_run(experiment_dir: Path, run: Run, gen: int) -> Run:
    """Add a run of the config of generation `gen` (an Optuna study's trial, added by its worker)
    under the next free index; a run already listed keeps its row. Returns the run with its index."""
    with index_lock(experiment_dir):
        old = read_runs_csv(experiment_dir)
        for row in old:
            if row["run_id"] == run.run_id:
                return dataclasses.replace(run, index=int(row["index"]))
        run = dataclasses.replace(run, index=max((int(row["index"]) for row in old), default=-1) + 1)
        _write_run_configs(experiment_dir, [run])  # before its row: a listed run always has its config
        _write_index(experiment_dir, {row["run_id"]: row for row in old} | {run.run_id: _row(run, gen)})
        return run


def _row(run: Run, gen: int) -> dict[str, Any]:
    return {"index": run.index, "run_id": run.run_id, "seed": run.seed, GENERATION: gen, **encoded(run.settings)}


def _write_index(root: Path, rows: dict[str, dict[str, Any]]) -> None:
    keys = sorted({k for row in rows.values() for k in row} - set(_FIXED_COLUMNS))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[*_FIXED_COLUMNS, *keys], restval="")
    writer.writeheader()
    for row in sorted(rows.values(), key=lambda r: int(r["index"])):
        writer.writerow(row)
    atomic_write_text(root / "runs.csv", buf.getvalue())


def write_experiment(exp: Experiment, runs: list[Run], provenance: dict[str, Any]) -> Path:
    """Write experiment.yaml, runs.csv and each run's config.yaml (atomically; existing runs are kept)."""
    root = exp.dir
    with index_lock(root):
        _write_experiment(exp, runs, provenance)
    return root


def _write_experiment(exp: Experiment, runs: list[Run], provenance: dict[str, Any]) -> None:
    root = exp.dir
    (root / "jobs").mkdir(parents=True, exist_ok=True)
    prov = {
        "hpcrl_version": hpcrl.__version__,
        "git_commit": git_commit(Path(exp.source).resolve().parent if exp.source else Path.cwd()),
        "config_file": str(Path(exp.source).resolve()) if exp.source else None,
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "user": os.environ.get("USER") or os.environ.get("LOGNAME"),
        **provenance,
    }
    # Rows for runs that were in an earlier version of the config stay listed, under their own
    # generation: their results are still there, but are never pooled with the current config's.
    old = read_runs_csv(root)
    current, _ = split_generations(old)
    latest = max(map(generation, old), default=0)
    gen = latest if not old or {r["run_id"] for r in current} == {r.run_id for r in runs} else latest + 1
    prov[GENERATION] = gen  # for runs added later by the config's own jobs (an Optuna study's trials)
    atomic_write_text(root / "experiment.yaml", yaml.dump({"config": exp.to_dict(), "provenance": prov}, Dumper=_DUMPER, sort_keys=False))
    rows = {row["run_id"]: {**row, GENERATION: generation(row)} for row in old}
    for run in runs:
        rows[run.run_id] = _row(run, gen)
    _write_index(root, rows)
    _write_run_configs(root, runs)


def _write_run_configs(root: Path, runs: list[Run]) -> None:
    # The runs of one grid point share their config but for the seed, which the header carries:
    # the config is serialised once per grid point (YAML's representer is the slow part of a sweep).
    config_text: dict[str, str] = {}
    settings_text: dict[str, str | None] = {}
    runs_dir(root).mkdir(parents=True, exist_ok=True)
    existing = {e.name for e in os.scandir(runs_dir(root))}
    for run in runs:
        setting_hash = run.run_id.rpartition("-s")[0]
        if setting_hash not in config_text:
            data = run.config.to_dict()
            del data["sweep"]
            config_text[setting_hash] = yaml.dump({"config": data}, Dumper=_DUMPER, sort_keys=False)
            settings_text[setting_hash] = _settings_block(run)
        header = _run_header(run, settings_text[setting_hash])
        d = run_dir(root, run.run_id)
        if run.run_id not in existing:
            d.mkdir(exist_ok=True)
        # Remade from experiment.yaml by every `hpcrl sweep`: atomic, but not worth an fsync each.
        atomic_write_text(d / "config.yaml", header + config_text[setting_hash], durable=False)


def _run_dump(run: Run) -> str:
    return yaml.dump({"run": {"index": run.index, "run_id": run.run_id, "seed": run.seed, "settings": run.settings}}, Dumper=_DUMPER, sort_keys=False)


def _run_header(run: Run, settings: str | None) -> str:
    """The `run:` header of a run's config.yaml, as `_run_dump` writes it. The lines for index, run
    id and seed are written directly before the setting's `settings:` block (YAML's representer
    took a second of a 10,000-run sweep); `settings` None: dumped whole."""
    if settings is None:
        return _run_dump(run)
    return f"run:\n  index: {run.index}\n  run_id: {run.run_id}\n  seed: {run.seed}\n{settings}"


def _settings_block(run: Run) -> str | None:
    """The `settings:` lines of the header of `run`'s setting, when the direct header is the dump
    byte for byte (checked on this run); else None, and every header of the setting is dumped."""
    dumped = _run_dump(run)
    block = dumped[dumped.find("\n  settings:") + 1 :]
    return block if _run_header(run, block) == dumped else None


def read_run(experiment_dir: Path, run_id: str, parsed: dict[str, Experiment]) -> Run:
    """A run from its config.yaml, as write_experiment lays it out: the `run` header, then the
    resolved config of its grid point. A missing or damaged file is a ConfigError naming it.

    `parsed` caches configs by their text across the runs of one grid point: status and collect
    read every run, and parsing and validating the same config a thousand times takes seconds.
    """
    path = run_dir(experiment_dir, run_id) / "config.yaml"
    try:
        head, _, body = path.read_text().partition("\nconfig:")
        info = yaml.load(head, Loader=_LOADER)["run"]
        if body not in parsed:
            with stored_configs():  # written by a sweep: a rule added since must not lock it out
                parsed[body] = experiment_from_dict(yaml.load("config:" + body, Loader=_LOADER)["config"])
        seed = int(info["seed"])
        return Run(int(info["index"]), info["run_id"], seed, info["settings"], seeded(parsed[body], seed))
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing run config (`hpcrl sweep` with the experiment's config writes it again)") from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{path}: damaged run config ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "`hpcrl sweep` with the experiment's config writes it again"
        ) from None


def load_runs(experiment_dir: Path) -> list[Run]:
    """The runs of an experiment on disk (every generation), from runs.csv and each run's config.yaml."""
    parsed: dict[str, Experiment] = {}
    return [read_run(experiment_dir, row["run_id"], parsed) for row in read_runs_csv(experiment_dir)]


def load_run(experiment_dir: Path, index: int) -> Run:
    """One run by index, reading only its own config (array tasks must not parse the whole sweep)."""
    require_experiment(experiment_dir)  # else 'runs.csv: no run with index N' of a file that is not there
    for row in read_runs_csv(experiment_dir):
        if int(row["index"]) == index:
            return read_run(experiment_dir, row["run_id"], {})
    raise ConfigError(f"{experiment_dir / 'runs.csv'}: no run with index {index}")


def is_experiment(path: Path) -> bool:
    """Whether `path` is an experiment directory: a sweep wrote its runs.csv."""
    return (path / "runs.csv").exists()


def require_experiment(path: Path) -> Path:
    """`path`, an experiment directory; else the one line every command that takes one says."""
    if not is_experiment(path):
        raise ConfigError(f"{path}: not an experiment directory (no runs.csv); give logs/<experiment>")
    return path


def find_experiments(where: Path | None = None) -> list[Path]:
    """The experiment directories a command given none may mean, newest sweep first: those under
    `<where>/logs` (a sweep writes `<output>/<name>` and `output` is `logs` unless a config says
    otherwise) and those directly in `where` (a user inside the output directory), `where`
    defaulting to the working directory. Relative to `where`, as a user would type them."""
    base = where or Path(".")
    found: set[Path] = set()
    for root in (Path(Experiment.output), Path(".")):
        try:
            found.update(path.parent.relative_to(base) for path in (base / root).glob("*/runs.csv"))
        except OSError:
            continue
    return sorted(found, key=lambda d: (-(base / d / "runs.csv").stat().st_mtime, str(d)))


def load_experiment_config(experiment_dir: Path) -> tuple[Experiment, int]:
    """The experiment as its last sweep wrote it (experiment.yaml), validated again, and the
    generation of that config (the runs.csv rows its trials get)."""
    path = experiment_dir / "experiment.yaml"
    try:
        meta = yaml.safe_load(path.read_text())
        with stored_configs():
            return experiment_from_dict(meta["config"]), int(meta["provenance"].get(GENERATION, 0))
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the experiment ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def read_meta(experiment_dir: Path) -> dict:
    try:
        meta = yaml.safe_load((experiment_dir / "experiment.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        meta = {}
    return meta if isinstance(meta, dict) else {}


# jobs/: what was submitted (jobs.json), where each task's output went (logs/) and what `hpcrl cancel` cancelled.


@dataclass
class Dependency:
    job_id: str
    kind: Literal["each", "all"]
    """`each`: task i waits for task i (aftercorr / -hold_jid_ad); `all`: waits for the whole job, any outcome."""


@dataclass
class Job:
    """One submitted array job (or single job), as recorded in jobs/jobs.json."""

    stage: str
    job_id: str
    scheduler: str
    script: str
    size: int
    """Number of array tasks; 0 for a plain (non-array) job."""
    manifest: str | None = None
    """File whose line i (1-based) is the run index of array task i."""
    after: list[Dependency] = field(default_factory=list)
    attempt: int = 0
    resources: dict[str, Any] = field(default_factory=dict)
    """The stage's resources as planned (jobplan.StageResources); the local executor sizes tasks by them."""


def jobs_path(experiment_dir: Path) -> Path:
    return experiment_dir / "jobs" / "jobs.json"


def read_jobs(experiment_dir: Path) -> list[Job]:
    """The jobs submitted so far; a damaged file is a one-line ConfigError naming it, never a traceback."""
    path = jobs_path(experiment_dir)
    if not path.exists():
        return []
    try:
        jobs = []
        for item in json.loads(path.read_text()):
            item["after"] = [Dependency(**d) for d in item.get("after", [])]
            jobs.append(Job(**item))
        return jobs
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"{path}: damaged ({type(exc).__name__}: {str(exc)[:80]}); restore it, or move it away to forget the jobs it lists") from None


def write_jobs(experiment_dir: Path, jobs: list[Job]) -> None:
    atomic_write_text(jobs_path(experiment_dir), json.dumps([dataclasses.asdict(j) for j in jobs], indent=1))


def job_log(experiment_dir: Path, job: Job, task: int) -> Path | None:
    """Where the output of `task` of `job` goes (task 0: a job that is not an array), as the bundled job templates
    name it (`#SBATCH --output`, `#$ -o` in job_templates/slurm.sh.j2 and sge.sh.j2, under the log_dir that
    hpcrl.submit.jobplan gives them) and the local runner opens it (hpcrl.schedulers.local); None for a
    backend whose tasks have no log of their own (debug runs them in the calling process). A job template of
    the user's own may name it otherwise: the caller checks that the file is there."""
    logs = experiment_dir / "jobs" / "logs"
    if job.scheduler == "local":
        return local_job_log(experiment_dir, job.job_id, task, bool(job.size))
    names = {
        "slurm": (f"{job.stage}-{job.job_id}_{task}.out", f"{job.stage}-{job.job_id}.out"),
        "sge": (f"{job.stage}-{job.job_id}.{task}.out", f"{job.stage}-{job.job_id}.out"),
    }.get(job.scheduler)
    if names is None:
        return None
    return logs / (names[0] if job.size else names[1])


def local_job_log(experiment_dir: Path, job_id: str, task: int, array: bool) -> Path:
    """The log the local runner writes a task's output to (and `job_log` reads it from): one owner of the name."""
    return experiment_dir / "jobs" / "logs" / (f"{job_id}.{task}.out" if array else f"{job_id}.out")


LOG_TAIL_BYTES = 4096
"""How much of a job log's end `last_log_line` reads: logs of long runs grow to megabytes."""


def last_log_line(path: Path) -> str:
    """The last line of a job log that is not blank, printable (rundir.printable), from its last
    LOG_TAIL_BYTES; "" where the log is missing, unreadable or blank. For a task that failed before
    hpcrl could record why (an interpreter or module that is not there, a container that did not
    start), it is the shell's or the scheduler's own word on it."""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            tail = f.read()
    except OSError:
        return ""
    lines = [line.strip() for line in tail.decode(errors="replace").splitlines()]
    return rundir.printable(next((line for line in reversed(lines) if line), ""))


def cancelled_path(experiment_dir: Path) -> Path:
    """What `hpcrl cancel` cancelled, one a line: a job id (the whole job) or `JOB_ID TASK` (one array
    task). Grid Engine forgets them at once and Slurm drops cancelled pending tasks; this file does not."""
    return experiment_dir / "jobs" / "cancelled"


def read_cancelled(experiment_dir: Path) -> tuple[set[str], set[tuple[str, int]]]:
    path = cancelled_path(experiment_dir)
    jobs: set[str] = set()
    tasks: set[tuple[str, int]] = set()
    for line in path.read_text().splitlines() if path.exists() else []:
        job, _, task = line.strip().partition(" ")
        if job and task.isdigit():
            tasks.add((job, int(task)))
        elif job:
            jobs.add(job)
    return jobs, tasks


def record_cancelled(experiment_dir: Path, lines: Iterable[str]) -> None:
    path = cancelled_path(experiment_dir)
    old = path.read_text().splitlines() if path.exists() else []
    atomic_write_text(path, "".join(f"{line}\n" for line in dict.fromkeys([*old, *lines])))


class Rollback:
    """What a sweep writes into the experiment directory before its first job is accepted, and how to
    take it back (`written`: the caller's own files, the job scripts, removed too)."""

    FILES = ("experiment.yaml", "runs.csv")

    def __init__(self, root: Path) -> None:
        self.root = root
        self.created = not root.exists()
        self.files = {name: (root / name).read_bytes() if (root / name).exists() else None for name in self.FILES}
        runs = runs_dir(root)
        self.run_dirs = {p.name for p in runs.iterdir()} if runs.is_dir() else set()
        self.written: list[Path] = []

    def undo(self) -> None:
        if self.created:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        for name, data in self.files.items():
            if data is None:
                (self.root / name).unlink(missing_ok=True)
            else:
                atomic_write_text(self.root / name, data.decode())
        runs = runs_dir(self.root)
        for path in runs.iterdir() if runs.is_dir() else []:
            if path.name not in self.run_dirs:
                shutil.rmtree(path, ignore_errors=True)
        for path in self.written:
            path.unlink(missing_ok=True)
