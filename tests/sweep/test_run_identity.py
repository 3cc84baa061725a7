"""Run identity and what results pool: the promises the README makes about run ids and runs.csv.

- a run id hashes the canonical values of what is learned: the same value written two ways, or a
  default left out, is one run; an operational key (checkpoints, threads, device, resources) never
  changes an id; a learned one (any train.* key, the env, the algorithm) always does; one golden
  id notices a re-hash;
- a re-sweep with another learning setting makes a new generation in runs.csv: collect pools only
  the current config's runs and says, in one line, how many of earlier configs it left out;
- a damaged runs.csv or a missing run config is one line naming the file and exit 2.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from factories import deep_update, write_config

from hpcrl.config.build import stored_configs
from hpcrl.config.load import experiment_from_dict, load_experiment
from hpcrl.config.schema import ConfigError
from hpcrl.store.expdir import generation, read_runs_csv, split_generations, write_experiment
from hpcrl.sweep.runs import expand

PY = sys.executable
BASE: dict[str, Any] = {"name": "ids", "algo": "ppo", "env": {"id": "CartPole-v1"}, "train": {"total_steps": 10_000, "lr": 0.001}, "sweep": {"seeds": [0, 1]}}


def ids(changes: dict | None = None) -> list[str]:
    """The run ids of BASE with `changes`, as status and collect read them on disk (`stored_configs`): the golden
    distributed ids below are those of DQN runs that a sweep now refuses (10,000 steps, and learning_starts' default
    10,000: no gradient step), and an id never depended on those rules."""
    with stored_configs():
        return [r.run_id for r in expand(experiment_from_dict(deep_update(BASE, changes or {})))]


def test_golden_run_id() -> None:
    """Changing how ids are hashed (or a default of a learned field) re-identifies every experiment
    on disk: the runs train again. If that is meant, update this id and say so in the changelog."""
    assert ids() == ["2edf0fed8c-s0", "2edf0fed8c-s1"]


def test_one_value_written_several_ways_is_one_run(tmp_path: Path) -> None:
    """YAML 1.1 reads `1e-3` as a string and `1.0e-3` as a number; both are lr 0.001 once typed,
    in the train section or in a grid, and a default left out equals the default written."""
    spellings = []
    for i, text in enumerate(["lr: 1e-3", "lr: 1.0e-3", "lr: 0.001"]):
        for where in ("train", "grid"):
            body = f"train: {{{text}}}" if where == "train" else f"sweep: {{grid: {{train.{text.replace(': ', ': [')}]}}}}"
            path = tmp_path / f"{i}{where}.yaml"
            path.write_text(f"name: ids\nalgo: ppo\n{body}\n")
            spellings.append([(r.run_id, r.setting_label) for r in expand(load_experiment(path))])
    assert {s[0][0] for s in spellings} == {spellings[0][0][0]}
    assert {label for s in spellings for _, label in s} == {"default", "train.lr=0.001"}
    default = experiment_from_dict({"name": "ids"}).train.gamma
    assert ids({"train": {"gamma": default}}) == ids()


def test_keys_added_later_keep_the_ids_of_runs_from_before_them_at_their_defaults() -> None:
    """A run swept before `train.cnn_channels` or `train.async_rollout` existed trained with the
    Nature CNN and hpcrl's own rollout choice: written out at those values, the ids are the ones
    those runs have on disk (the golden id above is from before both keys)."""
    assert ids({"train": {"cnn_channels": [32, 64, 64], "async_rollout": "auto"}}) == ids()


def test_a_distributed_run_keeps_its_id_from_before_ratio_slack() -> None:
    """`distributed.ratio_slack: 0` is how learners paced before the key: the ids of distributed runs
    are the ones computed before it existed (at 0fdc0bc); any slack is another run."""
    dist = {"algo": "dqn", "distributed": {"actors": 2}}
    assert ids(dist) == ids(deep_update(dist, {"distributed": {"ratio_slack": 0.0}})) == ["0291713e6d-s0", "0291713e6d-s1"]
    assert ids(deep_update(dist, {"distributed": {"ratio_slack": 0.25}})) != ids(dist)


def test_an_alphazero_run_keeps_its_id_from_before_value_target_q() -> None:
    """`train.value_target_q: 0` is AlphaZero's value target as it was: the ids of AlphaZero runs are
    the ones computed before the key existed (at 61b500e); any mix of the search's value is another run."""
    az = {"algo": "alphazero", "env": {"backend": "game", "id": "hpcrl.games.tictactoe:TicTacToe", "num_envs": 1}}
    assert ids(az) == ids(deep_update(az, {"train": {"value_target_q": 0.0}})) == ["fe416e37de-s0", "fe416e37de-s1"]
    assert ids(deep_update(az, {"train": {"value_target_q": 0.5}})) != ids(az)


