"""State as bytes: how the engines (the HFL halves and simulator, the local and split trainers) save and
restore what they carry between iterations: their checkpoints.

A state is a tree of dicts (string keys), lists, tuples, ``None``, booleans, integers (any size), floats,
strings, bytes and numpy arrays. Layout::

    offset  size  field
    0       4     magic b"SLST"
    4       1     version (1)
    5       ...   LEB128 varint n, then n bytes of UTF-8 JSON: the tree, each array replaced by
                  {"@array": [dtype, shape, offset, nbytes]}, each tuple by {"@tuple": [...]} and
                  each bytes object by {"@bytes": <its uint8 array>}
    ...     ...   the arrays' bytes (C order, little-endian), at their offsets from here
    -4      4     CRC-32 of every byte before it

Floats travel as JSON numbers written by ``repr`` (exact for float64, NaN and ±inf included), so
``unpack(pack(t))`` equals ``t`` bit for bit, and the same tree always gives the same bytes. Nothing is
unpickled: bytes from elsewhere can only yield such a tree or raise :class:`sluice.errors.WireError`.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np

from sluice.errors import WireError
from sluice.wire.frame import read_varint, varint

MAGIC = b"SLST"
VERSION = 1
_CRC = struct.Struct("<I")
_ARRAY, _TUPLE, _BYTES = "@array", "@tuple", "@bytes"


def pack(tree: Any) -> bytes:
    """The bytes of a state tree (see the module docstring)."""
    blobs: list[bytes] = []
    offset = 0

    def walk(x: Any) -> Any:
        nonlocal offset
        if isinstance(x, np.ndarray):
            arr = np.ascontiguousarray(x)
            if arr.dtype.hasobject:
                raise TypeError("a state array cannot hold Python objects")
            blob = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
            ref = {_ARRAY: [arr.dtype.newbyteorder("<").str, list(arr.shape), offset, len(blob)]}
            blobs.append(blob)
            offset += len(blob)
            return ref
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                raise TypeError("state dicts need string keys")
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return {_TUPLE: [walk(v) for v in x]}
        if isinstance(x, bytes):
            return {_BYTES: walk(np.frombuffer(x, dtype=np.uint8))}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, np.generic):
            return x.item()
        if x is None or isinstance(x, bool | int | float | str):
            return x
        raise TypeError(f"cannot put a {type(x).__name__} into a state")

    head = json.dumps(walk(tree), separators=(",", ":"), allow_nan=True).encode()
    body = b"".join((MAGIC, bytes([VERSION]), varint(len(head)), head, *blobs))
    return body + _CRC.pack(zlib.crc32(body))


def unpack(buf: bytes) -> Any:
    """The tree :func:`pack` made ``buf`` from; :class:`WireError` for anything else."""
    view = memoryview(buf)
    if len(view) < len(MAGIC) + 6 or bytes(view[:4]) != MAGIC:
        raise WireError("not a Sluice state: it must start with b'SLST' and end with a CRC-32")
    if view[4] != VERSION:
        raise WireError(f"unsupported state version {view[4]} (this build reads {VERSION})")
    (stored,) = _CRC.unpack_from(view, len(view) - 4)
    if zlib.crc32(view[:-4]) != stored:
        raise WireError(f"state checksum mismatch: the {len(view)}-byte state is corrupted or truncated")
    n, pos = read_varint(view, 5, "header length", reserve=4)
    if pos + n > len(view) - 4:
        raise WireError(f"state truncated: header of {n} bytes does not fit")
    try:
        tree = json.loads(bytes(view[pos:pos + n]))
    except ValueError as exc:
        raise WireError(f"state header is not valid JSON: {exc}") from None
    data = view[pos + n:len(view) - 4]

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            if _ARRAY in x:
                dtype, shape, off, nbytes = x[_ARRAY]
                dt = np.dtype(dtype)
                if dt.hasobject or off < 0 or off + nbytes > len(data):
                    raise WireError(f"state array {dtype}{shape} does not fit the {len(data)} bytes of data")
                arr = np.frombuffer(data[off:off + nbytes], dtype=dt)
                return arr.reshape(shape).astype(dt.newbyteorder("="), copy=True)
            if _TUPLE in x:
                return tuple(walk(v) for v in x[_TUPLE])
            if _BYTES in x:
                return walk(x[_BYTES]).tobytes()
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    try:
        return walk(tree)
    except (TypeError, ValueError) as exc:
        raise WireError(f"malformed state: {exc}") from None


def field(tree: Any, kind: str, *keys: str) -> list[Any]:
    """The values of ``keys`` in a state tree whose ``"kind"`` is ``kind``; :class:`WireError` otherwise."""
    if not isinstance(tree, dict) or tree.get("kind") != kind:
        got = tree.get("kind") if isinstance(tree, dict) else type(tree).__name__
        raise WireError(f"expected the state of {kind}, got the state of {got}")
    missing = [k for k in keys if k not in tree]
    if missing:
        raise WireError(f"the state of {kind} lacks {', '.join(missing)}")
    return [tree[k] for k in keys]
