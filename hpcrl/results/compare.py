"""`hpcrl compare EXP_DIR...`: several experiments in one set of tables, plots and one report.

A paper's comparison is usually several experiments: hpcrl's PPO beside an RL Zoo program run,
an old sweep beside a new one. Each experiment's settings keep their own labels, prefixed with the
experiment's name, and experiments are joined on their tasks (env ids): only tasks every experiment
has are compared, and runs on the others are named as left out. What makes the join unequal is
said in one line each (in the terminal's notes and the report's): experiments trained for different
budgets, or with different numbers of seeds. Nothing in the experiments is written; everything goes
to the output directory.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from hpcrl.config import tasks
from hpcrl.config.schema import ConfigError
from hpcrl.results.collect import facts_of, gather, score_name
from hpcrl.results.tables import RunResult, Scoring, stale_removed, write_results
from hpcrl.store import expdir
from hpcrl.store.expdir import read_meta


def _label(name: str, setting: str, single: bool) -> str:
    return name if single else f"{name}: {setting}"


def _names(dirs: list[Path]) -> list[str]:
    """Each experiment's name in tables: its directory name, or its path where two names clash."""
    names = [d.resolve().name for d in dirs]
    return [str(d) if names.count(n) > 1 else n for d, n in zip(dirs, names)]


def compare(experiment_dirs: list[Path], output: Path | None = None, agg: str = "iqm", normalize: bool | None = None, out: TextIO | None = None) -> int:
    """Join experiments on their common tasks and write results to `output`. Exit code as collect's."""
    dirs = [Path(d) for d in experiment_dirs]
    if len(dirs) < 2:
        raise ConfigError("compare: give at least two experiment directories (`hpcrl collect` reports one)")
    for d in dirs:
        if not expdir.is_experiment(d):
            raise ConfigError(f"{d}: not an experiment directory (no runs.csv)")
    if len({d.resolve() for d in dirs}) < len(dirs):
        raise ConfigError("compare: an experiment directory is given twice")
    for d in dirs if output is not None else []:  # `-o A/results` would overwrite A's own results
        if Path(output).resolve().is_relative_to(d.resolve()):
            raise ConfigError(f"compare: -o {output}: inside the compared experiment {d}, whose files compare never writes; choose a directory outside it")
    names = _names(dirs)
    metas = [read_meta(d) for d in dirs]
    configs = [m.get("config") or {} for m in metas]
    gathered: list[list[RunResult]] = []
    for d, config in zip(dirs, configs):
        results = gather(d, tasks.experiment_task(config))
        if any(r.task == "?" for r in results):
            raise ConfigError(f"{d}: the runs' task (env id) is unknown (algo: program): set results.task in its config to the env id it trains on")
        gathered.append(results)
    per_exp = [list(dict.fromkeys(r.task for r in rs)) for rs in gathered]
    common = [t for t in per_exp[0] if all(t in ts for ts in per_exp[1:])]
    if not common:
        listing = "; ".join(f"{n}: {', '.join(ts) or 'no runs'}" for n, ts in zip(names, per_exp))
        raise ConfigError(f"compare: the experiments have no environment in common ({listing})")
    refs: dict[str, tuple[float, float]] = {}
    for name, config in zip(names, configs):
        for task, ref in tasks.references(config).items():
            if task in refs and refs[task] != ref and task in common:
                raise ConfigError(f"compare: {name} declares other reference scores for {task} ({ref}) than an earlier experiment ({refs[task]})")
            refs.setdefault(task, ref)
    if normalize is None:
        normalize = all(bool((c.get("results") or {}).get("normalize")) for c in configs)
    score_names = {score_name(c) for c in configs}
    scoring = Scoring(score_names.pop() if len(score_names) == 1 else "Final score", tasks.normalizer(common, refs) if normalize else None, agg)

    joined: list[RunResult] = []
    notes = []
    for name, results in zip(names, gathered):
        single = len({r.setting for r in results}) == 1
        dropped = [r for r in results if r.task not in common]
        if dropped:
            notes.append(f"{name}: {len(dropped)} runs left out, on tasks the other experiments do not have ({', '.join(sorted({r.task for r in dropped}))})")
        for r in results:
            if r.task in common:
                r.setting = _label(name, r.setting, single)
                joined.append(r)
    if len(score_names) > 1:
        notes.append("the experiments score runs differently (an evaluation, or a program's last training episodes): " + "; ".join(f"{n}: {score_name(c)}" for n, c in zip(names, configs)))
    notes += unequal_notes(names, configs, [[r for r in rs if r.task in common] for rs in gathered])
    output = Path(output) if output is not None else dirs[0].parent / ("compare-" + "-vs-".join(n.replace("/", "_") for n in names))[:200]
    facts = [("compared", ", ".join(names)), ("tasks", ", ".join(common))]
    for name, d, meta in zip(names, dirs, metas):
        facts += [(f"{name}: {key}", value) for key, value in facts_of(d, meta) if key in ("algorithm", "program", "env", "steps per run", "git commit", "config file")]
        facts.append((f"{name}: directory", str(d.resolve())))
    print(f"comparing {', '.join(names)} on {', '.join(common)}", file=out)
    with stale_removed(output, out):  # an earlier comparison's into the same directory
        return write_results(output, "Comparison: " + " vs ".join(names), facts, joined, scoring, notes, out)


def unequal_notes(names: list[str], configs: list[dict], joined: list[list[RunResult]]) -> list[str]:
    """One line each where the compared experiments differ in what makes their scores comparable:
    the training budget (a score after 20,000 steps beside one after 100,000), and the seeds each
    setting has (an interval, and P(X > Y), rest on the fewer)."""
    notes = []
    budgets = [_budgets(config, results) for config, results in zip(configs, joined)]
    if len({tuple(b) for b in budgets}) > 1:
        shown = "; ".join(f"{n}: {' and '.join(f'{b:,}' for b in bs) or '?'} steps" for n, bs in zip(names, budgets))
        notes.append(f"different training budgets ({shown}): each score is taken at the end of its own budget")
    seeds = [len({r.seed for r in results}) for results in joined]
    if len(set(seeds)) > 1:
        shown = "; ".join(f"{n}: {k}" for n, k in zip(names, seeds))
        notes.append(f"different numbers of seeds ({shown}): intervals and P(X > Y) rest on {min(seeds)} seed{'s' if min(seeds) != 1 else ''} where one has fewer")
    return notes


def _budgets(config: dict, results: list[RunResult]) -> list[int]:
    """The training budgets (train.total_steps) an experiment's config gives its runs: the value, the
    grid's values and the `sweep.when` rules' values; for a program, whose budget hpcrl does not set,
    the last step its runs logged."""
    if config.get("algo") == "program":
        return sorted({int(r.steps[-1]) for r in results if r.steps.size})
    sweep_ = config.get("sweep") or {}
    grid = sweep_.get("grid") or {}
    found = set(grid["train.total_steps"]) if "train.total_steps" in grid else {(config.get("train") or {}).get("total_steps")}
    for rule in sweep_.get("when") or []:
        values = rule.get("set") or {}
        found |= {values.get("train.total_steps"), (values.get("train") or {}).get("total_steps")}
    return sorted(int(b) for b in found if isinstance(b, (int, float)))


def compare_command(experiment_dirs: list[str], output: str | None, agg: str, normalize: bool | None) -> int:
    """The CLI's entry: ConfigError is one line and exit 2 (cli.main prints it)."""
    return compare([Path(d) for d in experiment_dirs], Path(output) if output else None, agg, normalize, sys.stdout)
