"""A hostile user's configs (issue 12): each is refused at sweep time, through the real CLI, with
one line naming the key path, exit code 2, and nothing written."""

from __future__ import annotations

import io
import os
import resource
import shutil
import subprocess
import sys
import time
import tracemalloc
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from factories import TINY, deep_update, write_config

from hpcrl.cli import main
from hpcrl.config.build import stored_configs
from hpcrl.config.experiment import MAX_NAME
from hpcrl.config.key_paths import is_learned, learned_settings
from hpcrl.config.limits import MAX_RUNS
from hpcrl.config.load import MAX_CONFIG_BYTES, experiment_from_dict, load_experiment
from hpcrl.config.output_dir import SWEEP_FIRST
from hpcrl.config.schema import ConfigError
from hpcrl.sweep.runs import expand

DQN_TRAIN = {"total_steps": 1000, "buffer_size": 500, "batch_size": 32, "learning_starts": 100}


def config_with_train(tmp_path: Path, changes: dict, train: dict) -> Path:
    """A tiny config whose whole train section is `train` (TINY's is PPO's)."""
    data = deep_update(TINY, {"output": str(tmp_path / "logs"), **changes})
    data["train"] = train
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sweep(config: Path, *args: str, dry_run: bool = True) -> tuple[int, str]:
    """`hpcrl sweep CONFIG` in this process; (exit code, stderr)."""
    err = io.StringIO()
    argv = ["sweep", str(config), "--scheduler", "local", *(["--dry-run"] if dry_run else []), *args]
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


def assert_refused(tmp_path: Path, code: int, stderr: str, key: str) -> None:
    assert code == 2, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("hpcrl: error: "), stderr
    assert f": {key}" in stderr, stderr
    assert not (tmp_path / "logs").exists()


def refused(tmp_path: Path, changes: dict, key: str, *args: str, dry_run: bool = True, train: dict | None = None) -> str:
    config = write_config(tmp_path, changes) if train is None else config_with_train(tmp_path, changes, train)
    code, stderr = sweep(config, *args, dry_run=dry_run)
    assert_refused(tmp_path, code, stderr, key)
    return stderr


# ---------------------------------------------------------------------------- item 1: directives

POISON = ["gpu\ntouch /tmp/hpcrl-pwned", "gpu --uid=0", "gpu#x", "gpu'x", "gpu\rx", "", "-f", "--uid=0"]


@pytest.mark.parametrize("key", ["partition", "account", "queue", "sge_pe", "sge_mem_resource", "sge_gpu_resource"])
def test_directive_words_are_refused_with_their_key_path(tmp_path: Path, key: str) -> None:
    for i, value in enumerate(POISON):
        stderr = refused(tmp_path, {"resources": {key: value}}, f"resources.{key}", dry_run=i > 0)
        assert "directive" in stderr or "single line" in stderr


def test_extra_directive_lines_are_refused_at_their_index(tmp_path: Path) -> None:
    for value in ["--exclusive\ntouch /tmp/hpcrl-pwned", "--x\r--y", "--x\x0b", "  "]:
        refused(tmp_path, {"resources": {"extra": ["--constraint=a100", value]}}, "resources.extra[1]")
    assert sweep(write_config(tmp_path, {"resources": {"extra": ["--constraint=a100 --exclusive", "-l h=node01"]}}))[0] == 0


@pytest.mark.parametrize(
    ("scheduler", "line", "option"),
    [
        ("slurm", "--array=1-1000000", "--array"),
        ("slurm", "-a 1-9", "-a"),
        ("slurm", "--arr=1-9", "--array"),
        ("slurm", "--output=/etc/passwd", "--output"),
        ("slurm", "-o/etc/passwd", "-o"),
        ("slurm", "--exclusive --job-name=x", "--job-name"),
        ("slurm", "--dependency=afterok:1", "--dependency"),
        ("slurm", "--no-requeue", "--no-requeue"),
        ("slurm", "--time=48:00:00", "--time"),
        ("sge", "-t 1-1000000", "-t"),
        ("sge", "-o /etc/passwd", "-o"),
        ("sge", "-hold_jid 12", "-hold_jid"),
        ("sge", "-notify", "-notify"),
        ("sge", "-l h_rt=48:00:00", "-l h_rt"),
        ("sge", "-l h=node01,mem_free=64G", "-l mem_free"),
    ],
)
def test_extra_lines_that_set_a_directive_hpcrl_writes_are_refused(tmp_path: Path, scheduler: str, line: str, option: str) -> None:
    """`--array=1-1000000` rendered below hpcrl's `--array=1-3`, and sbatch takes the last: it passed
    the run limit and every task past the third failed; `--output` replaced the log hpcrl reads."""
    stderr = refused(tmp_path, {"resources": {"extra": ["--constraint=a100", line]}}, "resources.extra[1]", "--scheduler", scheduler)
    assert f"resources.extra[1]: {option} is written by hpcrl itself (" in stderr and repr(line) in stderr, stderr


@pytest.mark.parametrize(("scheduler", "lines"), [("slurm", ["--constraint=a100 --exclusive", "--gres=gpu:a100:1", "--ntasks=2", "--comment=x"]), ("sge", ["-l h=node01", "-P project", "-terse"])])
def test_extra_lines_that_set_options_of_their_own_are_kept(tmp_path: Path, scheduler: str, lines: list[str]) -> None:
    code, stderr = sweep(write_config(tmp_path, {"resources": {"extra": lines}}), "--scheduler", scheduler)
    assert code == 0, stderr


def test_an_extra_line_is_options_without_the_directive_prefix(tmp_path: Path) -> None:
    """`#SBATCH --x` rendered as `#SBATCH #SBATCH --x`: the template writes the prefix."""
    for value in ["#SBATCH --exclusive", "#$ -l h=node01", " # a comment"]:
        stderr = refused(tmp_path, {"resources": {"extra": [value]}}, "resources.extra[0]")
        assert "writes the prefix" in stderr, stderr


@pytest.mark.parametrize(("changes", "key"), [({"cuda": {"modules": ["cuda/12.1", ""]}}, "cuda.modules[1]"), ({"container": {"binds": ["  "]}}, "container.binds[0]")])
def test_a_blank_name_that_reaches_a_job_s_shell_line_is_refused(tmp_path: Path, changes: dict, key: str) -> None:
    """`cuda.modules: [""]` rendered `module load ''`, which stops every job."""
    assert "expected a non-empty value" in refused(tmp_path, changes, key, "--scheduler", "slurm")


