"""The habits users bring (issue 18): did-you-mean on unknown keys, seed counts and ranges.

What a user relies on:
- a typo in a key names the closest known keys, in the one line with exit 2 (in a file, in `-p`,
  in the grid);
- `sweep.seeds: 5` is seeds 0..4 and `"10..19"` an inclusive range, giving the same runs (and run
  ids) as the list written out; a count of 0, -1 or 10^9, a reversed range or a bad string is one
  line and exit 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from factories import write_config

from hpcrl.cli import main
from hpcrl.config import load_experiment
from hpcrl.sweep import expand


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "override,expected",
    [
        ("train.lrr=1e-3", "-p train.lrr: unknown key (did you mean train.lr?)"),
        ("trian.lr=1e-3", "-p trian.lr: unknown key (did you mean train.lr?)"),
        ("env.num_env=3", "-p env.num_env: unknown key (did you mean env.num_envs?)"),
        ("sweep.grid={train.gamm: [0.9, 0.99]}", "sweep.grid.train.gamm: unknown key (did you mean train.gamma"),
        ("zzzz=1", "-p zzzz: unknown key\n"),  # nothing close: no guess
    ],
)
def test_an_unknown_key_names_the_closest_known_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, expected: str) -> None:
    err = _refused(["sweep", str(write_config(tmp_path)), "--scheduler", "local", "--dry-run", "-p", override], capsys)
    assert expected in err, err


def test_a_typo_in_the_file_names_the_closest_key_of_its_section(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _refused(["sweep", str(write_config(tmp_path, {"train": {"lrr": 1e-3}})), "--scheduler", "local", "--dry-run"], capsys)
    assert "train.lrr: unknown key (did you mean train.lr? expected one of: " in err, err


@pytest.mark.parametrize("short,listed", [(5, [0, 1, 2, 3, 4]), ("10..12", [10, 11, 12]), (" 7 .. 7 ", [7]), (1, [0])])
def test_a_seed_count_or_range_is_the_list_it_stands_for(tmp_path: Path, short: object, listed: list[int]) -> None:
    written = expand(load_experiment(write_config(tmp_path, {"sweep": {"seeds": listed}}, name="listed.yaml")))
    shorthand = expand(load_experiment(write_config(tmp_path, {"sweep": {"seeds": short}}, name="short.yaml")))
    assert [r.seed for r in shorthand] == listed
    assert [r.run_id for r in shorthand] == [r.run_id for r in written]  # run ids of existing experiments do not change
    from_cli = expand(load_experiment(write_config(tmp_path, name="cli.yaml"), [f"sweep.seeds={yaml.safe_dump(short).splitlines()[0]}"]))
    assert [r.run_id for r in from_cli] == [r.run_id for r in written]


@pytest.mark.parametrize(
    "value,expected",
    [
        ("0", "sweep.seeds: a count of seeds is 1..100,000, got 0"),
        ("-1", "sweep.seeds: a count of seeds is 1..100,000, got -1"),
        ("1000000000", "sweep.seeds: a count of seeds is 1..100,000, got 1000000000"),
        ("12..10", "sweep.seeds: a range of seeds is LOW..HIGH with LOW <= HIGH"),
        ("0..4294967296", "sweep.seeds: a range of seeds is LOW..HIGH"),
        ("0..200000", "sweep.seeds: a range of seeds is LOW..HIGH"),
        ("a..b", "sweep.seeds: expected a list of seeds, a count (5) or a range ('10..19'), got 'a..b'"),
        ("1e9", "sweep.seeds: expected a list of seeds, a count (5) or a range"),
        ("2.5", "sweep.seeds: expected a list, got 2.5"),
        ("true", "sweep.seeds: expected a list, got True"),
    ],
)
def test_a_bad_seed_count_or_range_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, expected: str) -> None:
    err = _refused(["sweep", str(write_config(tmp_path)), "--scheduler", "local", "-p", f"sweep.seeds={value}"], capsys)
    assert expected in err, err
    assert not (tmp_path / "logs").exists()
