"""hpcrl.stages, the in-job entry points: how a job imports its stack."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_a_job_s_stack_imports_without_a_full_collection_and_stays_frozen() -> None:
    """torch's ~170k objects ran three full collections while it imported and one more at the exit: 0.4 s of a
    job's ~1.4 s of CPU. Imported by `quiet_imports`, none; the collector is on again after, with them frozen."""
    done = _run(
        """
        import gc
        from hpcrl import stages

        before = gc.get_stats()[2]["collections"]
        with stages.quiet_imports():
            from hpcrl.rl.train import train_run
        print(gc.get_stats()[2]["collections"] - before, gc.isenabled(), gc.get_freeze_count())
        """
    )
    assert done.returncode == 0, done.stderr
    full, enabled, frozen = done.stdout.split()
    assert (full, enabled) == ("0", "True") and int(frozen) > 100_000, done.stdout


def test_an_import_that_fails_leaves_the_collector_as_it_was() -> None:
    done = _run(
        """
        import gc
        from hpcrl import stages

        try:
            with stages.quiet_imports():
                import no_such_module_here
        except ImportError:
            pass
        enabled = gc.isenabled()
        gc.disable()
        with stages.quiet_imports():
            import json
        print(enabled, gc.isenabled())
        """
    )
    assert done.returncode == 0 and done.stdout.split() == ["True", "False"], (done.stdout, done.stderr)


def test_only_the_first_stage_of_a_process_freezes() -> None:
    """A freeze keeps for ever the cyclic garbage not yet collected: a process running several stages (the debug
    backend) must not freeze what an earlier stage left."""
    done = _run(
        """
        import gc
        from hpcrl import stages

        with stages.quiet_imports():
            import json
        first = gc.get_freeze_count()
        gc.disable()
        left = [[] for _ in range(1000)]
        for item in left:
            item.append(item)  # cycles, as a finished stage may leave
        del left
        with stages.quiet_imports():
            import csv
        print(first > 0, gc.get_freeze_count() == first)
        """
    )
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], (done.stdout, done.stderr)
