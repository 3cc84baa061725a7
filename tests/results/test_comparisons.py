"""Comparisons across algorithms and environments: `algo` and `env.id` in the grid with `sweep.when`
rules, environments as tasks in `collect` (normalised scores, aggregate across tasks, P(X > Y)),
`hpcrl compare`, and the aggregate numbers against rliable's own on the same score matrix."""

from __future__ import annotations

import csv
import io
import math
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest
import yaml
from factories import TINY, deep_update

from hpcrl.cli import main
from hpcrl.config import tasks
from hpcrl.config.load import load_experiment
from hpcrl.results import stats
from hpcrl.results.collect import collect
from hpcrl.store.expdir import run_dir, write_experiment
from hpcrl.sweep.runs import expand

A2C_TRAIN = {"total_steps": 1024, "hidden_sizes": [16], "checkpoint_every": 2}
"""A train section every algorithm accepts (PPO's minibatch keys go in sweep.when)."""


def grid_config(tmp_path: Path, changes: dict | None = None, name: str = "config.yaml") -> Path:
    data = deep_update(TINY, {"output": str(tmp_path / "logs"), **(changes or {})})
    data["train"] = dict(A2C_TRAIN)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


ALGOS_ENVS = {
    "sweep": {
        "seeds": [0, 1, 2],
        "grid": {"algo": ["ppo", "a2c"], "env.id": ["CartPole-v1", "Acrobot-v1"]},
        "when": [
            {"match": {"algo": "ppo"}, "set": {"train": {"num_steps": 32, "num_minibatches": 2, "lr": 1.0e-3}}},
            {"match": {"algo": "ppo", "env.id": "Acrobot-v1"}, "set": {"train": {"gamma": 0.95}}},
            {"match": {"algo": "a2c", "env.id": "Acrobot-v1"}, "set": {"train.total_steps": 2048}},
        ],
    }
}


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------------------- the grid


def test_each_algorithm_takes_its_own_defaults_and_the_rules_it_matches(tmp_path: Path) -> None:
    runs = expand(load_experiment(grid_config(tmp_path, ALGOS_ENVS)))
    by = {(r.settings["algo"], r.settings["env.id"]): r.config for r in runs if r.seed == 0}
    assert len(runs) == 12 and len(by) == 4
    ppo_cart, ppo_acro, a2c_cart, a2c_acro = by["ppo", "CartPole-v1"], by["ppo", "Acrobot-v1"], by["a2c", "CartPole-v1"], by["a2c", "Acrobot-v1"]
    assert type(ppo_cart.train).__name__ == "PPOConfig" and type(a2c_cart.train).__name__ == "A2CConfig"
    # A later rule's mapping merges key by key with an earlier one's: Acrobot PPO keeps lr and num_steps.
    assert (ppo_acro.train.num_steps, ppo_acro.train.lr, ppo_acro.train.gamma) == (32, 1.0e-3, 0.95)
    assert (ppo_cart.train.num_steps, ppo_cart.train.gamma) == (32, 0.99)
    # A2C never sees PPO's values: its own defaults (SB3's), and its own rule.
    assert (a2c_cart.train.lr, a2c_cart.train.num_steps, a2c_cart.train.total_steps) == (7e-4, 5, 1024)
    assert a2c_acro.train.total_steps == 2048 and a2c_acro.env.id == "Acrobot-v1"
    assert {r.setting_label for r in runs} == {f"algo={a},env.id={e}" for a in ("ppo", "a2c") for e in ("CartPole-v1", "Acrobot-v1")}
    assert len({r.run_id for r in runs}) == 12


def test_a_rule_changes_the_run_id_of_the_points_it_matches_only(tmp_path: Path) -> None:
    plain = {r.run_id for r in expand(load_experiment(grid_config(tmp_path, {"sweep": {**ALGOS_ENVS["sweep"], "when": ALGOS_ENVS["sweep"]["when"][:2]}})))}
    ruled = {r.run_id for r in expand(load_experiment(grid_config(tmp_path, ALGOS_ENVS)))}
    assert len(plain - ruled) == 3 and len(ruled - plain) == 3  # only a2c on Acrobot (3 seeds) trains differently


