"""Habits a newcomer brings to a config (issue 38, point 6), each answered in the lines of one refusal:

- every problem of a config comes at once, one line each, rather than one per edit-and-rerun;
- `resources.mem: 32` is refused with the unit to write (Slurm reads a bare number as MB, most
  users mean GB); every memory key follows the one rule;
- Hydra's `train.lr=1e-3,3e-4` and `-m` name the `sweep.grid` key to write;
- a grid key written without its section (`lr`) or an algo misspelt in the grid gets a did-you-mean.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import write_config

from hpcrl.cli import main
from hpcrl.config.load import load_experiment
from hpcrl.config.resources_spec import parse_mem_mb
from hpcrl.config.schema import MAX_PROBLEMS, ConfigError


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The refusal's lines: exit 2, every line `hpcrl: error: ...`, no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert err.endswith("\n") and lines and all(line.startswith("hpcrl: error: ") for line in lines) and "Traceback" not in err, err
    return lines


def test_every_problem_of_a_config_comes_in_one_refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three sections with a problem each, a misspelt key and two bad overrides: six lines, each
    naming the file and its key, in one run (before: the first line only)."""
    config = write_config(tmp_path, {"train": {"lr": "fast", "gamma": 5}, "resources": {"cpus": 0}, "eval": {"episods": 3}})
    lines = refused(["sweep", str(config), "--scheduler", "local", "--dry-run", "train.lrr=1", "env.num_envs=-1"], capsys)
    keys = ["-p train.lrr: unknown key (did you mean train.lr?)", "env.num_envs: expected", "resources.cpus: expected", "eval.episods: unknown key",
            "train.lr: expected a number, got 'fast'", "train.gamma: expected a number in [0, 1]"]  # fmt: skip
    assert len(lines) == len(keys), lines
    for key in keys:
        assert sum(f"hpcrl: error: {config}: {key}" in line for line in lines) == 1, (key, lines)
    assert not (tmp_path / "logs").exists()


def test_every_bad_grid_key_and_value_comes_in_one_refusal(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"sweep": {"grid": {"train.lrr": [1], "resources.cpus": [1, 2], "train.gamma": [0.9, 5, 7]}}})
    with pytest.raises(ConfigError) as err:
        load_experiment(config)
    lines = err.value.lines
    assert [line.split(": ")[1] for line in lines] == ["sweep.grid.train.lrr", "sweep.grid.resources.cpus"], lines  # keys first
    config = write_config(tmp_path, {"sweep": {"grid": {"train.gamma": [0.9, 5, 7]}}})
    with pytest.raises(ConfigError) as err:
        load_experiment(config)
    assert [line.split(": ")[1] for line in err.value.lines] == ["sweep.grid.train.gamma=5", "sweep.grid.train.gamma=7"], err.value.lines


def test_a_config_with_very_many_problems_stays_short(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"train": {f"nope{i}": 1 for i in range(40)}})
    with pytest.raises(ConfigError) as err:
        load_experiment(config)
    lines = err.value.lines
    assert len(lines) == MAX_PROBLEMS and lines[-1] == f"... and {40 - MAX_PROBLEMS + 1} more problems", lines


@pytest.mark.parametrize("key", ["resources.mem", "distributed.actor_mem", "image.build_mem"])
def test_a_memory_size_without_its_unit_is_refused_with_the_unit_to_write(tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str) -> None:
    """`mem: 32` was 32 MB on every scheduler (`--mem=32M`), a job that dies at its first import."""
    lines = refused(["sweep", str(write_config(tmp_path)), "--scheduler", "local", "--dry-run", f"{key}=32"], capsys)
    assert lines == [f"hpcrl: error: {tmp_path / 'config.yaml'}: {key}: 32 has no unit (Slurm would read 32 MB): write 32G for gigabytes or 32M for megabytes"]


