"""Where a sweep writes, checked before it writes anything: `output` and the experiment's directory can be
made, and a directory that exists is empty or an experiment already; with the shape of a run's id, which
names its directory under runs/."""

from __future__ import annotations

import errno
import os
import re
import tempfile
from pathlib import Path

from hpcrl.config.experiment import Experiment
from hpcrl.config.schema import ConfigError


def check_output(exp: Experiment) -> None:
    """`output` must be (or become) a directory: a file there would fail the first mkdir. A path the
    system cannot take (a name longer than a directory entry may be, below the nearest directory that
    exists or in it) is one line, not a traceback from that mkdir."""
    path = Path(exp.output)
    try:
        for candidate in (exp.dir, path, *path.absolute().parents):
            if candidate.exists() or candidate.is_symlink():
                if not candidate.is_dir():
                    key = "name" if candidate == exp.dir else "output"
                    raise ConfigError(f"{key}: {candidate} is a file, not a directory")
                if candidate == exp.dir:
                    _check_taken(exp.dir)
                break
        if any(len(os.fsencode(part)) > os.pathconf(candidate, "PC_NAME_MAX") for part in exp.dir.absolute().parts):
            raise ConfigError(f"output: cannot use {exp.dir} ({os.strerror(errno.ENAMETOOLONG)})")
    except OSError as exc:
        raise ConfigError(f"output: cannot use {exp.dir} ({exc.strerror or exc})") from None


SWEEP_FIRST = ("jobs", "optuna", "experiment.yaml")
"""What a sweep writes into the experiment's directory before its runs.csv: the sweep lock in jobs/, an Optuna
study's journal (`hpcrl.sweep.study.STUDY_DIR`) and experiment.yaml (`hpcrl.store.expdir.write_experiment`). A
first sweep whose submission failed leaves them in a directory it found (its rollback takes back files, not
directories it did not make), and a second sweep of the experiment at once finds them there: that one is refused
by the first one's lock, in its own words."""


RUN_ID = re.compile(r"[0-9a-f]{10}-s(-?\d+)")
"""A run's id, and its directory's name under runs/: its setting's hash, then its seed (`run_id` makes it)."""


def run_id(setting_hash: str, seed: int) -> str:
    """The id of the run of a setting (the first 10 hex digits of its hash) and a seed: what RUN_ID reads back."""
    return f"{setting_hash[:10]}-s{seed}"


ATOMIC_TEMP = re.compile(r"\..+\.tmp")
"""hpcrl.io's temporary file beside one it writes whole (`.experiment.yaml.1a2b.tmp`), there for a moment."""


def _runs_of_hpcrl(entry: os.DirEntry[str]) -> bool:
    """A runs/ folder that holds run directories only (RUN_ID): an experiment's whose runs.csv was lost (a sweep lists
    its runs again), or one whose run files were laid out ahead of its first sweep."""
    if entry.name != "runs" or not entry.is_dir(follow_symlinks=False):
        return False
    with os.scandir(entry.path) as runs:  # unreadable: `check_output` says so in one line
        return all(RUN_ID.fullmatch(run.name) and run.is_dir(follow_symlinks=False) for run in runs)


def _check_taken(directory: Path) -> None:
    """The experiment's directory, where it exists, is empty (but for SWEEP_FIRST) or an experiment (a
    sweep again, which resubmits what is missing): a sweep writes its results/, runs/ and jobs/ there,
    over what a directory of the user's own holds. An experiment is a directory with a runs.csv, as
    `hpcrl.store.expdir.is_experiment` says (hpcrl.store is built on this room and cannot be imported here)."""
    if (directory / "runs.csv").exists():  # a sweep again: its runs/ (thousands of entries) needs no look
        return
    with os.scandir(directory) as entries:
        found = sorted(entry.name for entry in entries if entry.name not in SWEEP_FIRST and not ATOMIC_TEMP.fullmatch(entry.name) and not _runs_of_hpcrl(entry))
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise ConfigError(f"name: {directory} exists and is not an hpcrl experiment (it holds {shown}): a sweep would write over it; pick another name or output")


def check_output_writable(exp: Experiment) -> None:
    """Before a sweep writes anything: a directory can be made where the experiment goes. `output`
    under /proc or /sys, on a read-only mount or in another user's directory fails here as one line,
    with nothing written, rather than as a traceback from the first mkdir (which left `jobs/` behind
    where it got that far). The probe is a directory made and removed in the nearest existing one;
    `hpcrl.api.load` and dry runs do not probe, so a config for a cluster still loads on a laptop."""
    place = next(p for p in (exp.dir, *exp.dir.absolute().parents) if p.is_dir())
    try:
        Path(tempfile.mkdtemp(prefix=".hpcrl-probe-", dir=place)).rmdir()
    except OSError as exc:
        where = f"{exp.source}: " if exp.source else ""
        raise ConfigError(f"{where}output: cannot create {exp.dir} ({place}: {exc.strerror or exc})") from None