BAD_RULES = [
    ({"match": {"train.lr": 0.1}, "set": {"train.gamma": 0.9}}, "sweep.when[0].match.train.lr", "not swept"),
    ({"match": {"algo": "dqn"}, "set": {"train.gamma": 0.9}}, "sweep.when[0].match.algo", "not one of the grid's values"),
    ({"match": {"algo": "ppo"}, "set": {"env.id": "Acrobot-v1"}}, "sweep.when[0].set.env.id", "swept in sweep.grid"),
    ({"match": {"algo": "ppo"}, "set": {"train.lrr": 0.1}}, "sweep.when[0].set.train.lrr", "unknown key"),
    ({"match": {"algo": "ppo"}, "set": {"resources.time": "02:00:00"}}, "sweep.when[0].set.resources.time", "cannot vary"),
    ({"match": {"algo": "ppo"}, "set": {"algo": "a2c"}}, "sweep.when[0].set.algo", "sweep algo"),
    ({"set": {"train.num_minibatches": 2}}, "sweep: the grid point algo='a2c'", "train.num_minibatches: unknown key"),
    ({"match": {"algo": "ppo"}, "set": {"train.gamma": "1\nrm -rf /"}}, "sweep.when[0].set.train.gamma", "expected a single line"),
    ({"match": {"algo": "ppo"}, "set": {"train.gamma": "fast"}}, "sweep: the grid point algo='ppo'", "train.gamma: expected a number"),
    ({"match": {"algo": "ppo"}, "set": {"train.lr": float("nan")}}, "sweep: the grid point algo='ppo'", "expected a finite number"),
    ({"match": {"algo": "ppo"}, "set": {"train.num_steps": -1}}, "sweep: the grid point algo='ppo'", "train.num_steps"),
    ({"match": {"algo": "ppo"}, "bogus": 1}, "sweep.when[0].bogus", "unknown key"),
]


@pytest.mark.parametrize(("rule", "where", "why"), BAD_RULES, ids=[w + ":" + y for _, w, y in BAD_RULES])
def test_bad_rules_are_refused_in_one_line_before_anything_is_written(tmp_path: Path, rule: dict, where: str, why: str) -> None:
    config = grid_config(tmp_path, {"sweep": {"grid": {"algo": ["ppo", "a2c"], "env.id": ["CartPole-v1"]}, "when": [rule]}})
    code, _, err = run_cli("sweep", str(config), "--scheduler", "local", "--dry-run")
    assert code == 2 and err.count("\n") == 1 and err.startswith("hpcrl: error: "), err
    assert where in err and why in err, err
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(("values", "why"), [(["ppo", "program"], "expected values among"), (["ppo", "ppo2"], "'ppo2'"), (["ppo", 3], "3"), ([], "non-empty")])
def test_bad_algorithm_grids_are_refused(tmp_path: Path, values: list, why: str) -> None:
    code, _, err = run_cli("sweep", str(grid_config(tmp_path, {"sweep": {"grid": {"algo": values}}})), "--scheduler", "local")
    assert code == 2 and "sweep.grid.algo" in err and why in err and err.count("\n") == 1, err


def test_dqn_in_the_grid_is_checked_against_every_env(tmp_path: Path) -> None:
    learns = {"match": {"algo": "dqn"}, "set": {"train.learning_starts": 100}}  # of TINY's 1,024 steps
    config = grid_config(tmp_path, {"sweep": {"grid": {"algo": ["ppo", "dqn"], "env.id": ["CartPole-v1", "Pendulum-v1"]}, "when": [learns]}})
    code, _, err = run_cli("sweep", str(config), "--scheduler", "local", "--dry-run")
    assert code == 2 and "Pendulum-v1" in err and "algo='dqn'" in err, err


def test_normalisation_of_an_env_without_references_is_refused_at_sweep_time(tmp_path: Path) -> None:
    config = grid_config(tmp_path, {"env": {"id": "Pendulum-v1", "num_envs": 2}, "results": {"normalize": True}})
    code, _, err = run_cli("sweep", str(config), "--scheduler", "local")
    assert code == 2 and "results.normalize" in err and "'Pendulum-v1'" in err and err.count("\n") == 1, err
    declared = grid_config(tmp_path, {"env": {"id": "Pendulum-v1", "num_envs": 2}, "results": {"normalize": True, "scores": {"Pendulum-v1": {"random": -1200, "reference": -200}}}})
    assert load_experiment(declared).results.scores["Pendulum-v1"].reference == -200
    same = grid_config(tmp_path, {"results": {"scores": {"X-v0": {"random": 1, "reference": 1}}}})
    code, _, err = run_cli("sweep", str(same), "--scheduler", "local")
    assert code == 2 and "results.scores.X-v0.reference: must differ from random" in err, err


