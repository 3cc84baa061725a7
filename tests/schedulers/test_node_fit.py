"""A cluster's node-size check (issue 37 item 14): ONE node must hold all of a stage's request. A 64-CPU
node without GPUs and an 8-CPU node with 4 GPUs do not hold 32 CPUs with 4 GPUs, whatever each resource's
largest value is. The scheduler's listings are canned here (no sinfo or qstat is run)."""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import write_config

from hpcrl.config.load import load_experiment
from hpcrl.schedulers.base import NodeRequest, SchedulerError
from hpcrl.schedulers.sge import SGEScheduler
from hpcrl.schedulers.slurm import SlurmScheduler

SINFO = "debug*|64|256000|(null)\ndebug*|8|64000|gpu:a100:4(S:0-1)\n"
"""A partition of a 64-CPU node without GPUs and an 8-CPU node with 4 GPUs."""

QSTAT = """queuename                      qtype resv/used/tot. load_avg arch          states
---------------------------------------------------------------------------------
all.q@big                      BIP   0/0/64         0.01     lx-amd64
\thc:gpu=0
---------------------------------------------------------------------------------
all.q@gpunode                  BIP   0/0/8          0.01     lx-amd64
\thc:gpu=4
"""
QCONF = {"big": "complex_values        gpu=0\n", "gpunode": "complex_values        gpu=4,mem_free=64G\n"}


def ask(cpus: int, gpus: int, mem_mb: int = 1000, key: str = "resources.gpus") -> NodeRequest:
    return NodeRequest("resources.cpus", cpus, "resources.mem", f"{mem_mb}M", mem_mb, gpus=gpus, gpus_key=key)


class CannedSlurm(SlurmScheduler):
    def run(self, argv: list[str], input: str | None = None, timeout: float = 0) -> str:
        assert argv[0] == "sinfo", argv
        return SINFO


class CannedSGE(SGEScheduler):
    def run(self, argv: list[str], input: str | None = None, timeout: float = 0) -> str:
        if argv[0] == "qstat":
            return QSTAT
        if argv[:2] == ["qconf", "-se"]:
            return QCONF[argv[2]]
        raise SchedulerError(f"{argv}: not canned")


@pytest.fixture
def exp(tmp_path: Path):
    return load_experiment(write_config(tmp_path))


@pytest.mark.parametrize("scheduler", [CannedSlurm, CannedSGE])
def test_a_request_split_across_two_nodes_is_refused(scheduler: type, exp) -> None:
    refusal = scheduler().refuse(exp, [ask(32, 4)])
    assert refusal is not None and "\n" not in refusal
    assert "resources.cpus" in refusal and "resources.gpus" in refusal and "on one " in refusal and "together" in refusal


@pytest.mark.parametrize("scheduler", [CannedSlurm, CannedSGE])
@pytest.mark.parametrize(("cpus", "gpus"), [(64, 0), (8, 4), (32, 0), (1, 1)])
def test_a_request_one_node_holds_passes(scheduler: type, exp, cpus: int, gpus: int) -> None:
    assert scheduler().refuse(exp, [ask(cpus, gpus)]) is None


@pytest.mark.parametrize("scheduler", [CannedSlurm, CannedSGE])
def test_every_stage_is_checked_not_only_the_first(scheduler: type, exp) -> None:
    """Train fits the GPU node; eval asks the CPUs of the big node with the GPUs of the other."""
    refusal = scheduler().refuse(exp, [ask(8, 4), ask(32, 4, key="eval.gpus")])
    assert refusal is not None and "eval.gpus" in refusal


def test_slurm_memory_counts_on_the_same_node(exp) -> None:
    """100 GB with a GPU: the node with the GPUs has 64 GB, the one with 256 GB has no GPU."""
    refusal = CannedSlurm().refuse(exp, [ask(4, 1, mem_mb=100_000)])
    assert refusal is not None and "resources.mem" in refusal and "together" in refusal
    assert CannedSlurm().refuse(exp, [ask(4, 0, mem_mb=100_000)]) is None


@pytest.mark.parametrize("scheduler", [CannedSlurm, CannedSGE])
def test_gpus_only_a_later_stage_asks_for_are_checked_where_the_first_asks_none(scheduler: type, exp) -> None:
    """Train on CPUs, eval on the GPU node: the GPUs are looked up for the stage that asks them (Grid
    Engine reads its GPU consumable only when some stage asks; it read it only when the first did, and
    then refused eval's fitting GPUs as a consumable no host offers)."""
    assert scheduler().refuse(exp, [ask(2, 0), ask(8, 4, key="eval.gpus")]) is None
    refusal = scheduler().refuse(exp, [ask(2, 0), ask(1, 5, key="eval.gpus")])
    assert refusal is not None and refusal.startswith("eval.gpus: 5 GPUs") and "more than 4" in refusal, refusal


def test_slurm_memory_no_node_has_is_named_with_the_largest_nodes_megabytes(exp) -> None:
    """sinfo's %m is in megabytes, the request is compared in megabytes: 300G is more than the 256,000M of
    the largest node, named alone (not as a combination no node holds)."""
    refusal = CannedSlurm().refuse(exp, [NodeRequest("resources.cpus", 1, "resources.mem", "300G", 300 * 1024)])
    assert refusal == "resources.mem: 300G per node, but the largest node of Slurm's default partition debug has 256000M (sinfo): the job would stay pending for ever"
    assert CannedSlurm().refuse(exp, [NodeRequest("resources.cpus", 1, "resources.mem", "250G", 250 * 1024)]) is None


def test_the_listings_are_read_node_by_node_and_a_line_that_is_no_node_is_left_out() -> None:
    """sinfo lines with a CPU or memory field that is not a number (a header, a node being configured: `N/A`)
    are left out, not an int() traceback; qstat's slots add up over a host's queue instances (a host in two
    queues holds both), and a consumable value that is no number is left out."""
    from hpcrl.schedulers.sge import host_slots, offered
    from hpcrl.schedulers.slurm import _node_rows

    assert _node_rows("PARTITION|CPUS|MEMORY|GRES\ndebug*|64|N/A|(null)\ndebug*|N/A|64000|(null)\ndebug*|8|64000|gpu:2\n") == [("debug*", 8, 64000, 2)]
    two_queues = QSTAT + "---------------------------------------------------------------------------------\nlong.q@gpunode                 BIP   0/0/4          0.01     lx-amd64\n\thc:gpu=N/A\n"
    assert host_slots(QSTAT) == {"big": 64, "gpunode": 8}
    assert host_slots(two_queues) == {"big": 64, "gpunode": 12}
    assert offered(two_queues, "gpu") == {"big": 0.0, "gpunode": 4.0}
