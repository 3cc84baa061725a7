"""The first commands a newcomer types (issue 38, point 6): `hpcrl --help` puts the user's commands
first and the in-job entry points apart, and a command missing its argument lists what exists."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hpcrl.cli import JOB_COMMANDS, USER_COMMANDS, main, parser
from hpcrl.starters import bundled


def test_help_lists_the_users_commands_first_and_the_in_job_entry_points_apart(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one line per command
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    commands, jobs = text.index("\ncommands:\n"), text.index("\nin-job entry points:\n")
    assert commands < jobs
    everything = (*USER_COMMANDS, *JOB_COMMANDS)
    listed = lambda part: [line.split()[0] for line in part.splitlines() if line.startswith("  ") and line.split()[0] in everything]
    assert listed(text[commands:jobs]) == list(USER_COMMANDS)
    assert listed(text[jobs:]) == list(JOB_COMMANDS)
    assert text.splitlines()[0] == "usage: hpcrl [-h] [--version] COMMAND ..."


def test_the_in_job_entry_points_stay_callable_and_described() -> None:
    choices = parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert sorted(choices) == sorted((*USER_COMMANDS, *JOB_COMMANDS))
    for name in JOB_COMMANDS:
        words = ["--since", "1764940000", "--status", "137"] if name == "end-leftovers" else ["logs/x", "--task", "1"]  # a job's last step, or a stage's task
        args = parser().parse_args([name, *words])
        assert args.command == name and choices[name].description, name
    assert all(choices[name].description for name in USER_COMMANDS)  # what the docs' CLI reference shows


@pytest.mark.parametrize("command", ["status", "collect", "cancel"])
def test_a_command_without_an_experiment_lists_the_experiments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([command]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "none under ./logs" in err and "usage:" not in err, err
    for name, runs, age in (("old", 2, 100), ("new", 1, 0)):
        (tmp_path / "logs" / name).mkdir(parents=True)
        (tmp_path / "logs" / name / "runs.csv").write_text("index,run_id,seed\n" + "".join(f"{i},abc-s{i},{i}\n" for i in range(runs)))
        os.utime(tmp_path / "logs" / name / "runs.csv", (time.time() - age, time.time() - age))
    (tmp_path / "logs" / "not-one").mkdir()
    assert main([command]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"hpcrl {command}: give an experiment directory, e.g. hpcrl {command} logs/new; these are under ./logs and here, newest sweep first:"
    assert [line.split()[:3] for line in lines[1:]] == [["logs/new", "1", "run,"], ["logs/old", "2", "runs,"]], lines


def test_init_without_a_name_lists_the_configs_it_starts_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["init"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("hpcrl init: give the new config's name: hpcrl init NAME [--from CONFIG]")
    assert [line.split()[0] for line in lines[1:]] == list(bundled())
    assert list(tmp_path.iterdir()) == []