# ---------------------------------------------------------------------------- collect with tasks

RANDOM_REF = {"CartPole-v1": (22.42, 475.0), "Acrobot-v1": (-498.07, -100.0)}


def fake_run(rd: Path, final: float, eval_every: bool = True) -> None:
    """What train (with evaluation during training) and eval leave behind, without the training."""
    rows = ["step,iteration,wall_time,sps,episodes,episodic_return,episodic_length"]
    rows += [f"{s * 100},{s},{s},100,1,{final * s / 10:.3f},20" for s in range(1, 11)]
    (rd / "train.csv").write_text("\n".join(rows) + "\n")
    if eval_every:
        (rd / "eval_curve.csv").write_text("step,wall_time,mean_return,std_return,mean_length,episodes\n" + "".join(f"{s * 200},{s},{final * s / 5:.3f},1,20,5\n" for s in range(1, 6)))
    (rd / "DONE").write_text("step 1000\n")
    (rd / "eval.csv").write_text(f"episode,return,length\n0,{final},20\n")
    (rd / "EVAL_DONE").write_text("ok\n")


def scores_of(algo: str, env: str, seed: int) -> float:
    """Distinct, known scores: A2C better on CartPole, PPO better on Acrobot."""
    base = {("ppo", "CartPole-v1"): 300.0, ("a2c", "CartPole-v1"): 400.0, ("ppo", "Acrobot-v1"): -90.0, ("a2c", "Acrobot-v1"): -150.0}[algo, env]
    return base + 7.0 * seed


def finished_grid(tmp_path: Path, changes: dict | None = None) -> tuple[Path, list]:
    exp = load_experiment(grid_config(tmp_path, {**ALGOS_ENVS, **(changes or {})}))
    runs = expand(exp)
    write_experiment(exp, runs, {})
    for run in runs:
        fake_run(run_dir(exp.dir, run.run_id), scores_of(run.settings["algo"], run.settings["env.id"], run.seed))
    return exp.dir, runs


def test_collect_treats_envs_as_tasks_and_normalises(tmp_path: Path) -> None:
    root, _ = finished_grid(tmp_path, {"results": {"normalize": True}})
    out = io.StringIO()
    assert collect(root, out=out) == 0
    text = out.getvalue()
    assert "Final evaluation return, CartPole-v1:" in text and "Final evaluation return, Acrobot-v1:" in text
    assert "Across 2 tasks (normalised" in text
    summary = list(csv.DictReader((root / "results" / "summary.csv").open()))
    assert {(r["setting"], r["task"]) for r in summary} == {(f"algo={a}", e) for a in ("ppo", "a2c") for e in ("CartPole-v1", "Acrobot-v1")}
    cart_a2c = next(r for r in summary if r["setting"] == "algo=a2c" and r["task"] == "CartPole-v1")
    assert float(cart_a2c["mean"]) == pytest.approx(407.0) and cart_a2c["n"] == "3"

    matrix = {a: np.array([[(scores_of(a, e, s) - RANDOM_REF[e][0]) / (RANDOM_REF[e][1] - RANDOM_REF[e][0]) for e in ("CartPole-v1", "Acrobot-v1")] for s in range(3)]) for a in ("ppo", "a2c")}
    aggregate = {r["setting"]: r for r in csv.DictReader((root / "results" / "aggregate.csv").open())}
    for algo in ("ppo", "a2c"):
        row, m = aggregate[f"algo={algo}"], matrix[algo]
        assert float(row["iqm"]) == pytest.approx(stats.iqm(m), rel=1e-5)
        assert float(row["mean"]) == pytest.approx(stats.mean(m), rel=1e-5)
        assert float(row["optimality_gap"]) == pytest.approx(stats.optimality_gap(m), rel=1e-5)
        low, high = stats.stratified_bootstrap_ci(m, stats.iqm)
        assert (float(row["iqm_ci_low"]), float(row["iqm_ci_high"])) == (pytest.approx(low, rel=1e-5), pytest.approx(high, rel=1e-5))
        assert (row["n"], row["tasks"]) == ("3", "2")
    improvement = {(r["setting_x"], r["setting_y"]): r for r in csv.DictReader((root / "results" / "improvement.csv").open())}
    p = improvement["algo=a2c", "algo=ppo"]
    assert float(p["p_x_better"]) == pytest.approx(0.5)  # wins every CartPole pair, loses every Acrobot pair
    assert (p["ci_low"], p["ci_high"], p["no_ci"]) == ("", "", "no spread")  # each task's pairs all go one way: no spread
    for name in ("curves", "eval_curves", "final-CartPole-v1", "final-Acrobot-v1", "aggregate", "profile"):
        assert (root / "results" / "plots" / f"{name}.png").stat().st_size > 5000, name
    html = (root / "results" / "report.html").read_text()
    assert "Across 2 tasks" in html and "Probability of improvement" in html and html.count("<img src=\"data:image/png;base64,") == 6
    assert html.count('<source media="(max-width: 700px)" srcset="data:image/png;base64,') == 3  # the panels of curves, eval curves, aggregate in one column