def test_actor_mem_is_a_memory_size(tmp_path: Path) -> None:
    apex = {"algo": "dqn", "distributed": {"actor_mem": "2G\ntouch x"}}
    refused(tmp_path, apex, "distributed.actor_mem", train=DQN_TRAIN)


# ---------------------------------------------------------------------------- item 6: duplicate points


@pytest.mark.parametrize("values", [[0.001, 0.001], ["1e-3", 0.001], [0.001, "1.0e-3", 0.01]])
def test_duplicate_grid_points_are_refused(tmp_path: Path, values: list) -> None:
    stderr = refused(tmp_path, {"sweep": {"seeds": [0], "grid": {"train.lr": values}}}, "sweep.grid.train.lr")
    assert "repeats" in stderr


def test_a_section_point_equal_to_another_once_typed_is_refused(tmp_path: Path) -> None:
    grid = {"train": [{"lr": 0.001, "gamma": 0.9}, {"gamma": 0.9, "lr": "1e-3"}]}
    refused(tmp_path, {"sweep": {"grid": grid}}, "sweep.grid.train")


def test_grid_values_are_typed(tmp_path: Path) -> None:
    """`1e-3` (a string to YAML 1.1) and `5` for a float are stored as the numbers they mean."""
    exp = load_experiment(write_config(tmp_path, {"sweep": {"grid": {"train.lr": ["1e-3", 5], "env.num_envs": [2.0]}}}))
    assert exp.sweep.grid == {"train.lr": [0.001, 5.0], "env.num_envs": [2]}
    assert [type(v) for v in exp.sweep.grid["train.lr"]] == [float, float]


# ---------------------------------------------------------------------------- item 7: what can be swept

UNSWEPT = {
    "resources.time": ["00:10:00", "00:20:00"],
    "resources.partition": ["a", "b"],
    "resources": [{"mem": "1G"}, {"mem": "2G"}],
    "container.image": ["a.sif", "b.sif"],
    "cuda.modules": [["cuda/11"], ["cuda/12"]],
    "python": ["/usr/bin/python3", "/opt/python"],
    "output": ["a", "b"],
    "name": ["a", "b"],
    "eval.gpus": [0, 1],
    "image.python": ["3.10", "3.11"],
    "train.device": ["cpu", "cuda"],
    "train.checkpoint_every": [1, 2],
    "train.torch_threads": [1, 2],
    "env.vectorization": ["sync", "async"],
    "env.worker_timeout_s": [10, 20],
    "env.envs_per_worker": [1, 4],
    "sweep.seeds": [[0], [1]],
}


@pytest.mark.parametrize("key", UNSWEPT)
def test_keys_that_do_not_change_learning_cannot_be_swept(tmp_path: Path, key: str) -> None:
    stderr = refused(tmp_path, {"sweep": {"grid": {key: UNSWEPT[key]}}}, f"sweep.grid.{key}")
    assert "cannot be swept" in stderr


def test_distributed_operational_keys_cannot_be_swept(tmp_path: Path) -> None:
    apex = {"algo": "dqn", "distributed": {}}
    for key, values in {"distributed.redis.address": ["h:1", "h:2"], "distributed.actor_cpus": [1, 2]}.items():
        refused(tmp_path, {**apex, "sweep": {"grid": {key: values}}}, f"sweep.grid.{key}", train=DQN_TRAIN)
    exp = load_experiment(config_with_train(tmp_path, {**apex, "sweep": {"grid": {"distributed.actors": [1, 2]}}}, DQN_TRAIN))
    assert exp.sweep.grid == {"distributed.actors": [1, 2]}


def test_evaluation_settings_can_be_swept(tmp_path: Path) -> None:
    exp = load_experiment(write_config(tmp_path, {"sweep": {"seeds": [0], "grid": {"eval.threshold": [0, 1e6]}}}))
    assert exp.sweep.grid == {"eval.threshold": [0.0, 1e6]}
    exp = load_experiment(write_config(tmp_path, {"sweep": {"seeds": [0], "grid": {"eval": [{"episodes": 3}, {"video": True}]}}}))
    assert exp.sweep.grid == {"eval": [{"episodes": 3}, {"video": True}]}
    assert not is_learned("eval.threshold", "ppo")


def test_is_learned_follows_the_field_declarations() -> None:
    assert is_learned("train.lr", "ppo") and is_learned("env.kwargs.frame_skip", "ppo") and is_learned("train.buffer_size", "dqn")
    assert not is_learned("train.device", "dqn") and not is_learned("resources.mem", "ppo") and not is_learned("train.save_replay", "dqn")
    learned = learned_settings(experiment_from_dict({"name": "x", "train": {"lr": "1e-3"}}))
    assert learned["train"]["lr"] == 0.001 and "device" not in learned["train"] and "resources" not in learned


def test_a_section_grid_point_changes_only_the_keys_it_names(tmp_path: Path) -> None:
    """`{train: [{lr: ..}]}` merges into the config's train section instead of resetting it."""
    config = write_config(tmp_path, {"sweep": {"seeds": [0], "grid": {"train": [{"lr": 0.01}, {"lr": 0.02, "gamma": 0.9}]}}})
    runs = expand(load_experiment(config))
    assert [r.config.train.lr for r in runs] == [0.01, 0.02]
    assert [r.config.train.gamma for r in runs] == [0.99, 0.9]
    assert {r.config.train.num_steps for r in runs} == {TINY["train"]["num_steps"]} != {128}
    assert {tuple(r.config.train.hidden_sizes) for r in runs} == {tuple(TINY["train"]["hidden_sizes"])}


def test_overlapping_grid_keys_are_refused(tmp_path: Path) -> None:
    refused(tmp_path, {"sweep": {"grid": {"train": [{"lr": 0.01}], "train.lr": [0.1]}}}, "sweep.grid.train.lr")


# ---------------------------------------------------------------------------- item 8: login-node checks


