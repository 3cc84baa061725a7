"""The wheel carries the templates and configs a user's jobs are rendered from."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_wheel_bundles_templates_and_configs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    wheel = next(tmp_path.glob("hpcrl-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("hpcrl/_bundled/job_templates/slurm.sh.j2", "hpcrl/_bundled/job_templates/_job.sh.j2", "hpcrl/_bundled/singularity/hpcrl.def.j2", "hpcrl/_bundled/configs/cartpole_ppo.yaml", "hpcrl/cli.py"):
        assert required in names
    assert not any(n.startswith(("tests/", "logs/")) for n in names)


def _installed_wheel(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """The built wheel in a fresh venv: its python, its site-packages and an environment without
    PYTHONPATH. The dependencies come from this interpreter's site-packages through a .pth line,
    added after the venv's own, so the wheel's hpcrl wins."""
    wheels, venv = tmp_path / "wheels", tmp_path / "venv"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    zipfile.ZipFile(next(wheels.glob("hpcrl-*.whl"))).extractall(site)  # what pip install does for a pure wheel, without needing pip in the venv
    deps = subprocess.run([sys.executable, "-c", "import jinja2, pathlib; print(pathlib.Path(jinja2.__file__).parent.parent)"], capture_output=True, text=True, check=True).stdout.strip()
    (site / "zz_deps.pth").write_text(deps + "\n")
    return python, site, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing may point back at the checkout


def test_installed_wheel_renders_job_scripts_outside_the_checkout(tmp_path: Path) -> None:
    """Issue 12: a wrong template path in the wheel passed every test run from the checkout. Install the
    built wheel into a fresh venv and dry-run a bundled config from a directory that is not the checkout."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    python, site, env = _installed_wheel(tmp_path)
    where = subprocess.run([str(python), "-c", "import hpcrl, hpcrl.templates as t; print(hpcrl.__file__); print(t.bundled_dir('configs'))"], capture_output=True, text=True, cwd=elsewhere, env=env, check=True).stdout.split()
    assert where[0].startswith(str(site)), where
    config = Path(where[1]) / "cartpole_ppo.yaml"
    proc = subprocess.run([str(python), "-m", "hpcrl", "sweep", str(config), "--dry-run", "--scheduler", "slurm", "-p", f"output={elsewhere}/logs"], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("#!/bin/bash") == 3 and "#SBATCH --array=" in proc.stdout and "hpcrl train" not in proc.stdout.split("#SBATCH")[0]
    assert not (elsewhere / "logs").exists()


@pytest.mark.e2e
def test_a_new_user_inits_sweeps_and_collects_with_the_installed_wheel(tmp_path: Path) -> None:
    """Issue 18: from an empty directory, with the wheel installed (not the checkout): `hpcrl init`,
    then `hpcrl sweep` of that file with Hydra-style overrides, then `collect`."""
    empty = tmp_path / "empty"
    empty.mkdir()
    python, _, env = _installed_wheel(tmp_path)

    def hpcrl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), "-m", "hpcrl", *args], capture_output=True, text=True, cwd=empty, env=env, timeout=600)

    version = hpcrl("--version")
    assert version.returncode == 0 and version.stdout.strip() == "hpcrl 0.1.0"  # no git commit: not a checkout
    made = hpcrl("init", "demo")
    assert made.returncode == 0 and (empty / "demo.yaml").read_text().count("name: demo") == 1, made.stderr
    again = hpcrl("init", "demo")
    assert again.returncode == 2 and "exists" in again.stderr and again.stderr.count("\n") == 1
    ran = hpcrl("sweep", "demo.yaml", "--scheduler", "local", "train.total_steps=2048", "sweep.seeds=2", "eval.episodes=2")
    assert ran.returncode == 0, ran.stderr[-2000:]
    collected = hpcrl("collect", "logs/demo")
    assert collected.returncode == 0, collected.stderr[-2000:]
    assert (empty / "logs" / "demo" / "results" / "summary.csv").read_text().splitlines()[1].split(",")[1:3] and "2/2" in collected.stdout
    assert sorted(p.name for p in empty.iterdir()) == ["demo.yaml", "logs"]
