"""Grid Engine runs over several hosts (issue 36), without a cell: which parallel environments can span
hosts (refused at sweep time in one line otherwise), how the launcher reads $PE_HOSTFILE and places the
ranks, the `qrsh -inherit` line that starts another host's ranks, and the holds on a job that spans hosts.
The same on a real multi-host cell: tests/e2e/test_sge_multihost.py."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpcrl.runtime.launch import LaunchError, group_argv, pe_hosts, place, spread
from hpcrl.schedulers.base import NodeRequest, SchedulerError
from hpcrl.schedulers.sge import SGEScheduler, _Hosts, hold_argv, host_slots, offered, pe_refusal
from hpcrl.store.expdir import Dependency

PE = """pe_name            {name}
slots              9999
allocation_rule    {rule}
control_slaves     {control}
job_is_first_task  FALSE
"""


@pytest.mark.parametrize(
    ("rule", "control", "slots", "nodes", "words"),
    [
        ("$pe_slots", "FALSE", 2, 2, "puts all of a job's slots on one host (allocation_rule $pe_slots)"),
        ("$round_robin", "FALSE", 2, 2, "control_slaves FALSE"),
        ("4", "TRUE", 2, 2, "puts 4 slots on each host (allocation_rule 4)"),
        ("1", "TRUE", 4, 2, "would not make 2 hosts"),
        ("$weird", "TRUE", 2, 2, "allocation_rule '$weird'"),
    ],
)
def test_a_parallel_environment_that_cannot_span_hosts_is_refused_in_one_line(rule: str, control: str, slots: int, nodes: int, words: str) -> None:
    why = pe_refusal("smp", PE.format(name="smp", rule=rule, control=control), slots, nodes)
    assert why is not None and words in why and "\n" not in why and "resources.sge_pe" in why


@pytest.mark.parametrize(("rule", "slots", "nodes"), [("$round_robin", 2, 2), ("$fill_up", 8, 2), ("2", 4, 2)])
def test_a_parallel_environment_that_spans_hosts_is_taken(rule: str, slots: int, nodes: int) -> None:
    assert pe_refusal("mpi", PE.format(name="mpi", rule=rule, control="TRUE"), slots, nodes) is None


def test_pe_hostfile_hosts_and_slots_in_order(tmp_path: Path) -> None:
    f = tmp_path / "pe_hostfile"
    f.write_text("node2 2 multi.q@node2 UNDEFINED\nnode1 1 multi.q@node1 UNDEFINED\nnode2 1 other.q@node2 UNDEFINED\n\n")
    assert pe_hosts(f) == [("node2", 3), ("node1", 1)]
    f.write_text("node2 two multi.q@node2 UNDEFINED\n")
    with pytest.raises(LaunchError, match="unreadable line"):
        pe_hosts(f)
    with pytest.raises(LaunchError, match="missing"):
        pe_hosts(tmp_path / "missing")


def test_ranks_follow_the_slots_each_host_was_granted() -> None:
    assert place(2, [("a", 1), ("b", 1)]) == [("a", 1), ("b", 1)]
    assert place(4, [("a", 4), ("b", 4)]) == [("a", 2), ("b", 2)]  # 2 cpus a rank
    assert place(2, [("a", 2), ("b", 1), ("b2", 1)]) == [("a", 1), ("b", 1)]  # 2 cpus a rank, the slots split 2/1/1
    assert place(2, [("a", 4)]) == [("a", 2)]
    assert sum(n for _, n in place(3, [("a", 3), ("b", 3), ("c", 3)])) == 3


def test_one_host_in_the_pe_hostfile_is_the_single_host_launcher(tmp_path: Path) -> None:
    f = tmp_path / "pe_hostfile"
    f.write_text("thishost 4 all.q@thishost UNDEFINED\n")
    assert spread(2, {"PE_HOSTFILE": str(f)}) is None
    assert spread(2, {}) is None
    me = socket.gethostname()
    f.write_text(f"other 2 q@other UNDEFINED\n{me} 1 q@{me} UNDEFINED\nthird 2 q@third UNDEFINED\n")
    assert spread(2, {"PE_HOSTFILE": str(f)}) == [(me, 0), ("other", 1), ("third", 1)]  # too few slots here for a rank: the store is
    f.write_text(f"{me} 2 q@{me} UNDEFINED\nother 2 q@other UNDEFINED\n")
    assert spread(2, {"PE_HOSTFILE": str(f)}) == [(me, 1), ("other", 1)]
    f.write_text("elsewhere1 1 q@e1 UNDEFINED\nelsewhere2 1 q@e2 UNDEFINED\n")
    with pytest.raises(LaunchError, match="not in \\$PE_HOSTFILE"):
        spread(2, {"PE_HOSTFILE": str(f)})


def test_the_qrsh_line_carries_the_environment_quoted_and_leaves_grid_engine_s_own(tmp_path: Path) -> None:
    env = {"MASTER_ADDR": "node1", "WORLD_SIZE": "2", "ODD": "a b'c;$(touch x)", "JOB_ID": "7", "PE_HOSTFILE": "/tmp/x", "TMPDIR": "/tmp/7.1", "BASH_FUNC_f%%": "() { :; }", "HPCRL_STEP_MARK": "m1"}
    argv = group_argv("node2", 1, 1, [sys.executable, "-c", "print('hi there')"], env)
    assert argv[:4] == ["qrsh", "-inherit", "-nostdin", "node2"]
    words = shlex.split(argv[4])
    assert words[:3] == ["cd", os.getcwd(), "&&"] and words[3:5] == ["exec", "env"]
    assert "ODD=a b'c;$(touch x)" in words and "MASTER_ADDR=node1" in words
    # The ranks' mark reaches the group launcher under another name: the launcher is not what its ranks left.
    assert "HPCRL_GROUP_MARK=m1" in words and not any(w.startswith("HPCRL_STEP_MARK=") for w in words)
    assert not any(w.startswith(("JOB_ID=", "PE_HOSTFILE=", "TMPDIR=", "BASH_FUNC")) for w in words)
    assert words[-8:] == ["-m", "hpcrl.runtime.launch", "1", "1", "--", sys.executable, "-c", "print('hi there')"]
    # What the remote shell does with the line: the words arrive as they were.
    line = argv[4].replace("exec env ", "exec env -i PATH=/usr/bin:/bin ", 1)
    out = subprocess.run(["sh", "-c", line.replace("-m hpcrl.runtime.launch 1 1 -- ", "-c 'import os,sys; print(os.environ[\"ODD\"]); sys.exit(0)' ")], capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.strip() == "a b'c;$(touch x)", out.stderr
    assert not (tmp_path / "x").exists()


def test_the_group_launcher_refuses_a_loopback_master_in_one_line() -> None:
    env = {**os.environ, "MASTER_ADDR": "localhost", "MASTER_PORT": "1", "WORLD_SIZE": "2"}
    proc = subprocess.run([sys.executable, "-m", "hpcrl.runtime.launch", "1", "1", "--", sys.executable, "-c", "pass"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "localhost resolves to 127." in proc.stderr, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "hpcrl.runtime.launch", "x"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage" in proc.stderr


@pytest.mark.parametrize("mark", ["", "a\nb"])
def test_the_group_launcher_refuses_a_mark_that_names_no_start_in_one_line(tmp_path: Path, mark: str) -> None:
    """Empty, the mark would be carried by every process with the variable set empty; the group starts no rank."""
    started = tmp_path / "started"
    env = {**os.environ, "MASTER_ADDR": "192.0.2.1", "HPCRL_GROUP_MARK": mark}
    proc = subprocess.run([sys.executable, "-m", "hpcrl.runtime.launch", "1", "1", "--", "touch", str(started)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "HPCRL_GROUP_MARK is not a start's mark" in proc.stderr, proc.stderr
    assert not started.exists()


def test_a_job_whose_tasks_span_hosts_is_held_on_as_a_whole() -> None:
    after = [Dependency("7", "each"), Dependency("8", "each"), Dependency("9", "all")]
    assert hold_argv(after) == ["-hold_jid_ad", "7,8", "-hold_jid", "9"]
    assert hold_argv(after, {"8"}) == ["-hold_jid_ad", "7", "-hold_jid", "8,9"]


class _Cell(SGEScheduler):
    """qconf -se answers from a table; a host missing from it is one this machine cannot resolve."""

    def __init__(self, held: dict[str, str]) -> None:
        super().__init__()
        self.held = held

    def run(self, argv: list[str], input: str | None = None) -> str:
        if argv[:2] == ["qconf", "-se"]:
            if argv[2] not in self.held:
                raise SchedulerError(f"qconf -se {argv[2]} exited 1: can't resolve hostname \"{argv[2]}\"")
            return f"hostname {argv[2]}\ncomplex_values        gpu={self.held[argv[2]]}\n"
        raise SchedulerError("no such command here")


def test_a_host_this_machine_cannot_resolve_is_left_out_of_the_gpu_bound() -> None:
    listing = "all.q@vm BIP 0/0/4 0.01 lx-amd64\n\thc:gpu=2\nmulti.q@sge-host1 BIP 0/0/4 0.01 lx-amd64\n\thc:gpu=2\n"
    ask = NodeRequest("resources.cpus", 1, "resources.mem", "1G", 1024, gpus=3, gpus_key="resources.gpus")

    def refusal(held: dict[str, str]) -> str | None:
        return _Hosts(host_slots(listing), offered(listing, "gpu"), "gpu", "any queue").refuse(ask, _Cell(held).run)

    why = refusal({"vm": "2"})
    assert why and "no host of any queue holds more than 2 'gpu'" in why
    assert refusal({"vm": "2", "sge-host1": "4"}) is None
    assert refusal({}) is None  # nothing readable: qsub decides