@pytest.mark.parametrize(
    "changes,key",
    [
        ({"env": {"id": "CartPol-v1"}}, "env.id"),
        ({"env": {"id": "FrozenLake-v1"}}, "env.id"),
        ({"env": {"kwargs": {"no_such_kwarg": 1}}}, "env.kwargs"),
        ({"env": {"backend": "vizdoom", "id": "VizdoomBasic-v0"}}, "env.id"),
        ({"env": {"backend": "vizdoom", "id": "basik"}}, "env.id"),
        ({"env": {"backend": "vizdoom", "id": "basic", "kwargs": {"screen_resolutoin": "RES_160X120"}}}, "env.kwargs.screen_resolutoin"),
        ({"env": {"backend": "vizdoom", "id": "basic", "kwargs": {"screen_resolution": "RES_NOPE"}}}, "env.kwargs.screen_resolution"),
        ({"env": {"backend": "vizdoom", "id": "basic", "kwargs": {"episode_timeout": -5}}}, "env.kwargs.episode_timeout"),
        ({"env": {"backend": "vizdoom", "id": "basic", "kwargs": {"living_reward": float("nan")}}}, "env.kwargs.living_reward"),
        ({"env": {"backend": "vizdoom", "id": "basic", "kwargs": {"frame_skip": 0}}}, "env.kwargs.frame_skip"),
        ({"env": {"backend": "vizdoom", "id": "basic", "kwargs": {"downsample": True}}}, "env.kwargs.downsample"),
        ({"env": {"backend": "vizdoom", "id": "basic"}, "sweep": {"grid": {"env.kwargs.episode_timeout": [300, 1e20]}}}, "env.kwargs.episode_timeout"),
        ({"env": {"backend": "habitat", "id": "PointNav", "kwargs": {"scene": "room.glb", "forward_step": -0.25}}}, "env.kwargs.forward_step"),
        ({"env": {"backend": "habitat", "id": "PointNav", "kwargs": {"scene": "room.glb", "max_depth": float("nan")}}}, "env.kwargs.max_depth"),
        ({"env": {"backend": "habitat", "id": "PointNav", "kwargs": {"scene": "room.glb", "turn_angle": "ten"}}}, "env.kwargs.turn_angle"),
        ({"env": {"backend": "habitat", "id": "PointNav", "kwargs": {"scene": "room.glb", "resolution": [100_000, 100_000]}}}, "env.kwargs.resolution"),
        ({"env": {"backend": "habitat", "id": "PointNav", "kwargs": {"scene": "room.glb", "sensors": ["lidar"]}}}, "env.kwargs.sensors"),
        ({"env": {"backend": "habitat", "id": "PointNav", "kwargs": {"scene": "room.glb", "gpu_device_id": -1}}}, "env.kwargs.gpu_device_id"),
        ({"env": {"backend": "habitat", "id": "PointNav", "kwargs": {"scene": "room.glb", "min_geodesic": 5, "max_geodesic": 2}}}, "env.kwargs.min_geodesic"),
        ({"env": {"backend": "habitat", "id": "PointNav", "kwargs": {"scene": "room.glb", "forward_stpe": 0.5}}}, "env.kwargs"),
        ({"env": {"backend": "habitat", "id": "PointNav", "kwargs": {}}}, "env.kwargs"),
        ({"env": {"backend": "habitat", "id": "ObjectNav", "kwargs": {"scene": "room.glb"}}}, "env.id"),
        ({"sweep": {"grid": {"env.id": ["CartPole-v1", "Acrobat-v1"]}}}, "sweep.grid.env.id"),
        ({"sweep": {"seeds": [-1]}}, "sweep.seeds[0]"),
        ({"sweep": {"seeds": [0, 1e20]}}, "sweep.seeds[1]"),
        ({"sweep": {"seeds": [2**32]}}, "sweep.seeds[0]"),
        ({"train": {"device": "tpu"}}, "train.device"),
        ({"train": {"device": "cuda:x"}}, "train.device"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_what_a_login_node_can_check_is_checked_at_sweep_time(tmp_path: Path, changes: dict, key: str) -> None:
    refused(tmp_path, changes, key)


def test_dqn_needs_discrete_actions(tmp_path: Path) -> None:
    stderr = refused(tmp_path, {"algo": "dqn", "env": {"id": "Pendulum-v1"}}, "env.id", train=DQN_TRAIN)
    assert "Discrete" in stderr
    assert sweep(config_with_train(tmp_path, {"algo": "dqn"}, DQN_TRAIN))[0] == 0


def test_the_checks_accept_what_the_jobs_can_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # the local scheduler's machine: two GPUs
    for changes in [
        {"env": {"id": "Pendulum-v1"}},
        {"env": {"backend": "vizdoom", "id": "basic"}},
        {"env": {"backend": "vizdoom", "id": "VizdoomDefendCenter-v1"}},
        {"env": {"backend": "habitat", "id": "PointNav", "kwargs": {"scene": "room.glb", "resolution": [64, 64], "sensors": ["depth", "rgb"], "forward_step": 1, "slack_reward": -0.01}}},
        {"env": {"backend": "vizdoom", "id": "basic", "kwargs": {"episode_timeout": 300, "render_hud": True, "available_buttons": ["MOVE_LEFT", "ATTACK"], "downsample": 2}}},
        {"sweep": {"seeds": [0, 2**32 - 1]}, "train": {"device": "cuda:1"}, "resources": {"gpus": 2}},
        {"train": {"device": "cuda"}, "resources": {"gpus": 2, "ranks": 2}},
    ]:
        code, stderr = sweep(write_config(tmp_path, changes))
        assert code == 0, stderr


@pytest.mark.parametrize(
    ("changes", "key", "says"),
    [
        ({"train": {"device": "cuda"}}, "resources.gpus", "needs a GPU"),
        ({"train": {"device": "cuda:0"}, "resources": {"gpus": 0}}, "resources.gpus", "needs a GPU"),
        ({"train": {"device": "cuda:1"}, "resources": {"gpus": 1}}, "train.device", "GPU 1 of the task"),
        ({"train": {"device": "cuda:0"}, "resources": {"gpus": 2, "ranks": 2}}, "train.device", "every rank on one GPU"),
        ({"train": {"device": "cuda"}, "resources": {"ranks": 2}}, "resources.gpus", "needs a GPU"),
    ],
)
def test_a_cuda_device_the_tasks_gpus_do_not_cover_is_refused_at_sweep_time(tmp_path: Path, changes: dict, key: str, says: str) -> None:
    """Found on an H200 node: `train.device: cuda` with the configs' default `resources.gpus: 0`
    failed every task with a traceback (`No CUDA GPUs are available`: the local executor, like
    Slurm's cgroups, hides the GPUs a task did not ask for), as did two ranks on the node's one GPU."""
    assert says in refused(tmp_path, changes, key)


@pytest.mark.parametrize(
    ("visible", "changes", "says"),
    [
        ("", {"train": {"device": "cuda"}, "resources": {"gpus": 1}}, "train.device 'cuda' needs 1 GPU per task; local runs its tasks on this machine, which has 0"),
        ("0", {"train": {"device": "cuda"}, "resources": {"gpus": 2, "ranks": 2}}, "needs 2 GPUs per task"),
        ("0", {"resources": {"gpus": 2, "ranks": 2}}, "2 ranks, one GPU each, needs 2 GPUs per task"),
    ],
)
def test_the_local_scheduler_refuses_training_that_needs_more_gpus_than_the_machine_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, visible: str, changes: dict, says: str
) -> None:
    """Two ranks on a node with one GPU (seen on an H200 node): rank 1 failed on `cuda:1` after the
    sweep had submitted everything. The local scheduler knows its machine (CUDA_VISIBLE_DEVICES,
    else nvidia-smi) and refuses at sweep time; a GPU config with `train.device: auto` still runs on
    a machine without one."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert says in refused(tmp_path, changes, "resources.gpus", dry_run=False)
    code, stderr = sweep(write_config(tmp_path, changes))  # a dry run shows the scripts, and why a sweep refuses them
    assert code == 0 and stderr.startswith("hpcrl: warning: resources.gpus: ") and says in stderr, stderr
    code, stderr = sweep(write_config(tmp_path, {"resources": {"gpus": 2}}))
    assert code == 0, stderr


def test_config_checks_do_not_import_torch(tmp_path: Path) -> None:
    """Validation runs on login nodes; `hpcrl status` and `sweep` must not pay for torch."""
    config = write_config(tmp_path, {"env": {"id": "Pendulum-v1"}})
    code = (
        "import sys; from hpcrl.config.load import load_experiment; from hpcrl.rl.envcheck import check_environment;"
        f"check_environment(load_experiment({str(config)!r})); assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------- item 9: nonsense numbers


@pytest.mark.parametrize(
    "changes,key",
    [
        ({"train": {"lr": float("nan")}}, "train.lr"),
        ({"train": {"lr": float("inf")}}, "train.lr"),
        ({"train": {"lr": "-inf"}}, "train.lr"),
        ({"train": {"max_grad_norm": -1}}, "train.max_grad_norm"),
        ({"train": {"clip_coef": -1}}, "train.clip_coef"),
        ({"train": {"gamma": 1.5}}, "train.gamma"),
        ({"train": {"gae_lambda": -0.1}}, "train.gae_lambda"),
        ({"train": {"ent_coef": -0.01}}, "train.ent_coef"),
        ({"train": {"vf_coef": float("nan")}}, "train.vf_coef"),
        ({"train": {"hidden_sizes": [10**9]}}, "train.hidden_sizes[0]"),
        ({"train": {"cnn_channels": [16, 32]}}, "train.cnn_channels"),
        ({"train": {"cnn_channels": [16, 32, 32, 64]}}, "train.cnn_channels"),
        ({"train": {"cnn_channels": [16, 0, 32]}}, "train.cnn_channels[1]"),
        ({"train": {"cnn_channels": [16, 32, 10**6]}}, "train.cnn_channels[2]"),
        ({"train": {"cnn_channels": [16, 32, 32.5]}}, "train.cnn_channels[2]"),
        ({"train": {"total_steps": 10**30}}, "train.total_steps"),
        ({"resources": {"mem": "0G"}}, "resources.mem"),
        ({"resources": {"mem": "0"}}, "resources.mem"),
        ({"eval": {"gpus": -1}}, "eval.gpus"),
        ({"eval": {"threshold": float("nan")}}, "eval.threshold"),
        ({"env": {"num_envs": 10**12}}, "env.num_envs"),
        ({"env": {"num_envs": 4096}, "train": {"num_steps": 4096}}, "train.num_steps"),
        ({"resources": {"max_concurrent": 0}}, "resources.max_concurrent"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_nonsense_numbers_are_refused(tmp_path: Path, changes: dict, key: str) -> None:
    refused(tmp_path, changes, key)


def test_dqn_bounds(tmp_path: Path) -> None:
    for train, key in [({"buffer_size": 10**12}, "train.buffer_size"), ({"tau": 0}, "train.tau"), ({"end_e": 1.5}, "train.end_e"), ({"n_step": 0}, "train.n_step")]:
        refused(tmp_path, {"algo": "dqn"}, key, train={**DQN_TRAIN, **train})


@pytest.mark.parametrize(
    ("train", "changes", "key", "says"),
    [
        ({"learning_starts": 1000}, {}, "train.learning_starts", "1000 is not below total_steps (1000): gradient steps begin after"),
        ({"learning_starts": 0, "total_steps": 20}, {}, "train.batch_size", "32 is more than total_steps (20): the replay would never hold one minibatch"),
        ({"train_freq": 5000}, {}, "train.train_freq", "5000 environment steps between training phases pass total_steps (1000): the run would play 5000 steps"),
        ({"train_freq": 1000}, {"env": {"num_envs": 3}}, "train.train_freq", "1000 environment steps between training phases (whole steps of env.num_envs 3: 1002) pass"),
        ({"train_freq": 1000}, {"distributed": {}}, "train.train_freq", "1000 transitions per 1 update (gradient_steps): the Ape-X learner earns its updates from the transitions after learning_starts, and total_steps - learning_starts = 900 earn none"),
        ({"learning_starts": 1000}, {"distributed": {}}, "train.learning_starts", "1000 is not below total_steps (1000)"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_a_dqn_that_would_end_without_a_gradient_step_is_refused(tmp_path: Path, train: dict, changes: dict, key: str, says: str) -> None:
    """`learning_starts >= total_steps` ran to `done` with an empty td_loss column; a train_freq past
    the budget played it several times over for one training phase, and earned an Ape-X learner none."""
    assert f": {key}: {says}" in refused(tmp_path, {"algo": "dqn", **changes}, key, train={**DQN_TRAIN, **train})
    apex = config_with_train(tmp_path, {"algo": "dqn", "distributed": {}}, {**DQN_TRAIN, "train_freq": 1000, "gradient_steps": 2})
    assert load_experiment(apex).train.train_freq == 1000  # 900 transitions after learning_starts earn one update


@pytest.mark.parametrize(
    ("train", "changes", "says"),
    [
        ({"num_minibatches": 3}, {}, "3 does not divide the rollout (num_steps x env.num_envs = 64 x 2 = 128 transitions); the update would take 3 minibatches of 42 transitions and one of 2: use a divisor of 128, such as 2 or 4"),
        ({"num_minibatches": 1000}, {}, "1000 does not divide the rollout (num_steps x env.num_envs = 64 x 2 = 128 transitions); the update would take 128 minibatches of 1 transition: use a divisor of 128, such as 128"),
        ({"num_minibatches": 4, "recurrent_size": 8}, {"env": {"num_envs": 6}}, "4 does not divide env.num_envs (6): a recurrent policy's minibatches are whole env sequences of the rollout; the update would take 6 minibatches of 1 env: use a divisor of 6, such as 3 or 6"),
        ({"num_minibatches": 3}, {"resources": {"ranks": 2}}, "3 does not divide each rank's rollout (num_steps x env.num_envs = 64 x 2 = 128 transitions)"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_minibatches_that_do_not_divide_the_rollout_are_refused(tmp_path: Path, train: dict, changes: dict, says: str) -> None:
    """PPO cut a count that does not divide into other sizes: 3 of 256 transitions trained on 85, 85,
    85 and 1, 1000 on 256 of one each. DD-PPO's ranks each split their own rollout of env.num_envs envs."""
    assert f": train.num_minibatches: {says}" in refused(tmp_path, {**changes, "train": train}, "train.num_minibatches")
    for ok in ({"train": {"num_minibatches": 128}}, {"env": {"num_envs": 4}, "train": {"num_minibatches": 4, "recurrent_size": 8}}):
        code, stderr = sweep(write_config(tmp_path, ok))
        assert code == 0, stderr


def test_a_grid_point_whose_values_do_not_split_its_rollout_is_refused(tmp_path: Path) -> None:
    """Each value splits the base config's rollout (2 envs x 64 steps); 3 envs with 128 minibatches do not."""
    grid = {"env.num_envs": [2, 3], "train.num_minibatches": [2, 128]}
    stderr = refused(tmp_path, {"sweep": {"seeds": [0], "grid": grid}}, "sweep: the grid point env.num_envs=3, train.num_minibatches=128: train.num_minibatches: 128 does not divide")
    assert "192 transitions" in stderr, stderr
    code, stderr = sweep(write_config(tmp_path, {"sweep": {"seeds": [0], "grid": {"env.num_envs": [2, 4], "train.num_minibatches": [2, 128]}}}))
    assert code == 0, stderr


@pytest.mark.parametrize(
    ("changes", "key", "says"),
    [
        ({"train": {"hidden_sizes": [32768, 32768]}, "resources": {"mem": "2G"}}, "train.hidden_sizes", "the hidden layers alone hold 1,073,741,824 weights, 4.0 GiB in float32: more than resources.mem (2G)"),
        ({"train": {"hidden_sizes": [64], "recurrent_size": 65536}}, "train.recurrent_size", "the hidden layers and the GRU core alone hold 12,897,484,800 weights, 48.0 GiB"),
        ({"algo": "alphazero", "env": {"backend": "game", "id": "hpcrl.games.tictactoe:TicTacToe", "num_envs": 1}}, "train.hidden_sizes", "4,294,967,296 weights, 16.0 GiB"),
        ({"sweep": {"seeds": [0], "grid": {"train.hidden_sizes": [[64, 64], [65536, 8192]]}}}, "sweep: the grid point train.hidden_sizes=[65536, 8192]: train.hidden_sizes", "536,870,912 weights, 2.0 GiB"),
        ({"sweep": {"seeds": [0], "search": {"method": "random", "samples": 2, "space": {"train.recurrent_size": {"type": "int", "low": 8, "high": 65536}}}}}, "sweep.search.space.train.recurrent_size=65536: train.recurrent_size", "48.0 GiB"),
        ({"sweep": {"seeds": [0], "search": {"method": "random", "samples": 2, "space": {"train.hidden_sizes": {"type": "choice", "values": [[64], [65536, 65536]]}}}}}, "sweep.search.space.train.hidden_sizes.values=[65536, 65536]: train.hidden_sizes", "16.0 GiB"),
    ],
    ids=["hidden", "recurrent", "alphazero", "grid", "search-range", "search-choice"],
)
def test_a_network_whose_hidden_layers_alone_outgrow_the_job_s_memory_is_refused(tmp_path: Path, changes: dict, key: str, says: str) -> None:
    """hidden_sizes of two 65,536-wide layers passed each width's bound, and the job then made 16 GiB of weights
    (orthogonally initialised on the CPU) in a job that asked for 1G, after its wait in the queue. The weights
    between hidden layers are a floor under the network's size that needs no env: past resources.mem, one line."""
    train = {"hidden_sizes": [65536, 65536]} if changes.get("algo") == "alphazero" else None  # its whole train section
    stderr = refused(tmp_path, {"resources": {"mem": "1G"}, **changes}, key, train=train)
    assert says in stderr and "narrow them, or raise resources.mem" in stderr, stderr


def test_a_network_that_fits_resources_mem_or_has_no_hidden_layers_to_count_is_accepted(tmp_path: Path) -> None:
    """The floor counts only what the config sizes: the same layers with the memory for them pass, a resnet (whose
    hidden_sizes go unused) passes, and so does a config on disk whose rules came later (it must load for status)."""
    for changes in (
        {"train": {"hidden_sizes": [32768, 32768]}, "resources": {"mem": "4G"}},
        {"train": {"hidden_sizes": [65536]}, "resources": {"mem": "1G"}},  # one layer: nothing between layers to count
    ):
        code, stderr = sweep(write_config(tmp_path, changes))
        assert code == 0, (changes, stderr)
    game = {"algo": "alphazero", "env": {"backend": "game", "id": "hpcrl.games.tictactoe:TicTacToe", "num_envs": 1}, "resources": {"mem": "1G"}}
    code, stderr = sweep(config_with_train(tmp_path, game, {"network": "resnet", "hidden_sizes": [65536, 65536]}))
    assert code == 0, stderr
    with stored_configs():
        stored = experiment_from_dict({**deep_update(TINY, {"resources": {"mem": "1G"}}), "train": {**TINY["train"], "hidden_sizes": [65536, 65536]}})
    assert stored.train.hidden_sizes == [65536, 65536]


@pytest.mark.parametrize("method", ["random", "optuna"])
def test_a_search_space_with_counts_that_do_not_split_the_rollout_is_refused(tmp_path: Path, method: str) -> None:
    """A random search drew them into its runs, an Optuna study into trials that failed in its workers."""
    search = {"method": method, "samples" if method == "random" else "n_trials": 4, "space": {"train.num_minibatches": {"type": "int", "low": 1, "high": 8}}}
    with pytest.raises(ConfigError, match=r": sweep.search.space.train.num_minibatches=3 \(of 1..8\): train.num_minibatches: 3 does not divide the rollout") as err:
        load_experiment(write_config(tmp_path, {"sweep": {"seeds": [0], "search": search}}))
    assert len(err.value.lines) == 1
    search["space"] = {"env.num_envs": {"type": "int", "low": 2, "high": 4}}  # a recurrent policy's 2 minibatches: 3 envs do not split
    with pytest.raises(ConfigError, match=r"sweep.search.space.env.num_envs=3 \(of 2..4\): train.num_minibatches: 2 does not divide env.num_envs \(3\)"):
        load_experiment(write_config(tmp_path, {"train": {"recurrent_size": 8}, "sweep": {"seeds": [0], "search": search}}))
    search["space"] = {"train.num_minibatches": {"type": "choice", "values": [1, 2, 4, 8]}}
    assert load_experiment(write_config(tmp_path, {"sweep": {"seeds": [0], "search": search}})).sweep.search is not None


def test_a_random_search_whose_draws_do_not_go_together_names_the_point_it_drew(tmp_path: Path) -> None:
    """Each value is checked alone (and over its range); two drawn apart can still clash. 3 envs passed, and so did
    2 minibatches, but a recurrent policy's 2 minibatches do not split 3 envs: the sweep said so without the file
    or the search, as if the config itself set those values. Now the line names both, and nothing is written."""
    space = {"env.num_envs": {"type": "int", "low": 2, "high": 4}, "train.num_minibatches": {"type": "choice", "values": [1, 2]}}
    changes = {"env": {"num_envs": 2}, "train": {"recurrent_size": 8, "num_minibatches": 1}, "sweep": {"seeds": [0], "search": {"method": "random", "samples": 12, "seed": 0, "space": space}}}
    for dry_run in (True, False):
        stderr = refused(tmp_path, changes, "sweep.search: the point env.num_envs=3,train.num_minibatches=2: train.num_minibatches: 2 does not divide env.num_envs (3)", dry_run=dry_run)
        assert stderr.startswith(f"hpcrl: error: {tmp_path / 'config.yaml'}: sweep.search: "), stderr


def test_an_experiment_written_before_the_request_rules_still_loads_and_a_new_sweep_of_it_is_refused(tmp_path: Path) -> None:
    """A sweep of an older hpcrl wrote runs whose config breaks a rule added since (3 minibatches of a 128-transition
    rollout): status and collect still read the experiment, as its jobs in flight do; sweeping the config anew is refused."""
    from hpcrl.config.build import stored_configs
    from hpcrl.store.expdir import load_experiment_config, load_runs, write_experiment

    config = write_config(tmp_path, {"train": {"num_minibatches": 3}})
    with stored_configs():  # as the older hpcrl built it
        exp = load_experiment(config)
        experiment = write_experiment(exp, expand(exp), {})
    assert [run.config.train.num_minibatches for run in load_runs(experiment)] == [3, 3]
    assert load_experiment_config(experiment)[0].train.num_minibatches == 3
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert main(["status", str(experiment)]) == 0, err.getvalue()
    assert "2 runs" in out.getvalue()
    with pytest.raises(ConfigError, match="train.num_minibatches: 3 does not divide the rollout"):
        load_experiment(config)


def test_a2c_keeps_the_bounds_of_the_fields_whose_defaults_it_changes(tmp_path: Path) -> None:
    refused(tmp_path, {"algo": "a2c"}, "train.lr", train={"lr": -1})
    refused(tmp_path, {"algo": "a2c"}, "train.gae_lambda", train={"gae_lambda": 2})
    refused(tmp_path, {"algo": "a2c"}, "train.num_steps", train={"num_steps": 0})


# ---------------------------------------------------------------------------- item 15: names


@pytest.mark.parametrize("name", ["1.10", "0x1f", "1:30", "1e3", "007"])
def test_name_is_taken_as_typed_and_must_start_with_a_letter(tmp_path: Path, name: str) -> None:
    stderr = refused(tmp_path, {}, "name", "--name", name, dry_run=False)
    assert repr(name) in stderr and "start with a digit" in stderr


def test_name_option_is_never_read_as_yaml(tmp_path: Path) -> None:
    for name in ["v1.10", "yes", "null", "x1_30"]:  # YAML would read the middle two as True and None
        assert load_experiment(write_config(tmp_path), name=name).name == name
        code, stderr = sweep(write_config(tmp_path), "--name", name)
        assert code == 0, stderr
    stderr = refused(tmp_path, {}, "name", "--name", "[1, 2]")
    assert "'[1, 2]'" in stderr


def test_numbers_in_string_fields_keep_their_text(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(write_config(tmp_path).read_text() + "image: {python: 3.10}\n")
    text = config.read_text().replace("resources:\n", "resources:\n  account: 0x1f\n  partition: 1.10\n")
    config.write_text(text)
    exp = load_experiment(config, ["resources.queue=1:30"])
    assert (exp.resources.account, exp.resources.partition, exp.resources.queue) == ("0x1f", "1.10", "1:30")
    assert exp.image is not None and exp.image.python == "3.10"
    assert load_experiment(config, ["name=v1.10"]).name == "v1.10"


# ---------------------------------------------------------------------------- item 16: one line, exit 2


def test_a_config_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    config.write_bytes(config.read_bytes().replace(b"tiny", b"t\xe9ny"))
    code, stderr = sweep(config)
    assert code == 2 and stderr.count("\n") == 1 and "not UTF-8" in stderr and "offset" in stderr, stderr


def hpcrl_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """`hpcrl ARGV` in a process of its own, bounded in time and memory: a read that never ends fails the test, not the machine."""

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 * 2**30, 4 * 2**30))

    return subprocess.run([sys.executable, "-m", "hpcrl", *argv], capture_output=True, text=True, timeout=60, preexec_fn=limit_memory)


def test_a_config_path_that_is_not_a_regular_file_is_one_line(tmp_path: Path) -> None:
    """`hpcrl sweep /dev/zero` read until memory ran out; a FIFO blocked the sweep until a writer came."""
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a device"), (tmp_path, "a directory")):
        proc = hpcrl_cli("sweep", str(path), "--dry-run", "--scheduler", "slurm")
        assert proc.returncode == 2 and proc.stderr == f"hpcrl: error: {path}: not a regular file ({kind}): give the path of a YAML config file\n", proc.stderr


def test_a_config_larger_than_a_config_can_be_is_refused_unread(tmp_path: Path) -> None:
    config = tmp_path / "big.yaml"
    with config.open("wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)
    code, stderr = sweep(config)
    assert code == 2 and stderr.count("\n") == 1 and "larger than a config file can be (10 MB)" in stderr, stderr


def test_a_name_too_long_for_a_directory_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, {"name": "a" * (MAX_NAME + 1)}, "name", dry_run=False)
    code, stderr = sweep(write_config(tmp_path, {"name": "a" * MAX_NAME}))
    assert code == 0, stderr


def test_output_pointing_at_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    for output in [tmp_path / "afile", tmp_path / "afile" / "below"]:
        code, stderr = sweep(write_config(tmp_path, {"output": str(output)}), dry_run=False)
        assert code == 2 and stderr.count("\n") == 1 and ": output: " in stderr and "is a file" in stderr, stderr
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "tiny").write_text("")
    code, stderr = sweep(write_config(tmp_path), dry_run=False)
    assert code == 2 and ": name: " in stderr and "is a file" in stderr, stderr
    assert (tmp_path / "logs" / "tiny").read_text() == ""