@pytest.mark.parametrize("text,mb", [("32G", 32768), ("32GB", 32768), ("32GiB", 32768), ("500M", 500), ("1.5T", 1572864), ("4 g", 4096)])
def test_a_memory_size_with_its_unit_reads_as_both_schedulers_do(text: str, mb: int) -> None:
    assert parse_mem_mb(text) == mb


@pytest.mark.parametrize("text", ["32", "0.5", "32B", "0G", "G", "-4G"])
def test_a_memory_size_without_a_unit_or_positive_number_is_no_size(text: str) -> None:
    with pytest.raises(ValueError):
        parse_mem_mb(text)


@pytest.mark.parametrize(
    "words,expected",
    [
        (["train.lr=1e-3,3e-4"], "-p train.lr=1e-3,3e-4: Hydra's sweep syntax; hpcrl sweeps the lists in sweep.grid: write sweep.grid.train.lr=[1e-3,3e-4]"),
        (["train.lr=choice(1e-3,3e-4)"], "write sweep.grid.train.lr=[1e-3,3e-4]"),
        (["env.id=CartPole-v1,Acrobot-v1"], "write sweep.grid.env.id=[CartPole-v1,Acrobot-v1]"),
        (["algo=ppo,a2c"], "write sweep.grid.algo=[ppo,a2c]"),
        (["-m", "train.lr=1e-3,3e-4"], "hpcrl: error: -m: Hydra's multirun; hpcrl sweeps the lists in sweep.grid, without -m: write sweep.grid.train.lr=[1e-3,3e-4]"),
        (["--multirun", "train.lr=1e-3,3e-4", "train.gamma=0.9,0.99"], "write sweep.grid.train.lr=[1e-3,3e-4] sweep.grid.train.gamma=[0.9,0.99]"),
    ],
)
def test_hydra_sweep_syntax_names_the_grid_key_to_write(tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str], expected: str) -> None:
    lines = refused(["sweep", str(write_config(tmp_path)), "--scheduler", "local", "--dry-run", *words], capsys)
    assert len(lines) == 1 and expected in lines[0], lines


def test_a_comma_stays_a_comma_where_a_key_takes_free_text(tmp_path: Path) -> None:
    """A program's parameter may be `--gpus 0,1`; a key that cannot be swept keeps its own error."""
    config = tmp_path / "program.yaml"
    config.write_text(f"name: p\nalgo: program\noutput: {tmp_path}\nprogram:\n  command: [python, t.py]\n")
    assert load_experiment(config, ["program.params.gpus=0,1"]).program.params["gpus"] == "0,1"
    with pytest.raises(ConfigError, match=r"resources.cpus: expected an integer, got '1,2'"):
        load_experiment(write_config(tmp_path), ["resources.cpus=1,2"])


@pytest.mark.parametrize(
    "grid,expected",
    [
        ({"lr": [1e-3]}, "sweep.grid.lr: unknown key (did you mean train.lr?)"),
        ({"num_env": [2]}, "sweep.grid.num_env: unknown key (did you mean env.num_envs?)"),
        ({"algo": ["ppoo", "a2c"]}, "got 'ppoo' (did you mean 'ppo'?)"),
    ],
)
def test_a_grid_key_without_its_section_names_the_key(tmp_path: Path, grid: dict, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_experiment(write_config(tmp_path, {"sweep": {"grid": grid}}))
    assert expected in str(err.value), err.value


def test_a_key_in_the_wrong_section_names_where_it_goes(tmp_path: Path) -> None:
    """`seeds: 5` at the top, `lr` without `train:`, `num_envs` under `train:`: each line names the key's place."""
    config = write_config(tmp_path, {"seeds": 5, "lr": 1e-3, "train": {"num_envs": 4}})
    with pytest.raises(ConfigError) as err:
        load_experiment(config)
    lines = err.value.lines
    for key, hint in (("seeds", "did you mean sweep.seeds"), ("lr", "did you mean train.lr?"), ("train.num_envs", "did you mean env.num_envs?")):
        assert sum(line.startswith(f"{config}: {key}: unknown key ({hint}") for line in lines) == 1, (key, lines)
