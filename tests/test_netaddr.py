"""Which address another node dials (hpcrl.netaddr), and the sweep-time refusal of one it cannot (issue 36).

This machine names itself 127.0.0.1 in /etc/hosts (a stock Debian node says 127.0.1.1): the address its name
resolves to is loopback, which is what a learner advertised before, and gloo paired ranks over. The
multi-node tests (tests/e2e/test_multinode_slurm.py) show it across real namespace nodes.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from hpcrl import netaddr
from hpcrl.config.load import load_experiment
from hpcrl.distributed.redis_server import resolve_bind
from hpcrl.schedulers.local import LocalScheduler
from hpcrl.schedulers.sge import SGEScheduler
from hpcrl.schedulers.slurm import SlurmScheduler
from hpcrl.submit.distributed import loopback_refusal


@pytest.mark.skipif(not netaddr.interfaces(), reason="this host has no network interface but loopback")
def test_auto_advertises_an_interface_address_where_the_host_name_is_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(netaddr.ONE_MACHINE, raising=False)
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "127.0.1.1")  # Debian's installer: the host's own name
    held = {address for _, address in netaddr.interfaces()}
    listen, advertised = resolve_bind("auto")
    assert advertised == listen and advertised in held and not netaddr.is_loopback(advertised)
    assert netaddr.interface_of(advertised) is not None
    # A wildcard listens everywhere and advertises the same dialable address.
    assert resolve_bind("0.0.0.0") == ("0.0.0.0", advertised)
    assert resolve_bind("10.9.8.7") == ("10.9.8.7", "10.9.8.7")


def test_auto_keeps_the_name_where_it_names_a_real_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster whose DNS gives each node its address: that address, not merely the first interface."""
    monkeypatch.delenv(netaddr.ONE_MACHINE, raising=False)
    monkeypatch.setattr(netaddr, "interfaces", lambda: [("eth0", "192.0.2.9"), ("ib0", "10.20.0.5")])
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "10.20.0.5")
    assert netaddr.advertised_address() == "10.20.0.5"
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "127.0.1.1")
    assert netaddr.advertised_address() == "192.0.2.9"
    monkeypatch.setattr(netaddr, "interfaces", lambda: [])
    assert netaddr.advertised_address() == "127.0.0.1"  # offline: only local peers exist


def test_on_the_local_executor_every_peer_is_on_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(netaddr.ONE_MACHINE, "1")
    assert resolve_bind("auto") == ("127.0.0.1", "127.0.0.1")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "::1", "localhost", socket.gethostname()])
def test_loopback_addresses_and_names_that_resolve_to_one_are_named(host: str) -> None:
    if host == socket.gethostname() and not netaddr.is_loopback(socket.gethostbyname(host)):
        pytest.skip("this host's name resolves to a real address here")
    problem = netaddr.loopback_problem(host)
    assert problem is not None and host in problem and "loopback" in problem


@pytest.mark.parametrize("host", ["10.251.0.11", "192.0.2.4", "no-such-host.invalid"])
def test_other_addresses_pass(host: str) -> None:
    assert netaddr.loopback_problem(host) is None  # an unknown name may resolve on the cluster's nodes


def _apex(tmp_path: Path, redis: dict) -> object:
    path = tmp_path / "apex.yaml"
    path.write_text(yaml.safe_dump({
        "name": "apex", "algo": "dqn", "env": {"id": "CartPole-v1"}, "output": str(tmp_path / "logs"),
        "distributed": {"actors": 2, "redis": redis}, "resources": {"max_concurrent": 3},
    }))  # fmt: skip
    return load_experiment(path)


@pytest.mark.parametrize(("redis", "key"), [
    ({"bind": "127.0.0.1"}, "distributed.redis.bind"),
    ({"bind": "localhost"}, "distributed.redis.bind"),
    ({"address": "127.0.0.1:6379"}, "distributed.redis.address"),
    ({"address": "localhost:6379"}, "distributed.redis.address"),
])  # fmt: skip
def test_a_loopback_board_is_refused_where_jobs_may_land_on_other_nodes(tmp_path: Path, redis: dict, key: str) -> None:
    exp = _apex(tmp_path, redis)
    for scheduler in (SlurmScheduler(), SGEScheduler()):
        refusal = loopback_refusal(exp, scheduler)
        assert refusal is not None and refusal.startswith(f"{key}: ") and "loopback" in refusal and "\n" not in refusal, refusal
    assert loopback_refusal(exp, LocalScheduler(tmp_path)) is None  # one machine: loopback is right there


@pytest.mark.parametrize("redis", [{}, {"bind": "auto"}, {"bind": "0.0.0.0"}, {"bind": "10.251.0.1"}, {"address": "redis.cluster.example:6379"}])
def test_dialable_boards_pass(tmp_path: Path, redis: dict) -> None:
    assert loopback_refusal(_apex(tmp_path, redis), SlurmScheduler()) is None