@pytest.mark.parametrize(
    "change",
    [
        {"train": {"checkpoint_every": 3}},
        {"train": {"keep_checkpoints": 5}},
        {"train": {"torch_threads": 2}},
        {"train": {"device": "cpu"}},
        {"env": {"vectorization": "async"}},
        {"env": {"worker_timeout_s": 30}},
        {"env": {"envs_per_worker": 2}},
        {"resources": {"time": "07:00:00", "mem": "9G", "cpus": 3}},
        {"eval": {"episodes": 3}},
        {"container": {"binds": ["/a:/a"]}},
        {"output": "elsewhere"},
    ],
    ids=lambda c: next(iter(c)) + "." + next(iter(next(iter(c.values())))) if isinstance(next(iter(c.values())), dict) else next(iter(c)),
)
def test_operational_keys_keep_the_ids(change: dict) -> None:
    assert ids(change) == ids()


def test_distributed_plumbing_keeps_the_ids_and_learning_settings_do_not() -> None:
    dist = {"algo": "dqn", "distributed": {"actors": 2}}
    base = ids(dist)
    assert ids(deep_update(dist, {"distributed": {"learner_timeout_s": 30.0, "heartbeat_s": 0.5, "actor_mem": "1G"}})) == base
    assert ids(deep_update(dist, {"distributed": {"actors": 3}})) != base


@pytest.mark.parametrize(
    "change",
    [
        {"train": {"lr": 0.002}},
        {"train": {"gamma": 0.9}},
        {"train": {"total_steps": 20_000}},
        {"train": {"amp": "bf16"}},
        {"train": {"cnn_channels": [16, 32, 32]}},
        {"env": {"num_envs": 4}},
        {"env": {"kwargs": {"render_mode": None}}},
        {"algo": "a2c"},
        {"sweep": {"grid": {"train.ent_coef": [0.02]}}},
    ],
    ids=str,
)
def test_learned_keys_change_the_ids(change: dict) -> None:
    assert set(ids(change)).isdisjoint(ids())


def test_a_grid_over_a_key_that_is_not_learned_still_makes_distinct_runs() -> None:
    """eval.* is not learned but may be swept (compare evaluations of one training setup): those runs
    are not one run."""
    grid = ids({"sweep": {"grid": {"eval.episodes": [5, 10]}}})
    assert len(set(grid)) == 4


def test_expand_refuses_two_grid_points_that_are_one_run() -> None:
    """Whatever let them through, two points with one id are refused before anything is written."""
    exp = experiment_from_dict(deep_update(BASE, {"sweep": {"grid": {"train.lr": [0.001, 0.002]}}}))
    exp.sweep.grid["train.lr"] = [0.001, "1e-3"]
    with pytest.raises(ConfigError, match=r"sweep.grid: the points train.lr=0.001 and train.lr=0.001 are the same run"):
        expand(exp)


# ---------------------------------------------------------------- generations: what collect pools
def hpcrl(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "hpcrl", *args], capture_output=True, text=True, cwd=cwd, timeout=timeout)