def test_a_seed_missing_on_one_task_leaves_the_aggregate_by_name(tmp_path: Path) -> None:
    root, runs = finished_grid(tmp_path)
    lost = next(r for r in runs if r.settings == {"algo": "ppo", "env.id": "Acrobot-v1"} and r.seed == 2)
    (run_dir(root, lost.run_id) / "EVAL_DONE").unlink()
    (run_dir(root, lost.run_id) / "eval.csv").unlink()
    kept = next(r for r in runs if r.settings == {"algo": "ppo", "env.id": "CartPole-v1"} and r.seed == 2)
    out = io.StringIO()
    assert collect(root, out=out) == 0
    text = out.getvalue()
    assert f"algo=ppo: 1 runs left out of the aggregate across tasks (their seed has no score on another task): {kept.run_id}" in text
    assert f"run {lost.run_id} (algo=ppo, Acrobot-v1, seed 2): not evaluated" in text
    aggregate = {r["setting"]: r for r in csv.DictReader((root / "results" / "aggregate.csv").open())}
    assert aggregate["algo=ppo"]["n"] == "2" and aggregate["algo=a2c"]["n"] == "3"
    assert "optimality_gap" not in aggregate["algo=ppo"]  # raw scores: no gap without a normalised target


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_a_non_finite_eval_return_is_named_not_aggregated(tmp_path: Path, bad: str) -> None:
    root, runs = finished_grid(tmp_path)
    (run_dir(root, runs[0].run_id) / "eval.csv").write_text(f"episode,return,length\n0,{bad},20\n")
    out = io.StringIO()
    assert collect(root, out=out) == 0
    assert f"run {runs[0].run_id} (algo=ppo, CartPole-v1, seed 0): corrupt eval.csv" in out.getvalue()
    summary = {(r["setting"], r["task"]): r for r in csv.DictReader((root / "results" / "summary.csv").open())}
    assert summary["algo=ppo", "CartPole-v1"]["n"] == "2" and math.isfinite(float(summary["algo=ppo", "CartPole-v1"]["mean"]))


def test_normalising_an_env_without_references_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    root, _ = finished_grid(tmp_path)
    with (root / "runs.csv").open() as f:
        text = f.read().replace("Acrobot-v1", "Unknown-v0")
    (root / "runs.csv").write_text(text)
    code, _, err = run_cli("collect", str(root), "--normalize")
    assert code == 2 and err.count("\n") == 1 and "'Unknown-v0'" in err and "results.scores" in err, err
    assert not (root / "results").exists()


# ---------------------------------------------------------------------------- compare


def single_experiment(tmp_path: Path, name: str, algo: str, envs: list[str], changes: dict | None = None) -> Path:
    grid = {"env.id": envs} if len(envs) > 1 else {}
    exp = load_experiment(grid_config(tmp_path, {"name": name, "algo": algo, "env": {"id": envs[0], "num_envs": 2}, "sweep": {"seeds": [0, 1, 2], "grid": grid}, **(changes or {})}, name=f"{name}.yaml"))
    runs = expand(exp)
    write_experiment(exp, runs, {})
    for run in runs:
        fake_run(run_dir(exp.dir, run.run_id), scores_of(algo, run.config.env.id, run.seed), eval_every=False)
    return exp.dir


