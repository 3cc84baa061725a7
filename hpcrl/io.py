"""Atomic file writes: a killed job must never leave half a checkpoint or half a CSV behind."""

from __future__ import annotations

import csv
import io
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def atomic_open(path: str | Path, mode: str = "w", durable: bool = True) -> Iterator[IO]:
    """Write to a temporary file in the same directory, fsync, then `os.replace` onto `path`.

    The rename alone makes the write all-or-nothing for a killed process; the fsync also keeps it
    through a power loss. `durable=False` drops the fsync for files that are cheap to remake and
    written by the thousand (a sweep's run configs), where one fsync each costs seconds.
    """
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except (FileNotFoundError, NotADirectoryError):
        # The directory is made only when missing (a sweep writes 10,000 files); a file in its
        # place raises here as mkdir words it: FileExistsError naming that file.
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600 files; results are meant to be shared
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str, durable: bool = True) -> None:
    with atomic_open(path, "w", durable) as f:
        f.write(text)


def atomic_write_csv(path: str | Path, header: Sequence[object], rows: Iterable[Sequence[object]]) -> None:
    """A whole CSV table (header, then rows), written atomically."""
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def append_line(path: str | Path, line: str) -> None:
    """Append one complete line in a single write, so a crash leaves whole lines only."""
    with open(path, "a") as f:
        f.write(line if line.endswith("\n") else line + "\n")
        f.flush()


class NotRegularFile(OSError):
    """`read_regular` was given a path that is no regular file; `kind` says what it is ('a directory', 'a FIFO', ...)."""

    def __init__(self, mode: int) -> None:
        self.kind = _file_kind(mode)
        self.is_dir = stat.S_ISDIR(mode)
        super().__init__(self.kind)


class TooLarge(OSError):
    """`read_regular` found more than its `limit` bytes in the file."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"over {limit} bytes")
        self.limit = limit


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "a special file"


def read_regular(path: str | Path, limit: int) -> bytes:
    """A user's file (a config, a Dockerfile) whole, of at most `limit` bytes. It is opened without blocking and
    looked at before it is read, so that /dev/zero (a read that never ends), a FIFO (a read that blocks until a
    writer comes) or a directory is NotRegularFile at once, not a hang, and at most `limit` + 1 bytes are read: a
    larger file (a log or an image given by mistake) is TooLarge, not read into memory. FileNotFoundError and other
    OSErrors, like these two, are left to the caller's line."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(mode)
        with open(fd, "rb", closefd=False) as f:
            raw = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise TooLarge(limit)
    return raw
