"""The venv of its own that a benchmark's reference side runs in (OpenSpiel's JAX AlphaZero, Sample
Factory): built on first use with pip from the registries, cached, and reused while its requirements
are the same.

A reference system pins what hpcrl's environment cannot hold beside its own (JAX and Flax; gymnasium
0.29 under Sample Factory where hpcrl has 1.x), so each gets a venv keyed by a hash of its
requirements and the Python that builds it. The venv is complete only once `.ready` is written, after
pip succeeded; a build that died half way is removed and made again. Two benchmarks that want the
same venv at once wait on one lock file. Where pip cannot install the requirements (no network and
nothing cached), `Unavailable` says why in one line, and the benchmark skips that side with it.

`torch==2.13.0` in a requirement list is the CPU wheel: on these machines pip takes it from a local
file, where any other torch spec would download a CUDA build of several GB.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

CACHE = Path(os.environ.get("HPCRL_BENCH_VENVS") or Path.home() / ".cache" / "hpcrl" / "bench-venvs")
"""Where the venvs live (HPCRL_BENCH_VENVS overrides)."""
BUILD = os.environ.get("HPCRL_BENCH_BUILD", "1") != "0"
"""HPCRL_BENCH_BUILD=0: use a venv that is built, never build one (the suite's tiny runs: a build is minutes
of pip and a torch wheel, which the suite's 20 minutes cannot hold; the side is then SKIPPED with that reason)."""


class Unavailable(Exception):
    """The venv could not be built here; the message is pip's reason, one line."""


def given_python(name: str) -> Path | None:
    """The Python that HPCRL_BENCH_PYTHON_<NAME> names for the venv `name` (`sample-factory`:
    HPCRL_BENCH_PYTHON_SAMPLE_FACTORY), or None. For a machine that reaches no registry, such as a lent GPU node:
    there the requirements travel as wheels, installed with `pip install --target` into a folder, and a two-line
    wrapper puts that folder on PYTHONPATH ahead of the machine's own packages (benchmarks/device_bundle.sh). The
    Python is taken as it is: what it holds is the caller's word."""
    var = "HPCRL_BENCH_PYTHON_" + "".join(c if c.isalnum() else "_" for c in name).upper()
    given = os.environ.get(var)
    if not given:
        return None
    path = Path(given)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise Unavailable(f"{var}={given!r}: not an executable file")
    return path


def venv_python(name: str, requirements: Sequence[str], timeout: float = 1800) -> Path:
    """The Python of the venv `name` holding `requirements`, built first if it is not there yet (or the one
    `given_python` names)."""
    if (given := given_python(name)) is not None:
        return given
    key = hashlib.sha256(json.dumps([name, list(requirements), list(sys.version_info[:2])]).encode()).hexdigest()[:10]
    root = CACHE / f"{name}-{key}"
    python = root / "bin" / "python"
    if (root / ".ready").is_file():
        return python
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another benchmark building the same venv: wait for it
        if (root / ".ready").is_file():
            return python
        if not BUILD:
            raise Unavailable(f"the venv {root.name} is not built here and HPCRL_BENCH_BUILD=0 (run the benchmark once without it to build it)")
        shutil.rmtree(root, ignore_errors=True)  # a build that died half way
        print(f"building the venv {root} ({' '.join(requirements)}): once, then cached", file=sys.stderr, flush=True)
        _run([sys.executable, "-m", "venv", str(root)], root, timeout)
        _run([str(python), "-m", "pip", "install", "--quiet", *requirements], root, timeout)
        (root / ".ready").write_text(json.dumps({"requirements": list(requirements)}) + "\n")
    return python


def _run(command: list[str], root: Path, timeout: float) -> None:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        shutil.rmtree(root, ignore_errors=True)
        raise Unavailable(f"{' '.join(command[:4])} ... took more than {timeout:.0f} s") from None
    if proc.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        lines = [x for x in (proc.stderr + proc.stdout).splitlines() if x.strip()]
        errors = [x for x in lines if "ERROR" in x] or lines or [f"exit {proc.returncode}"]
        raise Unavailable(f"could not build the venv {root.name}: {errors[0].strip()[:300]}")