def test_compare_joins_experiments_on_their_common_envs(tmp_path: Path) -> None:
    ppo = single_experiment(tmp_path, "ours", "ppo", ["CartPole-v1"])
    a2c = single_experiment(tmp_path, "theirs", "a2c", ["CartPole-v1", "Acrobot-v1"])
    code, out, err = run_cli("compare", str(ppo), str(a2c), "-o", str(tmp_path / "cmp"), "--normalize")
    assert code == 0, err
    assert "comparing ours, theirs on CartPole-v1" in out and "theirs: 3 runs left out, on tasks the other experiments do not have (Acrobot-v1)" in out
    summary = {r["setting"]: r for r in csv.DictReader((tmp_path / "cmp" / "summary.csv").open())}
    assert set(summary) == {"ours", "theirs"} and float(summary["theirs"]["mean"]) == pytest.approx(407.0)
    improvement = {(r["setting_x"], r["setting_y"]): float(r["p_x_better"]) for r in csv.DictReader((tmp_path / "cmp" / "improvement.csv").open())}
    assert improvement["theirs", "ours"] == 1.0
    assert (tmp_path / "cmp" / "report.html").exists() and not (ppo / "results").exists()  # the experiments are only read


def test_compare_into_a_directory_of_an_earlier_comparison_removes_its_files_this_one_did_not_write(tmp_path: Path) -> None:
    """As collect does (tables.stale_removed): an earlier comparison's evaluation curves and per-task figures,
    of experiments with other tasks or evaluations during training, went; a file of the user's there stays."""
    ppo = single_experiment(tmp_path, "ours", "ppo", ["CartPole-v1"])
    a2c = single_experiment(tmp_path, "theirs", "a2c", ["CartPole-v1"])
    cmp = tmp_path / "cmp"
    stale = ("aggregate.csv", "eval_curves.csv", "plots/eval_curves.png", "plots/final-Acrobot-v1.png", "plots/narrow/aggregate.png")
    for name in (*stale, "plots/draft.png", "paper.tex"):
        (cmp / name).parent.mkdir(parents=True, exist_ok=True)
        (cmp / name).write_text("earlier\n")
    code, out, err = run_cli("compare", str(ppo), str(a2c), "-o", str(cmp))
    assert code == 0, err
    assert f"removed 5 files of earlier results that these have no data for: {', '.join(stale)}" in out
    assert not any((cmp / name).exists() for name in stale) and (cmp / "paper.tex").exists() and (cmp / "plots" / "draft.png").exists()
    assert (cmp / "plots" / "final.png").stat().st_size > 5000


def test_compare_refuses_what_it_cannot_join(tmp_path: Path) -> None:
    cart = single_experiment(tmp_path, "cart", "ppo", ["CartPole-v1"])
    acro = single_experiment(tmp_path, "acro", "a2c", ["Acrobot-v1"])
    for argv, why in (
        ([str(cart), str(acro)], "no environment in common (cart: CartPole-v1; acro: Acrobot-v1)"),
        ([str(cart)], "at least two"),
        ([str(cart), str(cart)], "given twice"),
        ([str(cart), str(tmp_path)], "not an experiment directory"),
    ):
        code, _, err = run_cli("compare", *argv, "-o", str(tmp_path / "cmp"))
        assert code == 2 and why in err and err.count("\n") == 1, (argv, err)
    assert not (tmp_path / "cmp").exists()


def test_compare_refuses_an_output_inside_a_compared_experiment(tmp_path: Path) -> None:
    """`-o A/results` overwrote A's own results without a word: refused in one line, nothing written."""
    ppo = single_experiment(tmp_path, "ours", "ppo", ["CartPole-v1"])
    a2c = single_experiment(tmp_path, "theirs", "a2c", ["CartPole-v1"])
    (ppo / "results").mkdir()
    (ppo / "results" / "summary.csv").write_text("A's own\n")
    before = sorted(p for p in tmp_path.rglob("*"))
    for output in (ppo / "results", a2c / "results", ppo, a2c / "runs" / "x"):
        code, _, err = run_cli("compare", str(ppo), str(a2c), "-o", str(output))
        assert code == 2 and err.count("\n") == 1 and f"-o {output}: inside the compared experiment" in err, (output, err)
    assert sorted(p for p in tmp_path.rglob("*")) == before and (ppo / "results" / "summary.csv").read_text() == "A's own\n"


