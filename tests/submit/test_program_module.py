"""`command: [python, -m, MODULE]` whose interpreter cannot find MODULE is refused at sweep time (issue 37
item 17): swept from a shell whose `python` lacked rl_zoo3, every run failed after its queue wait."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

from hpcrl.cli import main
from hpcrl.config.load import experiment_from_dict
from hpcrl.submit.program_module import check_module


def config(tmp_path: Path, command: list[str], **container: str) -> Path:
    data = {"name": "m", "algo": "program", "output": str(tmp_path / "logs"), "sweep": {"seeds": [0]},
            "program": {"command": command, "workdir": str(tmp_path)}, **({"container": container} if container else {})}  # fmt: skip
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    return tmp_path / "c.yaml"


@pytest.mark.parametrize("module", ["no_such_module_hpcrl", "json.no_such_part", "json"])  # json is a package without __main__
def test_a_module_the_interpreter_cannot_find_is_refused_in_one_line(tmp_path: Path, capsys, module: str) -> None:
    assert main(["sweep", str(config(tmp_path, [sys.executable, "-m", module])), "--scheduler", "local"]) == 2
    err = capsys.readouterr().err
    assert err == f"hpcrl: error: program.command: {sys.executable} finds no module {module!r} (python -m {module} would fail in every job after its queue wait): " \
                  "sweep from the environment that has it, or give that environment's python\n", err  # fmt: skip
    assert not (tmp_path / "logs").exists()


def test_a_module_found_passes_without_running_its_packages_code(tmp_path: Path, capsys) -> None:
    """`rl_zoo3/__init__.py` imports torch: the check looks the module up, and runs none of it."""
    package = tmp_path / "trainerpkg"
    package.mkdir()
    (package / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\nimport time\ntime.sleep(30)\n")
    (package / "train.py").write_text("print('training')\n")
    began = time.monotonic()
    assert main(["sweep", str(config(tmp_path, [sys.executable, "-m", "trainerpkg.train"])), "--scheduler", "local", "--dry-run"]) == 0
    assert time.monotonic() - began < 20 and not (tmp_path / "ran").exists()
    assert main(["sweep", str(config(tmp_path, [sys.executable, "-m", "json.tool"])), "--scheduler", "local", "--dry-run"]) == 0


def test_inside_an_image_the_module_is_the_images_business(tmp_path: Path) -> None:
    exp = experiment_from_dict(yaml.safe_load(config(tmp_path, ["python", "-m", "no_such_module_hpcrl"], image="/images/x.sif", runs="program").read_text()))
    check_module(exp)  # not asked: inside the image `python` is the image's


def test_an_interpreter_that_does_not_answer_is_waited_for_a_bounded_time(tmp_path: Path, capsys) -> None:
    slow = tmp_path / "python3"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(0o755)
    exp = experiment_from_dict(yaml.safe_load(config(tmp_path, [str(slow), "-m", "rl_zoo3.train"]).read_text()))
    began = time.monotonic()
    check_module(exp, timeout=0.5)
    assert time.monotonic() - began < 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did not say within 0.5 s whether it finds module 'rl_zoo3.train'" in err
