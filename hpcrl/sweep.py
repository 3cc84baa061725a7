"""Experiment -> runs (grid × seeds) with stable ids, and the experiment directory they live in.

A run id is a hash of the settings that change what is learned, so re-running `hpcrl sweep` on the
same config finds the same runs on disk and only submits what is missing or failed.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import itertools
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import hpcrl
from hpcrl.config import Experiment, apply_settings
from hpcrl.io import atomic_write_text

# libyaml when PyYAML was built with it (the wheels are): a 1000-run sweep writes and status reads
# 1000 run configs, which the pure-Python emitter and parser take ~10 s each for.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# Sections that change where and how a run executes, not what it learns: they stay out of the run id.
_NOT_HASHED = ("name", "output", "python", "resources", "container", "cuda", "eval", "image", "sweep")


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
        return setting_label({k: encode_value(v) for k, v in self.settings.items()})


def encode_value(value: Any) -> str:
    """How a swept value is written in runs.csv (and so in labels): strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def setting_label(encoded: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(encoded.items())) or "default"


def row_label(row: dict[str, str]) -> str:
    """The setting label of a runs.csv row, without reading the run's config."""
    return setting_label({k: v for k, v in row.items() if k not in ("index", "run_id", "seed") and v != ""})


def run_hash(config: Experiment, settings: dict[str, Any]) -> str:
    """Hash of what is learned, plus the swept values themselves (a grid over eval.* still makes distinct runs)."""
    data = {k: v for k, v in config.to_dict().items() if k not in _NOT_HASHED}
    blob = json.dumps([data, settings], sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:10]


def expand(exp: Experiment) -> list[Run]:
    """The runs of an experiment, in a stable order: grid points in config order, then seeds."""
    keys = list(exp.sweep.grid)
    runs = []
    for values in itertools.product(*(exp.sweep.grid[k] for k in keys)):
        settings = dict(zip(keys, values))
        # Validated once per grid point: the seeds of a grid point differ in sweep.seeds only.
        config = apply_settings(exp, settings, exp.sweep.seeds[0])
        setting_hash = run_hash(config, settings)
        for seed in exp.sweep.seeds:
            runs.append(Run(len(runs), f"{setting_hash}-s{seed}", seed, settings, _seeded(config, seed)))
    return runs


def _seeded(config: Experiment, seed: int) -> Experiment:
    """A grid point's resolved config for one of its seeds (the seed is all that differs)."""
    return dataclasses.replace(config, sweep=dataclasses.replace(config.sweep, seeds=[seed]))


def seed_of(config: Experiment) -> int:
    return config.sweep.seeds[0]


# --------------------------------------------------------------------------------------------
# The experiment directory.


def run_dir(experiment_dir: Path, run_id: str) -> Path:
    return experiment_dir / "runs" / run_id


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
    path = experiment_dir / "runs.csv"
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write_experiment(exp: Experiment, runs: list[Run], provenance: dict[str, Any]) -> Path:
    """Write experiment.yaml, runs.csv and each run's config.yaml (atomically; existing runs are kept)."""
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
    atomic_write_text(root / "experiment.yaml", yaml.dump({"config": exp.to_dict(), "provenance": prov}, Dumper=_DUMPER, sort_keys=False))
    # Rows for runs that were in an earlier version of the config stay listed: their results are still there.
    rows = {row["run_id"]: row for row in read_runs_csv(root)}
    keys = sorted({k for run in runs for k in run.settings} | {k for row in rows.values() for k in row} - {"index", "run_id", "seed"})
    for run in runs:
        rows[run.run_id] = {"index": run.index, "run_id": run.run_id, "seed": run.seed, **{k: encode_value(v) for k, v in run.settings.items()}}
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=["index", "run_id", "seed", *keys], restval="")
    writer.writeheader()
    for row in sorted(rows.values(), key=lambda r: int(r["index"])):
        writer.writerow(row)
    atomic_write_text(root / "runs.csv", buf.getvalue())
    # The runs of one grid point share their config but for the seed, which the header carries:
    # the config is serialised once per grid point (YAML's representer is the slow part of a sweep).
    config_text: dict[str, str] = {}
    for run in runs:
        setting_hash = run.run_id.rpartition("-s")[0]
        if setting_hash not in config_text:
            data = run.config.to_dict()
            del data["sweep"]
            config_text[setting_hash] = yaml.dump({"config": data}, Dumper=_DUMPER, sort_keys=False)
        header = yaml.dump({"run": {"index": run.index, "run_id": run.run_id, "seed": run.seed, "settings": run.settings}}, Dumper=_DUMPER, sort_keys=False)
        d = run_dir(root, run.run_id)
        d.mkdir(parents=True, exist_ok=True)
        # Remade from experiment.yaml by every `hpcrl sweep`: atomic, but not worth an fsync each.
        atomic_write_text(d / "config.yaml", header + config_text[setting_hash], durable=False)
    return root


def _read_run(experiment_dir: Path, run_id: str, parsed: dict[str, Experiment]) -> Run:
    """A run from its config.yaml, as write_experiment lays it out: the `run` header, then the
    resolved config of its grid point.

    `parsed` caches configs by their text across the runs of one grid point: status and collect
    read every run, and parsing and validating the same config a thousand times takes seconds.
    """
    from hpcrl.config import experiment_from_dict

    head, _, body = (run_dir(experiment_dir, run_id) / "config.yaml").read_text().partition("\nconfig:")
    info = yaml.load(head, Loader=_LOADER)["run"]
    if body not in parsed:
        parsed[body] = experiment_from_dict(yaml.load("config:" + body, Loader=_LOADER)["config"])
    seed = int(info["seed"])
    return Run(int(info["index"]), info["run_id"], seed, info["settings"], _seeded(parsed[body], seed))


def load_runs(experiment_dir: Path) -> list[Run]:
    """The runs of an experiment on disk, from runs.csv and each run's config.yaml."""
    parsed: dict[str, Experiment] = {}
    return [_read_run(experiment_dir, row["run_id"], parsed) for row in read_runs_csv(experiment_dir)]


def load_run(experiment_dir: Path, index: int) -> Run:
    """One run by index, reading only its own config (array tasks must not parse the whole sweep)."""
    for row in read_runs_csv(experiment_dir):
        if int(row["index"]) == index:
            return _read_run(experiment_dir, row["run_id"], {})
    raise KeyError(f"{experiment_dir}: no run with index {index} in runs.csv")
