"""An Optuna study's journal file, kept readable when a writer dies in the middle of an append.

Optuna's journal is one JSON record a line, appended under a lock file. A node that dies (or loses
its NFS mount) mid-append leaves a torn last line; Optuna's readers skip it while it is last, but
the next append lands on the same line and makes one record that no reader can decode: every
later open of the study fails. So each append here first looks at the file's last byte, under the
same lock, and moves a torn tail into a side file (`journal.log.torn-<UTC time>-<pid>`, nothing
is deleted) before it writes. The torn record's operation never took effect for any reader, so the
study goes on as if it had not been written. Imported only where a study is used (Optuna is an
optional extra).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.storages.journal._file import BaseJournalFileLock  # the locks' base class (Optuna 4 and 5), not exported

from hpcrl.io import atomic_open

_BLOCK = 1 << 16


class _AlreadyHeld(BaseJournalFileLock):
    """The parent class's lock while `Journal.append_logs` holds the real one (it is not reentrant)."""

    def acquire(self) -> bool:
        return True

    def release(self) -> None:
        pass


class Journal(JournalFileBackend):
    """Optuna's journal file backend whose appends first set aside a torn last record."""

    def __init__(self, path: Path, say: Callable[[str], None]) -> None:
        super().__init__(str(path), lock_obj=_AlreadyHeld())
        self.path, self.say = path, say
        self.lock = JournalFileSymlinkLock(str(path))
        """Optuna's own default lock of this file (`journal.log.lock`, link(2): holds on NFS)."""

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self.lock.acquire()
        try:
            if (side := set_aside_torn_tail(self.path)) is not None:
                self.say(f"{self.path}: its last record was torn (a writer died mid-append); set aside in {side.name}, the study goes on without it")
            super().append_logs(logs)
        finally:
            self.lock.release()


def set_aside_torn_tail(path: Path) -> Path | None:
    """Move the bytes after the last newline into a side file and cut them off; the side file, or
    None when the file ends with a whole record. The caller holds the journal's lock."""
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return None
        cut, end = 0, size
        while end > 0:  # back from the end, a block at a time: a record is short, the journal is not
            start = max(0, end - _BLOCK)
            f.seek(start)
            found = f.read(end - start).rfind(b"\n")
            if found >= 0:
                cut = start + found + 1
                break
            end = start
        f.seek(cut)
        torn = f.read()
        now = time.time_ns()
        side = path.with_name(f"{path.name}.torn-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now // 10**9))}.{now % 10**9:09d}-{os.getpid()}")
        with atomic_open(side, "wb") as keep:  # kept before it is cut: nothing is lost if this dies too
            keep.write(torn)
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    return side


def first_bad_line(path: Path) -> int | None:
    """The number (from 1) of the first complete line that is not a JSON record, if any: damage
    that an append already buried (a torn record with a later one written onto it)."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.endswith(b"\n"):
                return None  # a torn last line: the next append sets it aside
            try:
                json.loads(line)
            except ValueError:
                return number
    return None
