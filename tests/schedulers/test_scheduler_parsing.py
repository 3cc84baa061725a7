"""The scheduler outputs status reads, in the forms the live tests rarely produce.

The conformance suite runs against real daemons, but a 3-task sweep never shows squeue's folded
pending ranges with a throttle, sacct's bracketed lists (jobs older than MinJobAge) or a Grid
Engine task list with a step. These lines are in the formats the tools print.
"""

from __future__ import annotations

from hpcrl.schedulers.base import CANCELLED, DONE, FAILED, PENDING, RUNNING, UNKNOWN
from hpcrl.schedulers.sge import parse_qstat_xml, qdel_refusals
from hpcrl.schedulers.slurm import dependency_argv, parse_sacct, parse_squeue
from hpcrl.store.expdir import Dependency


def test_squeue_folded_pending_tasks_and_plain_jobs() -> None:
    text = "101|1|RUNNING\n101|2|COMPLETING\n101|3-7%2|PENDING\n102|N/A|PENDING\n103|4|SOMETHING_NEW\n"
    assert parse_squeue(text) == {
        "101": {1: RUNNING, 2: RUNNING, 3: PENDING, 4: PENDING, 5: PENDING, 6: PENDING, 7: PENDING},
        "102": {0: PENDING},
        "103": {4: UNKNOWN},
    }


def test_sacct_bracketed_lists_and_cancelled_by() -> None:
    text = "200_1|COMPLETED\n200_2|FAILED\n200_[3,5-9:2%4]|PENDING\n201|CANCELLED by 0\n202_3|OUT_OF_MEMORY\n"
    assert parse_sacct(text) == {
        "200": {1: DONE, 2: FAILED, 3: PENDING, 5: PENDING, 7: PENDING, 9: PENDING},
        "201": {0: CANCELLED},
        "202": {3: FAILED},
    }


def test_slurm_dependencies_each_and_all() -> None:
    assert dependency_argv([]) == []
    assert dependency_argv([Dependency("7", "each")]) == ["--dependency=aftercorr:7", "--kill-on-invalid-dep=yes"]
    assert dependency_argv([Dependency("8", "all"), Dependency("9", "all")]) == ["--dependency=afterany:8:9"]


def test_qstat_xml_tasks_ranges_and_states() -> None:
    text = """<?xml version='1.0'?>
<job_info xmlns:xsd="http://arc.liv.ac.uk/repos/darcs/sge/source/dist/util/resources/schemas/qstat/qstat.xsd">
  <queue_info>
    <job_list state="running"><JB_job_number>31</JB_job_number><state>r</state><tasks>1</tasks></job_list>
    <job_list state="running"><JB_job_number>31</JB_job_number><state>Rr</state><tasks>2</tasks></job_list>
  </queue_info>
  <job_info>
    <job_list state="pending"><JB_job_number>31</JB_job_number><state>qw</state><tasks>3-9:2</tasks></job_list>
    <job_list state="pending"><JB_job_number>32</JB_job_number><state>hqw</state></job_list>
    <job_list state="pending"><JB_job_number>33</JB_job_number><state>Eqw</state><tasks>4</tasks></job_list>
    <job_list state="running"><JB_job_number>34</JB_job_number><state>dr</state><tasks>1</tasks></job_list>
  </job_info>
</job_info>"""
    assert parse_qstat_xml(text) == {
        "31": {1: RUNNING, 2: RUNNING, 3: PENDING, 5: PENDING, 7: PENDING, 9: PENDING},
        "32": {0: PENDING},
        "33": {4: FAILED},
        "34": {1: CANCELLED},
    }


def test_qdel_of_live_and_ended_jobs_is_not_a_refusal() -> None:
    """What SGE 8.1.9's qdel printed (exit 1) for a cancel of an experiment whose train job had ended."""
    out = 'root has deleted job 21\nroot has deleted job 20\nroot has registered the job-array task 19.1 for deletion\ndenied: job "18" does not exist\n'
    assert qdel_refusals(out) == []
    assert qdel_refusals('denied: job "7" is not owned by you\n') == ['denied: job "7" is not owned by you']
