"""The wheel carries the templates and configs a user's jobs are rendered from."""

from __future__ import annotations

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
