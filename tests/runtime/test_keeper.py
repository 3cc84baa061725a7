"""The keeper's own rules that need no program to show (hpcrl.runtime.keeper); what it does to a
program's processes is in test_program_supervision.py."""

from __future__ import annotations

import threading

from hpcrl.runtime import keeper


def test_the_processes_below_the_keeper_are_found_through_any_depth_and_a_cycle_ends_the_walk() -> None:
    """/proc is read one process at a time: a pid reused meanwhile can make the parents a cycle, and the
    keeper's sweep must still end (a sweep that never ends holds the run's lock for ever)."""
    parents = {10: 1, 11: 10, 12: 11, 13: 12, 20: 1, 30: 31, 31: 30, 40: 41}
    found: list[set[int]] = []
    walk = threading.Thread(target=lambda: found.append(keeper._below(parents, 10)), daemon=True)
    walk.start()
    walk.join(5)
    assert found == [{11, 12, 13}], "the walk did not end on a cycle of parents" if not found else found
