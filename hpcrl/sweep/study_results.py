"""What `collect` adds for an Optuna study: the trials table, the best trial, parameter importances
and the optimisation history, drawn with Optuna's own matplotlib visualisation.

Every trial is also a run, so the tables, curves and report of `collect` already hold them; this
adds what only the study knows (states, values as the study judged them, pruning, importances).
"""

from __future__ import annotations

import csv
import math
import warnings
from pathlib import Path
from typing import Any

from hpcrl.config.schema import ConfigError
from hpcrl.io import atomic_open
from hpcrl.store import expdir, rundir
from hpcrl.sweep import study


def _save(ax: Any, path: Path, xlabel: str | None = None, ylabel: str | None = None) -> Path:
    """Optuna's axes with hpcrl's axis names (its defaults say "Step" and "Objective Value")."""
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    fig = ax.figure
    fig.set_size_inches(8, 4.5)
    fig.tight_layout()
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def write_study_results(experiment_dir: Path, results_dir: Path) -> tuple[list[str], dict[str, Path]]:
    """(lines for the terminal and the report, plots by title). Writes results/trials.csv."""
    from hpcrl.sweep.study import metric_key

    try:
        exp, _ = expdir.load_experiment_config(experiment_dir)
        optuna = study.require_optuna()
        the_study = study.open_study(exp, experiment_dir)
    except ConfigError as exc:
        return [f"optuna study: not read ({exc})"], {}
    trials = sorted(the_study.get_trials(deepcopy=False), key=lambda t: t.number)
    state = optuna.trial.TrialState
    counts = {s.name.lower(): sum(t.state == s for t in trials) for s in (state.COMPLETE, state.PRUNED, state.FAIL, state.RUNNING)}
    search = exp.sweep.search
    assert search is not None
    lines = [
        f"Optuna study {the_study.study_name}: {len(trials)} of {search.n_trials} trials ("
        + ", ".join(f"{n} {name}" for name, n in counts.items() if n) + f"); {search.sampler} sampler, {search.pruner} pruner, "
        f"{search.direction} {metric_key(exp)}"
    ]
    with atomic_open(results_dir / "trials.csv", "w") as f:
        writer = csv.writer(f)
        keys = sorted(search.space)
        writer.writerow(["trial", "state", "value", "run_id", "final_eval", *keys, "pruned"])
        for t in trials:
            run_id = t.user_attrs.get("run_id", "")
            rd = expdir.run_dir(experiment_dir, run_id) if run_id else None
            writer.writerow([
                t.number, t.state.name.lower(), "" if t.value is None else f"{t.value:.6g}", run_id, _final_eval(rd),
                *[t.params.get(k, "") for k in keys], rundir.first_line(rd, rundir.PRUNED) if rd else "",
            ])  # fmt: skip
    complete = [t for t in trials if t.state == state.COMPLETE]
    plots: dict[str, Path] = {}
    if complete:
        best = the_study.best_trial
        rd = expdir.run_dir(experiment_dir, best.user_attrs.get("run_id", "-"))
        lines.append(
            f"best trial {best.number}: {metric_key(exp)} {best.value:.4g}, final eval {_final_eval(rd) or '-'}, run {best.user_attrs.get('run_id', '?')}: "
            + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(best.params.items()))
        )
    plots_dir = results_dir / "plots"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental, every call
        from optuna.visualization import matplotlib as vis

        if complete:
            plots["Optuna: optimisation history"] = _save(vis.plot_optimization_history(the_study), plots_dir / "optuna_history.png", ylabel=metric_key(exp))
        if any(t.intermediate_values for t in trials):
            plots["Optuna: intermediate values (what the pruner judged)"] = _save(
                vis.plot_intermediate_values(the_study), plots_dir / "optuna_intermediate.png", "percent of the trial's training budget", metric_key(exp)
            )
        if len(complete) >= 2 and len(search.space) >= 1:
            try:
                importances = optuna.importance.get_param_importances(the_study)
            except (RuntimeError, ValueError) as exc:
                lines.append(f"parameter importances: not computed ({exc})")
            else:
                lines.append("parameter importances (fANOVA): " + ", ".join(f"{k} {v:.2f}" for k, v in importances.items()))
                plots["Optuna: parameter importances"] = _save(vis.plot_param_importances(the_study), plots_dir / "optuna_importances.png")
    return lines, plots


def _final_eval(rd: Path | None) -> str:
    if rd is None or not rundir.has_eval(rd):
        return ""
    try:
        value = rundir.read_eval(rd)
    except (ValueError, KeyError, TypeError, csv.Error):
        return ""
    return f"{value:.6g}" if math.isfinite(value) else ""
