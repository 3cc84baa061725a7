"""A private `redis-server` for one learner job: free port, random password, no persistence.

Why the learner starts its own: a batch job cannot assume a service on the cluster, and a server
that lives and dies with the learner needs no cleanup. Why these settings:

- the configuration (password included) goes in on stdin (`redis-server -`), so the password is
  not on the command line where `ps` shows it to every user of the node;
- `save ""` and `appendonly no`: the queue is transient and the learner's checkpoint holds what
  must survive; a snapshot of a full queue would only stall the server;
- the port is picked by binding port 0 and released just before the server binds it; the small
  race with another process is handled by retrying on "Address already in use";
- the child gets PR_SET_PDEATHSIG, so a learner killed with SIGKILL does not leave its server
  listening on the node.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

from hpcrl.netaddr import advertised_address, is_wildcard
from hpcrl.runtime.lifeline import die_with_parent


class RedisServerError(RuntimeError):
    """redis-server is missing or would not start; the message says why."""


def resolve_bind(bind: str) -> tuple[str, str]:
    """(address to listen on, address to advertise) for `distributed.redis.bind`. `auto`: the address other
    nodes reach this one at (hpcrl.netaddr: never the loopback address a stock node's name resolves to); a
    wildcard (0.0.0.0) listens on every address and advertises that one."""
    if bind == "auto":
        address = advertised_address()
        return address, address
    if is_wildcard(bind):
        return bind, advertised_address()
    return bind, bind


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent(parent: int) -> None:
    """Runs in the child between fork and exec: SIGTERM it when the learner dies, and ignore the
    scheduler's warnings. Grid Engine sends USR1 (and USR2) to every process of a job, and a
    redis-server killed by it (the default action; Redis sets no handler) took the learner's board
    away just as the learner was checkpointing for its requeue; an ignored signal stays ignored across exec."""
    die_with_parent(signal.SIGTERM, parent)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class RedisServer:
    """Start with `start()`, stop with `stop()` (or use as a context manager)."""

    def __init__(self, bind: str = "127.0.0.1", executable: str = "redis-server", log_path: Path | None = None, startup_timeout: float = 15.0) -> None:
        self.bind, self.host = resolve_bind(bind)
        self.executable = executable
        self.log_path = log_path
        self.startup_timeout = startup_timeout
        self.port = 0
        self.password = ""
        self.proc: subprocess.Popen | None = None

    def start(self) -> RedisServer:
        exe = shutil.which(self.executable)
        if exe is None:
            raise RedisServerError(
                f"{self.executable}: not found on PATH; install the Debian/Ubuntu package redis-server "
                "(the image built by `hpcrl build-image` with image.extras: [distributed] has it), "
                "or set distributed.redis.address to an external Redis"
            )
        last = ""
        for _ in range(5):
            self.port, self.password = free_port(self.bind), secrets.token_urlsafe(32)
            log = self.log_path.open("ab") if self.log_path else subprocess.DEVNULL
            try:
                self.proc = subprocess.Popen(
                    [exe, "-"], stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, preexec_fn=functools.partial(_die_with_parent, os.getpid()),
                )
            finally:
                if self.log_path:
                    log.close()
            config = (
                f"port {self.port}\nbind {self.bind}\nrequirepass {self.password}\n"
                'save ""\nappendonly no\ndaemonize no\nprotected-mode yes\nlogfile ""\n'
            )
            assert self.proc.stdin is not None
            self.proc.stdin.write(config.encode())
            self.proc.stdin.close()
            ok, last = self._wait_ready()
            if ok:
                return self
            self.stop()
            if "in use" not in last:
                break
        raise RedisServerError(f"redis-server did not start on {self.bind}: {last or 'no answer'}" + (f" (log: {self.log_path})" if self.log_path else ""))

    def _wait_ready(self) -> tuple[bool, str]:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout
        client = self.client(socket_timeout=1.0)
        last = ""
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    tail = self.log_path.read_text(errors="replace")[-400:] if self.log_path and self.log_path.exists() else ""
                    return False, f"exited with {self.proc.returncode}; {tail.strip().splitlines()[-1] if tail.strip() else ''}"
                try:
                    client.ping()
                    return True, ""
                except redis.exceptions.BusyLoadingError:
                    pass
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                    last = str(exc)
                time.sleep(0.02)
            return False, f"no answer within {self.startup_timeout:g} s ({last})"
        finally:
            client.close()

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, password=self.password, **kwargs)

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the server (SIGTERM; it saves nothing), SIGKILL if it does not go."""
        if self.proc is None or self.proc.poll() is not None:
            self.proc = None
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
