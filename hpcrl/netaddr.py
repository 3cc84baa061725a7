"""Which address of this host another node can dial: the one rule for every address hpcrl advertises.

Why it exists: Debian's installer maps a host's own name to 127.0.1.1 (and many images map it to
127.0.0.1), so `gethostbyname(gethostname())`, the usual answer, is a loopback address on a stock
node. A learner that advertised it told actors on other nodes to dial their own loopback, and gloo,
which picks its interface the same way, paired ranks on different nodes over 127.0.1.1. Here the
host's name is used only where it resolves to an address of a real interface; otherwise the first
non-loopback IPv4 address of an interface that is up. A host with none (a laptop offline) has only
local peers, and gets 127.0.0.1.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct

_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8


def is_loopback(address: str) -> bool:
    """127.0.0.0/8 or ::1 (a literal address; a name is not resolved here)."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def is_wildcard(address: str) -> bool:
    """0.0.0.0 or ::: a server listens on every address, and advertises `advertised_address()`."""
    try:
        return ipaddress.ip_address(address).is_unspecified
    except ValueError:
        return False


def interfaces() -> list[tuple[str, str]]:
    """(interface, IPv4 address) of every interface that is up and is not a loopback, in kernel order."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            packed = struct.pack("256s", name.encode()[:15])
            try:
                flags = struct.unpack("H", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, packed)[16:18])[0]
                if not flags & _IFF_UP or flags & _IFF_LOOPBACK:
                    continue
                address = socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, packed)[20:24])
            except OSError:  # no IPv4 address on it
                continue
            if not is_loopback(address):
                found.append((name, address))
    return found


ONE_MACHINE = "HPCRL_ONE_MACHINE"
"""Set by the local executor's job scripts: every peer of a task runs on this machine, so it dials loopback."""


def advertised_address() -> str:
    """The address of this host that other nodes dial (see the module docstring); loopback where every peer
    is on this machine (the local executor), which keeps its traffic off the machine's network."""
    if os.environ.get(ONE_MACHINE):
        return "127.0.0.1"
    up = interfaces()
    try:
        named = socket.gethostbyname(socket.gethostname())
    except OSError:
        named = ""
    if named and any(address == named for _, address in up):
        return named
    return up[0][1] if up else "127.0.0.1"


def interface_of(address: str) -> str | None:
    """The interface that holds `address`, or None (a loopback address, or not this host's)."""
    return next((name for name, held in interfaces() if held == address), None)


def loopback_problem(host: str) -> str | None:
    """Why `host` (an address or a name, as written in a config) cannot be dialled from another node, or None.
    A name is resolved here: one that resolves to a loopback address on this host is loopback on every host
    that resolves it the same way (every stock Debian node names itself 127.0.1.1)."""
    if is_loopback(host):
        return f"{host} is a loopback address: a process on another node dialling it reaches its own host"
    try:
        resolved = socket.gethostbyname(host)
    except OSError:
        return None  # it may resolve on the cluster's nodes; not ours to judge from here
    if is_loopback(resolved):
        return f"{host} resolves to {resolved} here, a loopback address: a process on another node dialling it reaches its own host"
    return None