def test_a_directory_that_is_not_an_experiment_is_not_taken_over(tmp_path: Path) -> None:
    """A sweep into `<output>/<name>` holding a user's own files wrote its results over them."""
    taken = tmp_path / "logs" / "tiny"
    (taken / "results").mkdir(parents=True)
    (taken / "results" / "summary.csv").write_text("mine\n")
    config = write_config(tmp_path)
    for dry_run in (True, False):
        code, stderr = sweep(config, dry_run=dry_run)
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert f": name: {taken} exists and is not an hpcrl experiment (it holds results): a sweep would write over it; pick another name or output" in stderr, stderr
    assert sorted(p.relative_to(taken).as_posix() for p in taken.rglob("*")) == ["results", "results/summary.csv"]
    (taken / "runs.csv").write_text("")  # an experiment: a sweep again resubmits what is missing
    assert sweep(config)[0] == 0
    shutil.rmtree(taken)
    # What a first sweep that submitted nothing leaves there, or one at work this moment (before its runs.csv: its
    # lock is what refuses a second sweep, tests/submit/test_sweep_submission.py), and hpcrl.io's temporary file.
    assert SWEEP_FIRST == ("jobs", "optuna", "experiment.yaml")
    (taken / "jobs").mkdir(parents=True)
    (taken / "optuna").mkdir()
    (taken / "experiment.yaml").write_text("config: {}\n")
    (taken / ".experiment.yaml.1a2b.tmp").write_text("")
    assert sweep(config)[0] == 0
    shutil.rmtree(taken)
    (taken / "runs" / "0123456789-s0").mkdir(parents=True)  # run directories only: an experiment's, or laid out for its sweep
    assert sweep(config)[0] == 0
    shutil.rmtree(taken)
    (taken / "runs" / "mine").mkdir(parents=True)
    assert "exists and is not an hpcrl experiment (it holds runs)" in sweep(config)[1]


