"""Update messages of the published compression methods (:mod:`sluice.hfl.baselines`): ternary and quantised codes.

An update message is a raw frame (:mod:`sluice.wire.frame`, kind 18) holding a list of per-round updates of
a ``d``-vector, to be applied in order. Body: the tag byte (which code the entries use: :data:`TAG_TERNARY`
or :data:`TAG_QSGD`), varint ``d``, varint ``n``, then ``n`` times (varint length, entry). An empty entry is
a round in which the server changed nothing.

- ternary entry (STC): ``varint k | μ (fp32) | k sign bits (1 = negative, MSB first, zero padding) |
  Golomb-Rice gaps`` (the index coding of :mod:`sluice.wire.vector`);
- QSGD entry: ``varint s | varint B | ⌈d/B⌉ fp32 norms | d int8 levels`` (one signed byte per coordinate).

Anything else raises :class:`sluice.errors.WireError`.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from sluice.errors import WireError
from sluice.wire.frame import KIND_RAW, check_header, frame, read_varint, unframe, varint
from sluice.wire.vector import rice_decode, rice_encode

TAG_TERNARY = b"T"
"""Tag of a message whose entries are ternary (STC) updates."""
TAG_QSGD = b"Q"
"""Tag of a message whose entries are QSGD-quantised updates."""

_F32 = struct.Struct("<f")


def is_update_message(message: bytes) -> bool:
    """Whether ``message`` is a raw frame (an update message) rather than a vector payload."""
    return check_header(message) == KIND_RAW


def pack_updates(tag: bytes, d: int, entries: list[bytes]) -> bytes:
    """An update message: ``entries`` coded as ``tag`` says, for a ``d``-vector (see the module docstring)."""
    return frame(KIND_RAW, tag + varint(d) + varint(len(entries)), *(varint(len(e)) + e for e in entries))


def unpack_updates(buf: bytes, tag: bytes, d: int) -> list[bytes]:
    """The entries of a :func:`pack_updates` message; :class:`WireError` for anything else."""
    kind, view = unframe(buf)
    if kind != KIND_RAW:
        raise WireError(f"expected a raw frame of updates, got message kind {kind}")
    body = bytes(view)
    if body[:1] != tag:
        raise WireError(f"expected updates coded {tag!r}, got {body[:1]!r}")
    got, pos = read_varint(body, 1, "d")
    if got != d:
        raise WireError(f"the updates describe a vector of length {got}, expected {d}")
    n, pos = read_varint(body, pos, "n")
    out = []
    for _ in range(n):
        size, pos = read_varint(body, pos, "entry length")
        if pos + size > len(body):
            raise WireError(f"update entry truncated: {size} bytes announced, {len(body) - pos} left")
        out.append(body[pos:pos + size])
        pos += size
    if pos != len(body):
        raise WireError(f"updates message has {len(body) - pos} trailing bytes")
    return out


def ternary_entry(idx: np.ndarray, neg: np.ndarray, mu: np.float32) -> bytes:
    """``varint k | μ (fp32) | k sign bits (1 = negative, MSB first, zero padding) | Golomb-Rice gaps``."""
    return varint(int(idx.size)) + _F32.pack(float(mu)) + np.packbits(neg.astype(np.uint8)).tobytes() + \
        rice_encode(idx)


def read_ternary(entry: bytes, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, fp32 values) of a ternary entry."""
    k, pos = read_varint(entry, 0, "k")
    if k > d:
        raise WireError(f"ternary update keeps {k} of {d} coordinates")
    nsign = (k + 7) // 8
    if len(entry) < pos + 4 + nsign + 1:
        raise WireError(f"ternary update truncated: {len(entry)} bytes cannot hold {k} signs and positions")
    (mu,) = _F32.unpack_from(entry, pos)
    if not math.isfinite(mu):
        raise WireError(f"ternary update has a non-finite magnitude {mu}")
    pos += 4
    bits = np.unpackbits(np.frombuffer(entry, dtype=np.uint8, count=nsign, offset=pos))
    if np.any(bits[k:]):
        raise WireError("ternary update: sign padding bits are set")
    idx = rice_decode(entry[pos + nsign:], k, d)
    mu32 = np.float32(mu)
    return idx, np.where(bits[:k].astype(bool), -mu32, mu32).astype(np.float32)


def qsgd_entry(norms: np.ndarray, q: np.ndarray, levels: int, bucket: int) -> bytes:
    """``varint s | varint B | ⌈d/B⌉ fp32 norms | d int8 levels`` (one signed byte per coordinate)."""
    return varint(levels) + varint(bucket) + norms.astype("<f4").tobytes() + q.astype(np.int8).tobytes()


def read_qsgd(entry: bytes, d: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(fp32 bucket norms, int8 levels, s, B) of a QSGD entry, checked: norms finite and ≥ 0, levels within s."""
    levels, pos = read_varint(entry, 0, "levels")
    bucket, pos = read_varint(entry, pos, "bucket")
    if not 1 <= levels <= 127 or bucket < 1:
        raise WireError(f"QSGD entry with s={levels}, B={bucket} (need 1 <= s <= 127, B >= 1)")
    nb = -(-d // bucket)
    if len(entry) != pos + 4 * nb + d:
        raise WireError(f"QSGD entry is {len(entry)} bytes, expected {pos + 4 * nb + d} for d={d}, B={bucket}")
    norms = np.frombuffer(entry, dtype="<f4", count=nb, offset=pos).astype(np.float32)
    q = np.frombuffer(entry, dtype=np.int8, count=d, offset=pos + 4 * nb)
    if not np.isfinite(norms).all() or np.any(norms < 0) or np.any(np.abs(q.astype(np.int16)) > levels):
        raise WireError("QSGD entry: a norm is negative or not finite, or a level exceeds s")
    return norms, q, levels, bucket
