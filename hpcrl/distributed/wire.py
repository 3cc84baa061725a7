"""The one format that crosses the network: a fixed header, a field table, raw numpy buffers.

Why not pickle: a learner that unpickles what an actor (or anything else that can reach the port)
sends runs that sender's code. Why not JSON or msgpack: a batch is a few large arrays, and copying
them through a generic serializer costs more than moving them. Here a message is

    header   struct "<4sBBHQIII" (28 bytes, little-endian)
             magic b"HPRL", format version, kind (1 = batch of transitions, 2 = parameters),
             number of fields, parameter version, sender (actor index), sequence number,
             length of the field table in bytes
    table    per field: struct "<B2sB" (name length, dtype code such as b"f4", ndim),
             the ASCII name, then ndim little-endian uint32 dimensions
    body     each field's bytes in C order, in table order, no padding

The decoder checks every count against hard limits and the total length against the table
before it touches the body, and returns read-only arrays that view the message (no copy). The
table of a stream of batches is the same message after message, so its parsed layout is cached,
and a decoded message carries it (`Message.layout`): a schema check already passed for that very
layout need not be repeated (ApexLearner.validate), since names, dtypes and shapes are all in it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"HPRL"
FORMAT_VERSION = 1
BATCH, PARAMS = 1, 2
HEADER = struct.Struct("<4sBBHQIII")
_FIELD = struct.Struct("<B2sB")

MAX_FIELDS = 256
MAX_NDIM = 8
MAX_NAME = 128
MAX_BYTES = 1 << 31
"""Largest message accepted (2 GiB, far above any batch or network): a bound, not a target."""
DTYPES = frozenset({"f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"})
"""Plain numeric dtypes only: an object dtype would make numpy unpickle."""


class MalformedMessage(ValueError):
    """A message that is not in this format or breaks its limits; the text says what was wrong."""


@dataclass(frozen=True)
class _Layout:
    """A parsed field table: names, dtypes, shapes and body offsets."""

    entries: tuple[tuple[str, np.dtype, tuple[int, ...], int, int], ...]
    body_len: int


@dataclass(frozen=True)
class Message:
    kind: int
    version: int
    """Parameter version: the one a batch was produced with, or the one a parameter blob holds."""
    sender: int
    seq: int
    fields: dict[str, np.ndarray]
    layout: _Layout | None = field(default=None, compare=False, repr=False)
    """The parsed field table the fields were decoded by (the same object for the same table while it
    is cached), or None for a message not made by `decode`."""


_LAYOUTS: dict[bytes, _Layout] = {}
_TABLES: dict[tuple, bytes] = {}
_CACHE_SIZE = 64


def dtype_code(dtype: np.dtype) -> str:
    code = f"{dtype.kind}{dtype.itemsize}"
    if code not in DTYPES:
        raise TypeError(f"dtype {dtype} cannot be sent: expected one of {', '.join(sorted(DTYPES))}")
    return code


def _table(names: tuple[str, ...], arrays: list[np.ndarray]) -> bytes:
    key = (names, tuple((a.dtype.str, a.shape) for a in arrays))
    table = _TABLES.get(key)
    if table is None:
        parts = []
        for name, a in zip(names, arrays):
            raw = name.encode("ascii")
            if not 0 < len(raw) <= MAX_NAME or a.ndim > MAX_NDIM:
                raise ValueError(f"field {name!r}: names are 1..{MAX_NAME} ASCII characters and arrays have at most {MAX_NDIM} dimensions")
            parts += [_FIELD.pack(len(raw), dtype_code(a.dtype).encode(), a.ndim), raw, struct.pack(f"<{a.ndim}I", *a.shape)]
        table = b"".join(parts)
        if len(_TABLES) >= _CACHE_SIZE:
            _TABLES.clear()
        _TABLES[key] = table
    return table


def encode(kind: int, version: int, sender: int, seq: int, fields: Mapping[str, np.ndarray]) -> bytes:
    """One message from named arrays (any numeric dtype; made little-endian and contiguous)."""
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"at most {MAX_FIELDS} fields per message, got {len(fields)}")
    names = tuple(fields)
    arrays = []
    for a in fields.values():
        a = np.asarray(a)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        arrays.append(np.ascontiguousarray(a))
    table = _table(names, arrays)
    header = HEADER.pack(MAGIC, FORMAT_VERSION, kind, len(names), version, sender, seq & 0xFFFFFFFF, len(table))
    return b"".join([header, table, *(a.data for a in arrays)])


def _parse_table(table: bytes, nfields: int) -> _Layout:
    entries = []
    pos, offset = 0, 0
    for _ in range(nfields):
        if pos + _FIELD.size > len(table):
            raise MalformedMessage("field table is truncated")
        name_len, code, ndim = _FIELD.unpack_from(table, pos)
        pos += _FIELD.size
        try:
            code_text = code.decode("ascii")
        except UnicodeDecodeError:
            code_text = "?"
        if code_text not in DTYPES:
            raise MalformedMessage(f"dtype code {code!r} is not allowed")
        if not 0 < name_len <= MAX_NAME or ndim > MAX_NDIM:
            raise MalformedMessage(f"field name length {name_len} or ndim {ndim} out of bounds")
        end = pos + name_len + 4 * ndim
        if end > len(table):
            raise MalformedMessage("field table is truncated")
        try:
            name = table[pos : pos + name_len].decode("ascii")
        except UnicodeDecodeError:
            raise MalformedMessage("field name is not ASCII") from None
        shape = struct.unpack_from(f"<{ndim}I", table, pos + name_len)
        pos = end
        dtype = np.dtype("<" + code_text if code_text[0] != "b" else "?")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > MAX_BYTES or offset + nbytes > MAX_BYTES:
            raise MalformedMessage(f"field {name!r} claims {nbytes} bytes")
        entries.append((name, dtype, tuple(shape), offset, nbytes))
        offset += nbytes
    if pos != len(table):
        raise MalformedMessage("field table has trailing bytes")
    if len({e[0] for e in entries}) != len(entries):
        raise MalformedMessage("field names repeat")
    return _Layout(tuple(entries), offset)


def decode(data: bytes | memoryview) -> Message:
    """Parse and check a message; raise MalformedMessage for anything else (never unpickle)."""
    if len(data) < HEADER.size:
        raise MalformedMessage(f"{len(data)} bytes is shorter than the {HEADER.size}-byte header")
    magic, fmt, kind, nfields, version, sender, seq, table_len = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise MalformedMessage(f"bad magic {bytes(magic)!r} (not an hpcrl message; a pickle starts with b'\\x80')")
    if fmt != FORMAT_VERSION:
        raise MalformedMessage(f"format version {fmt}, expected {FORMAT_VERSION}")
    if kind not in (BATCH, PARAMS):
        raise MalformedMessage(f"unknown message kind {kind}")
    if nfields > MAX_FIELDS or HEADER.size + table_len > len(data):
        raise MalformedMessage(f"{nfields} fields / {table_len}-byte table do not fit a {len(data)}-byte message")
    table = bytes(data[HEADER.size : HEADER.size + table_len])
    layout = _LAYOUTS.get(table)
    if layout is None:
        layout = _parse_table(table, nfields)
        if len(_LAYOUTS) >= _CACHE_SIZE:
            _LAYOUTS.clear()
        _LAYOUTS[table] = layout
    elif len(layout.entries) != nfields:
        raise MalformedMessage("header and field table disagree on the number of fields")
    start = HEADER.size + table_len
    if len(data) != start + layout.body_len:
        raise MalformedMessage(f"body is {len(data) - start} bytes, the field table describes {layout.body_len}")
    fields = {name: np.ndarray(shape, dtype, buffer=data, offset=start + offset) for name, dtype, shape, offset, _ in layout.entries}
    return Message(kind, version, sender, seq, fields, layout)


def check_fields(fields: Mapping[str, np.ndarray], expected: Mapping[str, tuple[np.dtype, tuple[int, ...]]], leading: bool) -> None:
    """Check names, dtypes and shapes against a schema (with a free leading dimension if `leading`).

    Why: a well-formed message can still be wrong for this run (another env, another network);
    it must be rejected here, not crash an update or load garbage into a policy later.
    """
    if set(fields) != set(expected):
        raise MalformedMessage(f"fields {sorted(fields)} differ from the expected {sorted(expected)}")
    for name, (dtype, shape) in expected.items():
        a = fields[name]
        got = a.shape[1:] if leading else a.shape
        if a.dtype != dtype or got != tuple(shape) or (leading and a.ndim == 0):
            raise MalformedMessage(f"field {name!r} is {a.dtype}{list(a.shape)}, expected {np.dtype(dtype)}{['N', *shape] if leading else list(shape)}")
