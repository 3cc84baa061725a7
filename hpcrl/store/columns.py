"""Two numeric columns of a CSV log (a step and a value), read fast: a run's train.csv and eval_curve.csv
(hpcrl.store.rundir, which owns those files and their names).

`collect` reads thousands of these logs, so a log whose rows are plain decimals is parsed in a few numpy
passes over its bytes, and logs that share a layout are parsed together (`read_many`); anything else is
read line by line. Both give the same floats. A torn last line is dropped (a writer may have been killed
mid-line); a complete line that does not parse is damage, a ValueError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def read_many(paths: Sequence[Path], value_column: str) -> list[tuple[np.ndarray, np.ndarray] | Exception]:
    """`read_columns` of many logs: each log's (step, value) arrays, or the exception `read_columns` raises for it.

    The same arrays, read faster: the logs that share a layout are parsed together, a few
    megabytes per numpy pass, because parsing 400 lines at a time is mostly numpy's overhead per
    call. A batch that is not plain throughout is read log by log, as `read_columns` reads it.
    """
    out: list = [None] * len(paths)
    batches: dict[tuple[int, int, int], list[tuple[int, bytes]]] = {}  # layout -> (log, its rows)

    def parse(columns: tuple[int, int], batch: list[tuple[int, bytes]]) -> None:
        parsed = _plain_columns(b"".join(body for _, body in batch), columns)
        if parsed is None:
            for i, body in batch:
                try:
                    out[i] = _parse_body(body, columns)
                except Exception as exc:  # noqa: BLE001 - handed back, as read_columns would raise it
                    out[i] = exc
            return
        steps, values, kept, row_ends = parsed
        rows = np.diff(np.searchsorted(row_ends, np.cumsum([0] + [len(body) for _, body in batch])))  # each log's rows
        counts = rows if kept is None else np.add.reduceat(kept, np.concatenate([[0], np.cumsum(rows)[:-1]]))
        bounds = np.concatenate([[0], np.cumsum(counts)])
        for (i, _), lo, hi in zip(batch, bounds[:-1], bounds[1:]):
            out[i] = (steps[lo:hi].copy(), values[lo:hi].copy())

    for i, path in enumerate(paths):
        try:
            split = _split_log(path, value_column)
        except Exception as exc:  # noqa: BLE001 - handed back, as read_columns would raise it
            out[i] = exc
            continue
        if not isinstance(split, _Body):
            out[i] = split
            continue
        layout = (*split.columns, split.body[: split.body.find(b"\n")].count(b",") + 1)
        batch = batches.setdefault(layout, [])
        batch.append((i, split.body))
        if len(batch) == _BATCH_RUNS:
            parse(split.columns, batches.pop(layout))
    for (step, value, _), batch in batches.items():
        parse((step, value), batch)
    return out


_BATCH_RUNS = 256
"""Logs parsed together by `read_many`: ~5 MB of 400-row train.csv files."""


@dataclass
class _Body:
    body: bytes
    """The complete data lines, each ending in a newline (at least one)."""
    columns: tuple[int, int]


def _split_log(path: Path, value_column: str) -> tuple[np.ndarray, np.ndarray] | _Body:
    """What `read_columns` does before it parses rows: read, find the columns (raising as it
    raises); the empty answer, or the rows to parse."""
    data = path.read_bytes()
    end = data.rfind(b"\n")
    if end < 0:
        return np.empty(0), np.empty(0)
    first = data.find(b"\n")
    header = data[:first].decode().strip().split(",")
    s, r = header.index("step"), header.index(value_column)
    if first == end:
        return np.empty(0, dtype=float), np.empty(0, dtype=float)
    return _Body(data[first + 1 : end + 1], (s, r))


def read_columns(path: Path, value_column: str) -> tuple[np.ndarray, np.ndarray]:
    """(step, value) of each complete row with a value; a torn last line is dropped, a complete
    line that does not parse (or a header without the columns) is a ValueError."""
    split = _split_log(path, value_column)
    if not isinstance(split, _Body):
        return split
    return _parse_body(split.body, split.columns)


def _parse_body(body: bytes, columns: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    fast = _plain_columns(body, columns)
    if fast is not None:
        return fast[0], fast[1]
    s, r = columns
    steps, values = [], []
    for line in body[:-1].split(b"\n"):
        row = line.split(b",")
        if len(row) > r and row[r].strip():
            steps.append(row[s])
            values.append(row[r])
    return np.asarray(steps, dtype=float), np.asarray(values, dtype=float)


_POW10 = np.array([1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15])
"""Powers of ten, each an exact double (as far as 1e22)."""
_PLACE = 10 ** np.arange(16, -1, -1, dtype=np.int64)
"""The place value of each byte of a field right-aligned in 17 bytes."""


def _plain_columns(body: bytes, columns: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray] | None:
    """`read_columns`' rows, parsed in a few numpy passes over the bytes; None unless every row
    has as many fields as the first, the two columns hold plain decimals (an optional minus, at most
    15 digits, at most one point, no exponent or blank) and no value is empty; then the answer is
    the line-by-line parser's, float for float, and otherwise that parser runs (and words the errors).

    Same floats: a plain decimal of at most 15 digits is an integer m < 2**53 over a power of ten
    10**d <= 1e15, both exact doubles, so the one IEEE division m / 10**d is the correctly rounded
    value of the decimal, which is what Python's float() (and numpy's, after it) return. `body` is
    the complete data lines, each ending in a newline. A row whose value is empty is skipped, as
    there; an empty step is an error there, so it leaves this path.
    """
    a = np.frombuffer(body, dtype=np.uint8)
    # The byte after each field is a ',' (44) or a newline (10). One pass finds every byte at or below
    # ',': in a plain log only those two; any other (a space, a quote, '+', a carriage return) leaves
    # this path. The checks then run on the field ends, a fraction of the bytes.
    ends = np.flatnonzero(a <= 44)
    at = a[ends]
    newline = at == 10
    width = body[: body.find(b"\n")].count(b",") + 1
    rows = ends.size // width
    if rows * width != ends.size or max(columns) >= width or np.count_nonzero(newline) != rows or not newline[width - 1 :: width].all():
        return None  # rows of different lengths: the newlines are not exactly every width-th field end
    if not (newline | (at == 44)).all():
        return None
    row_ends = ends[width - 1 :: width]
    step, value = columns
    end = np.concatenate([ends[step::width], ends[value::width]])
    length = end - np.concatenate([_field_starts(ends, step, width), _field_starts(ends, value, width)])
    kept = None
    if not length[rows:].all():  # rows without a value are skipped
        kept = length[rows:] > 0
        both = np.concatenate([kept, kept])
        end, length = end[both], length[both]
    n = end.size // 2
    if n == 0:
        return np.empty(0, dtype=float), np.empty(0, dtype=float), kept, row_ends
    longest = int(length.max())
    if longest > 17 or not length.min():
        return None
    # Each field right-aligned in `longest` bytes, one field per column of `chars`; bytes before
    # the field's start (and a leading sign) read as '0', which adds nothing.
    offsets = np.arange(-longest, 0)[:, None]
    chars = a[np.maximum(end + offsets, 0)]
    chars[offsets < -length] = 48
    first = a[end - length]
    signed = first == 45  # a '+' never gets here (it is below ',')
    if signed.any():
        chars[longest - length[signed], np.flatnonzero(signed)] = 48
    digits = chars - 48  # uint8: a point becomes 254, anything else but a digit > 9
    point = digits == 254
    points = point.sum(axis=0)
    n_digits = length - signed - points
    if ((digits > 9) & ~point).any() or points.max() > 1 or n_digits.max() > 15 or n_digits.min() < 1:
        return None
    digits[point] = 0
    # Every byte at its place, the point included, and the places right of the point (0 without one):
    # a multiply-add per byte position (at most 17), where an integer matmul has no BLAS behind it.
    total = np.zeros(n * 2, dtype=np.int64)
    decimals = np.zeros(n * 2, dtype=np.int64)
    for k in range(longest):
        total += digits[k].astype(np.int64) * int(_PLACE[17 - longest + k])
        decimals += point[k] * (longest - 1 - k)
    tail = 10 ** (decimals + 1)  # what lies right of the point stays; what lies left moves one place down
    low = total % tail
    mantissa = np.where(points > 0, (total - low) // 10 + low, total)
    numbers = mantissa.astype(np.float64) / _POW10[decimals]
    numbers[signed] = -numbers[signed]
    return numbers[:n], numbers[n:], kept, row_ends


def _field_starts(ends: np.ndarray, column: int, width: int) -> np.ndarray:
    """Where each row's field `column` starts: after the field end before it (the previous row's
    newline for the first column; the first row's first field starts at 0)."""
    if column:
        return ends[column - 1 :: width] + 1
    starts = np.empty(ends.size // width, dtype=ends.dtype)
    starts[0] = 0
    starts[1:] = ends[width - 1 : -1 : width] + 1
    return starts
