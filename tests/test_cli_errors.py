"""What the system refuses reaches the user as one line, and changes nothing.

What a user relies on: a path too long for the file system, a file where hpcrl must make a folder, or
a binary file given as a Dockerfile gets `hpcrl: error: PATH: REASON` and a non-zero exit, never a
traceback; `hpcrl actor` on a run with no actors says so in one line. The in-job entry points keep
their tracebacks for an OSError, in the job's log, where it is a fault to find.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import write_config

from hpcrl.cli import main
from hpcrl.config.load import load_experiment
from hpcrl.store.expdir import write_experiment
from hpcrl.sweep.runs import expand

REPO = Path(__file__).resolve().parents[1]


def _one_line(argv: list[str], capsys: pytest.CaptureFixture[str], code: int = 1) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpcrl: error: ") and "Traceback" not in err, err
    return err


def _experiment(directory: Path) -> Path:
    """An experiment on disk, as a sweep writes it, with nothing run."""
    directory.mkdir(exist_ok=True)
    exp = load_experiment(write_config(directory))
    return write_experiment(exp, expand(exp), {})


@pytest.mark.parametrize("command", [["status"], ["collect"], ["cancel"]])
def test_a_path_too_long_for_the_file_system_is_one_line(command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    too_long = tmp_path / ("a" * 300)
    assert "File name too long" in _one_line([*command, str(too_long)], capsys)


def test_compare_into_a_file_is_one_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    experiment = _experiment(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    other = _experiment(tmp_path / "other")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert str(afile) in _one_line(["compare", str(experiment), str(other), "-o", str(afile)], capsys)
    assert afile.read_text() == "mine\n"
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_init_into_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    assert str(afile) in _one_line(["init", "starter", "--dir", str(afile)], capsys)
    assert afile.read_text() == "mine\n"


def test_a_binary_or_a_folder_as_dockerfile_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("spython")
    config = str(REPO / "configs" / "habitat_ppo.yaml")
    binary = tmp_path / "Dockerfile"
    binary.write_bytes(bytes(range(256)) * 8)
    assert "not UTF-8 text" in _one_line(["build-image", config, "--dry-run", "--from-dockerfile", str(binary)], capsys, code=2)
    assert "a directory" in _one_line(["build-image", config, "--dry-run", "--from-dockerfile", str(tmp_path)], capsys, code=2)


def test_an_actor_of_a_run_without_actors_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    experiment = _experiment(tmp_path)
    assert "has no distributed section" in _one_line(["actor", str(experiment), "--task", "0"], capsys, code=2)


def test_a_job_entry_keeps_the_traceback_of_an_os_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import hpcrl.stages as stages

    def refused(*args: object, **kwargs: object) -> int:
        raise PermissionError(13, "Permission denied", str(tmp_path / "x"))

    monkeypatch.setattr(stages, "evaluate", refused)
    with pytest.raises(PermissionError):
        main(["eval", str(tmp_path), "--task", "0"])


def test_a_sweep_without_a_config_asks_for_the_config_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """Overrides are optional: the usage error names only what is missing."""
    with pytest.raises(SystemExit) as stop:
        main(["sweep"])
    assert stop.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith("the following arguments are required: config")
