"""The wheel carries the templates and configs a user's jobs are rendered from."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_wheel_bundles_templates_and_configs(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    wheel = next(tmp_path.glob("hpcrl-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in ("hpcrl/_bundled/job_templates/slurm.sh.j2", "hpcrl/_bundled/job_templates/_job.sh.j2", "hpcrl/_bundled/singularity/hpcrl.def.j2", "hpcrl/_bundled/configs/cartpole_ppo.yaml", "hpcrl/cli.py"):
        assert required in names
    assert not any(n.startswith(("tests/", "logs/")) for n in names)


def test_installed_wheel_renders_job_scripts_outside_the_checkout(tmp_path: Path) -> None:
    """Issue 12: a wrong template path in the wheel passed every test run from the checkout. Install the
    built wheel into a fresh venv (the dependencies come from this interpreter's site-packages through a
    .pth line, added after the venv's own, so the wheel's hpcrl wins) and dry-run a bundled config from
    a directory that is not the checkout."""
    wheels, venv, elsewhere = tmp_path / "wheels", tmp_path / "venv", tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    wheel = next(wheels.glob("hpcrl-*.whl"))
    zipfile.ZipFile(wheel).extractall(site)  # what pip install does for a pure wheel, without needing pip in the venv
    deps = subprocess.run([sys.executable, "-c", "import jinja2, pathlib; print(pathlib.Path(jinja2.__file__).parent.parent)"], capture_output=True, text=True, check=True).stdout.strip()
    (site / "zz_deps.pth").write_text(deps + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing may point back at the checkout
    where = subprocess.run([str(python), "-c", "import hpcrl, hpcrl.templates as t; print(hpcrl.__file__); print(t.bundled_dir('configs'))"], capture_output=True, text=True, cwd=elsewhere, env=env, check=True).stdout.split()
    assert where[0].startswith(str(site)), where
    config = Path(where[1]) / "cartpole_ppo.yaml"
    proc = subprocess.run([str(python), "-m", "hpcrl", "sweep", str(config), "--dry-run", "--scheduler", "slurm", "-p", f"output={elsewhere}/logs"], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("#!/bin/bash") == 3 and "#SBATCH --array=" in proc.stdout and "hpcrl train" not in proc.stdout.split("#SBATCH")[0]
    assert not (elsewhere / "logs").exists()