@pytest.mark.e2e
def test_resweep_with_a_new_lr_pools_only_the_current_configs_runs(tmp_path: Path) -> None:
    tiny = {"train": {"total_steps": 256, "num_steps": 64, "update_epochs": 1}, "sweep": {"seeds": [0, 1]}}
    for lr in (0.001, 0.002):
        config = write_config(tmp_path, deep_update(tiny, {"train": {"lr": lr}}))
        proc = hpcrl("sweep", str(config), "--scheduler", "local", cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    exp = tmp_path / "logs" / "tiny"
    rows = list(csv.DictReader((exp / "runs.csv").open()))
    assert [(r["seed"], r["generation"]) for r in rows] == [("0", "0"), ("1", "0"), ("0", "1"), ("1", "1")]
    assert all((exp / "runs" / r["run_id"] / "DONE").exists() for r in rows)  # earlier runs stay on disk

    collected = hpcrl("collect", str(exp), cwd=tmp_path)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    (summary,) = list(csv.DictReader((exp / "results" / "summary.csv").open()))
    assert (summary["n_expected"], summary["n"]) == ("2", "2")
    current = {r["run_id"] for r in rows[2:]}
    notes = [line for line in collected.stdout.splitlines() if "left out" in line]
    assert notes == [
        "left out 2 runs of earlier configs of this experiment (runs.csv rows with generation < 1; their run directories are kept): "
        "sweep an earlier config again to make it current (done runs are not retrained)"
    ]
    assert not any(r["run_id"] in collected.stdout for r in rows[:2]) and current

    # Sweeping the first config again makes it current; nothing trains again.
    again = hpcrl("sweep", str(write_config(tmp_path, deep_update(tiny, {"train": {"lr": 0.001}}))), "--scheduler", "local", cwd=tmp_path)
    assert again.returncode == 0 and "nothing submitted" in again.stdout, again.stdout + again.stderr
    assert [r["generation"] for r in csv.DictReader((exp / "runs.csv").open())] == ["2", "2", "1", "1"]


def test_the_same_config_swept_again_stays_one_generation(tmp_path: Path) -> None:
    exp = experiment_from_dict(deep_update(BASE, {"output": str(tmp_path)}))
    write_experiment(exp, expand(exp), {})
    write_experiment(exp, expand(exp), {})
    assert [r["generation"] for r in read_runs_csv(exp.dir)] == ["0", "0"]


# ---------------------------------------------------------------- damaged files: one line, exit 2
def written(tmp_path: Path) -> Path:
    exp = experiment_from_dict(deep_update(BASE, {"output": str(tmp_path)}))
    write_experiment(exp, expand(exp), {})
    return exp.dir


@pytest.mark.parametrize(
    "damage",
    [
        lambda t: t[: len(t) - 9],  # a truncated last row
        lambda t: t[: len(t) - 1],  # only its end of line lost
        lambda t: t[:20],  # the header cut off
        lambda t: "",
        lambda t: "\x00\xff garbage \x01\n" * 3,
        lambda t: t.replace("run_id", "rid"),  # a missing column
        lambda t: t + "7,not-an-id,0,0\n",
        lambda t: t + "7,0123456789-s3,4,0\n",  # the id's seed is not the row's
        lambda t: t + t.splitlines()[1] + "\n",  # a duplicated row
    ],
    ids=["truncated", "newline-lost", "header-cut", "empty", "garbage", "missing-column", "bad-row", "seed-mismatch", "duplicate-row"],
)
def test_a_damaged_runs_csv_is_a_config_error_naming_it(tmp_path: Path, damage: Any) -> None:
    root = written(tmp_path)
    path = root / "runs.csv"
    path.write_text(damage(path.read_text()))
    with pytest.raises(ConfigError, match=f"^{path}: damaged run index "):
        read_runs_csv(root)


@pytest.mark.parametrize("command", ["collect", "status", "train"])
def test_a_damaged_runs_csv_is_one_line_and_exit_2(tmp_path: Path, command: str) -> None:
    root = written(tmp_path)
    path = root / "runs.csv"
    path.write_text(path.read_text()[:-9])
    args = [command, str(root)] + (["--task", "0"] if command == "train" else [])
    proc = hpcrl(*args, cwd=tmp_path, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"hpcrl: error: {path}: damaged run index")


def test_runs_csv_damage_names_the_line(tmp_path: Path) -> None:
    root = written(tmp_path)
    path = root / "runs.csv"
    path.write_text(path.read_text() + "2,0123456789-s3,3,x\n")
    with pytest.raises(ConfigError, match=r"runs.csv: damaged run index .*: line 4: '2,0123456789-s3,3,x'"):
        read_runs_csv(root)


@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_a_missing_or_damaged_run_config_is_one_line_and_exit_2(tmp_path: Path, damage: str) -> None:
    root = written(tmp_path)
    run_id = read_runs_csv(root)[0]["run_id"]
    config = root / "runs" / run_id / "config.yaml"
    if damage == "missing":
        config.unlink()
    else:
        config.write_text(yaml.safe_dump({"run": {"index": 0}}) + "config: [1, 2\n")
    for args in (["train", str(root), "--task", "0"], ["status", str(root)]):
        proc = hpcrl(*args, cwd=tmp_path, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stdout + proc.stderr
        assert proc.stderr.startswith(f"hpcrl: error: {config}: ") and "Traceback" not in proc.stderr


def test_only_the_newest_generation_is_current_whatever_the_row_order() -> None:
    """The pooling rule without a sweep: rows of three generations, in any order on disk."""
    rows = [{"run_id": f"{i:010x}-s0", "generation": str(g)} for i, g in enumerate([1, 2, 0, 2, 1])]
    current, earlier = split_generations(rows)
    assert [r["run_id"] for r in current] == [rows[1]["run_id"], rows[3]["run_id"]]
    assert sorted(generation(r) for r in earlier) == [0, 1, 1]
    assert split_generations([{"run_id": "a", "generation": ""}]) == ([{"run_id": "a", "generation": ""}], [])