def test_an_output_longer_than_a_file_name_can_be_is_one_line(tmp_path: Path) -> None:
    """A traceback from `exists()` (OSError: File name too long), or, below a directory that does not exist, from the first mkdir."""
    for output in (tmp_path / ("a" * 300), tmp_path / "new" / ("a" * 300)):
        code, stderr = sweep(write_config(tmp_path, {"output": str(output)}))
        assert code == 2 and stderr.count("\n") == 1 and f": output: cannot use {output}/tiny (File name too long)" in stderr, stderr


# ---------------------------------------------------------------------------- item 17: limits


def test_a_huge_grid_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    grid = {"train.lr": [round(0.001 + i * 1e-6, 9) for i in range(1000)], "train.gamma": [round(0.5 + i * 1e-4, 6) for i in range(1000)]}
    start = time.perf_counter()
    stderr = refused(tmp_path, {"sweep": {"seeds": [0], "grid": grid}}, "sweep.grid", dry_run=False)
    assert time.perf_counter() - start < 10
    assert f"{10**6:,} runs" in stderr and f"{MAX_RUNS:,}" in stderr
    refused(tmp_path, {"sweep": {"seeds": list(range(1000)), "grid": {"train.lr": grid["train.lr"][:101]}}}, "sweep.grid")


def billion_laughs(depth: int = 9) -> str:
    lines = ["name: tiny", "env:", "  kwargs:", '    l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, depth):
        refs = ", ".join([f"*l{i - 1}"] * 9)
        lines.append(f"    l{i}: &l{i} [{refs}]")
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_without_expanding_it(tmp_path: Path) -> None:
    config = tmp_path / "bomb.yaml"
    config.write_text(billion_laughs())
    tracemalloc.start()
    try:
        code, stderr = sweep(config, dry_run=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2 and stderr.count("\n") == 1 and "line " in stderr and "expands to more than" in stderr, stderr
    assert peak < 50 * 2**20
    assert not (tmp_path / "logs").exists()


def test_small_anchors_and_merge_keys_still_work(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    grid = "sweep:\n  seeds: [0]\n  grid:\n    train: [&base {lr: 0.01, gamma: 0.9}, {<<: *base, lr: 0.02}]\n"
    config.write_text(config.read_text().replace("sweep:\n  seeds:\n  - 0\n  - 1\n", grid))
    exp = load_experiment(config)
    assert exp.sweep.grid == {"train": [{"lr": 0.01, "gamma": 0.9}, {"lr": 0.02, "gamma": 0.9}]}
    config.write_text(billion_laughs(3))
    assert load_experiment(config).env.kwargs["l2"][0][0] == ["lol"] * 9


def test_duplicate_yaml_keys_are_refused_with_their_line(tmp_path: Path) -> None:
    config = tmp_path / "dup.yaml"
    data = yaml.safe_load(write_config(tmp_path).read_text())
    config.write_text(yaml.safe_dump(data, sort_keys=False) + "train:\n  lr: 0.1\n")
    code, stderr = sweep(config, dry_run=False)
    first = next(i for i, line in enumerate(config.read_text().splitlines(), 1) if line.startswith("train:"))
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert f"duplicate key 'train' (first on line {first})" in stderr and f"line {len(config.read_text().splitlines()) - 1}:" in stderr
    config.write_text("name: tiny\ntrain: {lr: 0.1, lr: 0.2}\n")
    with pytest.raises(ConfigError, match="line 2: malformed YAML: duplicate key 'lr'"):
        load_experiment(config)


def test_an_override_sets_a_mapping_as_given_while_a_grid_point_merges(tmp_path: Path) -> None:
    """`-p env.kwargs={...}` replaces the mapping (as habitat configs swap `episodes` for `scene`)."""
    config = write_config(tmp_path, {"env": {"kwargs": {"sutton_barto_reward": True}}})
    assert load_experiment(config, ["env.kwargs={}"]).env.kwargs == {}
    runs = expand(load_experiment(config, ["sweep.grid={env.kwargs: [{}]}", "sweep.seeds=[0]"]))
    assert [r.config.env.kwargs for r in runs] == [{"sutton_barto_reward": True}]


# ---------------------------------------------------------------------------- issue 16: DD-PPO ranks

OPTUNA = {"method": "optuna", "n_trials": 2, "space": {"train.lr": {"type": "loguniform", "low": 1e-4, "high": 1e-2}}}


@pytest.mark.parametrize(
    "changes,key,words",
    [
        ({"resources": {"ranks": 2, "nodes": 4}}, "resources.nodes", "at most one node per rank"),
        ({"resources": {"ranks": 3, "nodes": 2}}, "resources.ranks", "multiple of resources.nodes (2)"),
        ({"resources": {"ranks": 2, "gpus": 1}}, "resources.gpus", "2 ranks per node need gpus: 2, got 1"),
        ({"resources": {"ranks": 4, "nodes": 2, "gpus": 4}}, "resources.gpus", "2 ranks per node need gpus: 2, got 4"),
        ({"resources": {"ranks": 0}}, "resources.ranks", "[1, 4096], got 0"),
        ({"resources": {"ranks": -1}}, "resources.ranks", "[1, 4096], got -1"),
        ({"resources": {"ranks": "two"}}, "resources.ranks", "expected an integer, got 'two'"),
        ({"resources": {"ranks": 1e9}}, "resources.ranks", "[1, 4096], got 1000000000"),
        ({"resources": {"ranks": 2}, "sweep": {"seeds": [0], "search": OPTUNA}}, "resources.ranks", "Optuna"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_ranks_that_no_job_can_run_are_refused(tmp_path: Path, changes: dict, key: str, words: str) -> None:
    assert words in refused(tmp_path, changes, key, "--scheduler", "slurm")


def test_more_than_one_rank_is_for_on_policy_algorithms(tmp_path: Path) -> None:
    stderr = refused(tmp_path, {"algo": "dqn", "resources": {"ranks": 2}}, "resources.ranks", train=DQN_TRAIN)
    assert "ppo and a2c" in stderr
    for algo in ("ppo", "a2c"):
        code, stderr = sweep(config_with_train(tmp_path, {"algo": algo, "resources": {"ranks": 2}}, {"total_steps": 1000}))
        assert code == 0, stderr


@pytest.mark.parametrize("scheduler", ["local", "sge"])
def test_several_nodes_per_run_are_refused_where_ranks_start_on_one_host(tmp_path: Path, scheduler: str) -> None:
    """Refused when the scripts are planned, before anything is written (and not only with --dry-run)."""
    for dry_run in (True, False):
        stderr = refused(tmp_path, {"resources": {"ranks": 2, "nodes": 2}}, "resources.nodes", "--scheduler", scheduler, dry_run=dry_run)
        assert f"2 nodes per run, but {scheduler} " in stderr
    code, stderr = sweep(write_config(tmp_path, {"resources": {"ranks": 4, "nodes": 2, "gpus": 2}}), "--scheduler", "slurm")
    assert code == 0, stderr  # srun spans the nodes of the allocation


# ---------------------------------------------------------------------------- issue 25: minor


@pytest.mark.parametrize(("written", "yaml_reads"), [("010", 8), ("0x10", 16), ("0b11", 3), ("1:30", 90), ("[0, 010]", 8), ("[0x10]", 16)])
def test_seeds_written_in_octal_or_hex_are_refused_not_read_as_another_count(tmp_path: Path, written: str, yaml_reads: int) -> None:
    """YAML 1.1 reads `seeds: 010` as 8 seeds and `0x10` as 16: refused in one line, in the file and
    as an override; a plain decimal count (underscores allowed) is what it says."""
    config = write_config(tmp_path)
    in_file = tmp_path / "in_file.yaml"
    in_file.write_text(config.read_text().replace("seeds:\n  - 0\n  - 1\n", f"seeds: {written}\n"))
    assert f"seeds: {written}\n" in in_file.read_text()
    for code, stderr in (sweep(in_file), sweep(config, f"sweep.seeds={written}")):
        assert_refused(tmp_path, code, stderr, "sweep.seeds")
        assert "expected a decimal number" in stderr and f"reads it as {yaml_reads})" in stderr, stderr
    assert [r.seed for r in expand(load_experiment(config, ["sweep.seeds=1_0"]))] == list(range(10))
    assert load_experiment(config, ["sweep.seeds=[10, 0]"]).sweep.seeds == [10, 0]


@pytest.mark.parametrize("output", ["/proc/hpcrl-x", "/sys/kernel"])
def test_an_output_no_directory_can_be_made_in_is_one_line(tmp_path: Path, output: str) -> None:
    """Issue 25 item 8: a place the user cannot write (another user's directory on a cluster) was a
    traceback from the first mkdir; now one line naming `output`, exit 2, from the CLI and the API."""
    from hpcrl import api

    config = write_config(tmp_path, {"output": output})
    code, stderr = sweep(config, dry_run=False)
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"hpcrl: error: {config}: output: cannot create {output}/tiny ("), stderr
    with pytest.raises(ConfigError, match=r": output: cannot create "):
        api.sweep(config, scheduler="local", out=io.StringIO())
    assert not Path(output, "tiny").exists()
    code, stderr = sweep(config)  # a dry run writes nothing and does not look
    assert code == 0, stderr
