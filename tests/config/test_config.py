"""Config validation: every bad input is one line naming the file and key, exit 2, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from factories import write_config

from hpcrl.config.load import load_experiment
from hpcrl.config.schema import ConfigError

REPO = Path(__file__).resolve().parents[2]


def hpcrl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcrl", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


BAD = [
    ({"trian": {}}, "trian: unknown key"),
    ({"train": {"lr": "fast"}}, "train.lr: expected a number, got 'fast'"),
    ({"train": {"total_steps": "many"}}, "train.total_steps: expected an integer"),
    ({"train": {"num_steps": 0}}, "train.num_steps: expected a positive integer"),
    ({"env": {"num_envs": 2.5}}, "env.num_envs: expected an integer"),
    ({"env": {"backend": "mujoco"}}, "env.backend: expected one of"),
    ({"algo": "sac"}, "algo: expected one of"),
    ({"resources": {"gpus": -1}}, "resources.gpus"),
    ({"resources": {"cpus": 100000}}, "resources.cpus"),
    ({"resources": {"mem": "lots"}}, "resources.mem: expected a memory size"),
    ({"resources": {"time": "90 minutes"}}, "resources.time: expected a time limit"),
    ({"resources": {"time": "00:01:00", "signal_seconds": 120}}, "resources.signal_seconds: must be shorter"),
    ({"resources": {"extra": ["--x\necho owned"]}}, "resources.extra[0]: a directive must be a single line"),
    ({"container": {"env": {"BAD-NAME": "x"}}}, "container.env.BAD-NAME: expected an environment variable name"),
    ({"sweep": {"grid": {"train.lrr": [1, 2]}}}, "sweep.grid.train.lrr: unknown key"),
    ({"sweep": {"grid": {"train.lr": [1e-3, "fast"]}}}, "sweep.grid.train.lr='fast': train.lr: expected a number"),
    ({"sweep": {"seeds": [1, 1]}}, "sweep.seeds: seeds repeat"),
    ({"name": "../escape"}, "name: expected a letter"),
    ({"train": {"batch_size": 5}}, "train.batch_size: unknown key"),
]


@pytest.mark.parametrize("changes,message", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_bad_config_is_rejected_with_key_path(tmp_path: Path, changes: dict, message: str) -> None:
    path = write_config(tmp_path, changes)
    with pytest.raises(ConfigError) as err:
        load_experiment(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ") and message in text
    assert "\n" not in text


def test_cli_rejects_bad_input_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    cases = [
        [str(write_config(tmp_path, {"train": {"lr": "fast"}}, "a.yaml"))],
        [str(tmp_path / "missing.yaml")],
        [str(write_config(tmp_path, {}, "b.yaml")), "-p", "train.nope=1"],
        [str(write_config(tmp_path, {}, "c.yaml")), "-p", "train.lr=fast"],
        [str(write_config(tmp_path, {"resources": {"gpus": 99}}, "d.yaml"))],
    ]
    (tmp_path / "broken.yaml").write_text("name: x\ntrain: [1, 2\n")
    cases.append([str(tmp_path / "broken.yaml")])
    expected = ["train.lr: expected a number", "no such file", "-p train.nope: unknown key", "train.lr: expected a number", "resources.gpus", "line 3: malformed YAML"]
    for argv, message in zip(cases, expected):
        proc = hpcrl("sweep", *argv, "--scheduler", "local", cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "logs").exists()


def test_overrides_are_typed_like_the_field(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    exp = load_experiment(path, ["train.lr=3e-4", "env.num_envs=4", "train.hidden_sizes=[8, 8]", "eval.threshold=100", "env.kwargs.render_mode=rgb_array"])
    assert exp.train.lr == pytest.approx(3e-4) and isinstance(exp.train.lr, float)
    assert exp.env.num_envs == 4 and exp.train.hidden_sizes == [8, 8]
    assert exp.eval.threshold == 100.0 and exp.env.kwargs == {"render_mode": "rgb_array"}


def test_algo_selects_its_hyperparameters(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"algo": "dqn"})
    data = yaml.safe_load(path.read_text())
    data["train"] = {"total_steps": 1000, "buffer_size": 500, "batch_size": 32, "learning_starts": 100}
    path.write_text(yaml.safe_dump(data))
    exp = load_experiment(path)
    assert type(exp.train).__name__ == "DQNConfig" and exp.train.buffer_size == 500
    data["train"] = {"num_minibatches": 2}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match="train.num_minibatches: unknown key"):
        load_experiment(path)


def test_shipped_configs_load() -> None:
    for path in sorted((REPO / "configs").glob("*.yaml")):
        load_experiment(path)