def test_a_program_experiment_is_compared_once_it_names_its_task(tmp_path: Path) -> None:
    ours = single_experiment(tmp_path, "ours", "ppo", ["CartPole-v1"])
    program = deep_update({k: v for k, v in TINY.items() if k not in ("env", "train")}, {
        "name": "zoo", "algo": "program", "output": str(tmp_path / "logs"),
        "program": {"command": ["python", "-c", "pass"], "metrics": {"source": "hpcrl"}},
    })  # fmt: skip
    (tmp_path / "zoo.yaml").write_text(yaml.safe_dump(program))
    exp = load_experiment(tmp_path / "zoo.yaml")
    runs = expand(exp)
    write_experiment(exp, runs, {})
    for run in runs:
        fake_run(run_dir(exp.dir, run.run_id), 480.0 + run.seed, eval_every=False)
    code, _, err = run_cli("compare", str(ours), str(exp.dir), "-o", str(tmp_path / "cmp"))
    assert code == 2 and "results.task" in err, err
    program["results"] = {"task": "CartPole-v1"}
    (tmp_path / "zoo.yaml").write_text(yaml.safe_dump(program))
    exp = load_experiment(tmp_path / "zoo.yaml")
    write_experiment(exp, expand(exp), {})
    code, out, err = run_cli("compare", str(ours), str(exp.dir), "-o", str(tmp_path / "cmp"))
    assert code == 0, err
    assert "score runs differently" in out  # an evaluation against a program's last training episodes, said so


# ---------------------------------------------------------------------------- rliable


@pytest.mark.slow
def test_aggregates_match_rliable_on_the_same_score_matrix() -> None:
    """rliable is the reference implementation of these statistics (Agarwal et al. 2021)."""
    rly = pytest.importorskip("rliable.library", reason="rliable is not installed (pip install rliable 'pandas<3'; it fails to import with pandas 3)")
    metrics = pytest.importorskip("rliable.metrics")
    rng = np.random.default_rng(3)
    scores = {"ppo": rng.normal(0.8, 0.2, (10, 4)), "a2c": rng.normal(0.6, 0.3, (10, 4))}
    for m in scores.values():
        assert stats.iqm(m) == pytest.approx(metrics.aggregate_iqm(m))
        assert stats.mean(m) == pytest.approx(metrics.aggregate_mean(m))
        assert stats.median(m) == pytest.approx(metrics.aggregate_median(m))
        assert stats.optimality_gap(m) == pytest.approx(metrics.aggregate_optimality_gap(m))
    assert stats.probability_of_improvement(scores["ppo"], scores["a2c"]) == pytest.approx(metrics.probability_of_improvement(scores["ppo"], scores["a2c"]))

    def four(m: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_median(m), metrics.aggregate_iqm(m), metrics.aggregate_mean(m), metrics.aggregate_optimality_gap(m)])

    # 5,000 resamples: the bounds of three random streams stayed within 2.7% of the width of rliable's (20,000 took 4x the time)
    _, intervals = rly.get_interval_estimates(scores, four, reps=5000, random_state=np.random.RandomState(0))
    for name, m in scores.items():
        for k, fn in enumerate((stats.median, stats.iqm, stats.mean, stats.optimality_gap)):
            low, high = stats.stratified_bootstrap_ci(m, fn, reps=5000)
            width = intervals[name][1, k] - intervals[name][0, k]
            # Two bootstraps with different random streams: bounds agree to a few percent of the width.
            assert low == pytest.approx(intervals[name][0, k], abs=0.05 * width) and high == pytest.approx(intervals[name][1, k], abs=0.05 * width), (name, k)
    pairs = {"ppo,a2c": (scores["ppo"], scores["a2c"])}
    _, poi = rly.get_interval_estimates(pairs, metrics.probability_of_improvement, reps=5000, random_state=np.random.RandomState(0))
    low, high = stats.probability_of_improvement_ci(scores["ppo"], scores["a2c"], reps=5000)
    ref_low, ref_high = (float(x) for x in np.ravel(poi["ppo,a2c"]))
    width = ref_high - ref_low
    assert low == pytest.approx(ref_low, abs=0.08 * width) and high == pytest.approx(ref_high, abs=0.08 * width)
    assert math.isfinite(low) and low < high


def test_shipped_references_are_the_envs_registered_thresholds() -> None:
    import gymnasium as gym

    for env_id, (random, reference) in tasks.REFERENCE_SCORES.items():
        assert gym.spec(env_id).reward_threshold == reference
        assert random < reference
