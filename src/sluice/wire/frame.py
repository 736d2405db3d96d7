"""The Sluice frame, format version 2: what every message on every link is wrapped in.

Layout (all integers little-endian)::

    offset  size  field
    0       1     magic 0x53 ("S")
    1       1     format version (2)
    2       1     kind: which message the body holds (see the registry below)
    3       ...   body, laid out as its kind says
    -4      4     CRC-32 of every byte before it

so a frame costs :data:`FRAME_OVERHEAD` = 7 bytes around its body. Per-message options (value type,
compression, index coding...) live in the body of the kinds that have them.

Kinds are one byte; the registry maps each id to a name. The kinds of this build::

    id   name      body laid out in
    1    dense     :mod:`sluice.wire.vector`
    2    sparse    :mod:`sluice.wire.vector`
    3    sketch    :mod:`sluice.wire.vector`
    4    chain     :mod:`sluice.wire.vector` (patch chain)
    5    buffers   :mod:`sluice.wire.buffers` (a message with the model's buffers beside it)
    16   tensor    :mod:`sluice.wire.tensor`
    17   control   :mod:`sluice.wire.tensor`
    18   raw       :mod:`sluice.wire.tensor`

Id 0 is never assigned; the other free ids are room for new kinds (:func:`register_kind`) without a
format break: a reader that does not know a kind refuses it by number.

Version 1 of the format is refused with a message saying so: its vector payloads began with 0x53 0x01
(the kind sat in the low bits of a flags byte) and its split-training frames with ``"SLT"`` (0x53 0x4C
0x54) followed by a version, kind and reserved byte and the CRC-32 of the body.

Integers of variable size are unsigned LEB128 varints (:func:`varint`, :func:`read_varint`): 7 bits per
byte, low group first, the high bit set on every byte but the last, minimal length, below ``2**64``.
"""

from __future__ import annotations

import struct
import zlib

from sluice.errors import WireError

MAGIC = 0x53
VERSION = 2
HEADER = 3
"""Bytes before the body: magic, version, kind."""
TRAILER = 4
"""Bytes after the body: the CRC-32."""
FRAME_OVERHEAD = HEADER + TRAILER
"""Bytes a frame adds to its body."""

_OLD_VERSION = 1
_OLD_SPLIT_MAGIC = b"SLT"
_CRC = struct.Struct("<I")
_MAX_VARINT_BYTES = 10

# ------------------------------------------------------------------------------------------- kind registry
_KINDS: dict[int, str] = {}


def register_kind(kind: int, name: str) -> int:
    """Add kind ``kind`` (1..255) called ``name`` to the registry and return ``kind``.

    Raises ``ValueError`` when the id or the name is taken (a kind is registered once) or out of range.
    """
    if isinstance(kind, bool) or not isinstance(kind, int) or not 1 <= kind <= 255:
        raise ValueError(f"a message kind is an integer in [1, 255], got {kind!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a message kind needs a non-empty name, got {name!r}")
    if kind in _KINDS:
        raise ValueError(f"message kind {kind} is already registered as {_KINDS[kind]!r}")
    if name in _KINDS.values():
        taken = next(k for k, v in _KINDS.items() if v == name)
        raise ValueError(f"message kind name {name!r} is already registered with id {taken}")
    _KINDS[kind] = name
    return kind


def kind_name(kind: int) -> str:
    """The name of a registered kind; :class:`WireError` naming the kind's number when there is none."""
    try:
        return _KINDS[kind]
    except KeyError:
        known = ", ".join(f"{k} ({v})" for k, v in sorted(_KINDS.items()))
        raise WireError(f"unknown message kind {kind}: this build reads kinds {known}") from None


def kinds() -> dict[int, str]:
    """A copy of the registry: kind id -> name."""
    return dict(_KINDS)


KIND_DENSE = register_kind(1, "dense")
KIND_SPARSE = register_kind(2, "sparse")
KIND_SKETCH = register_kind(3, "sketch")
KIND_CHAIN = register_kind(4, "chain")
KIND_BUFFERS = register_kind(5, "buffers")
KIND_TENSOR = register_kind(16, "tensor")
KIND_CONTROL = register_kind(17, "control")
KIND_RAW = register_kind(18, "raw")


# ------------------------------------------------------------------------------------------------ varints
def varint(n: int) -> bytes:
    """Unsigned LEB128 encoding of ``0 <= n < 2**64``."""
    if isinstance(n, bool) or not 0 <= n < 2**64:
        raise WireError(f"a varint holds an integer in [0, 2**64), got {n!r}")
    n = int(n)
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_varint(buf: bytes | bytearray | memoryview, pos: int, field: str, *, reserve: int = 0) -> tuple[int, int]:
    """Read the varint ``field`` at ``buf[pos]``; return it and the position after it.

    ``reserve`` bytes must remain after the varint (a frame's trailer): a buffer that ends before raises
    :class:`WireError` saying it is truncated; so does an unterminated, overlong or non-minimal varint.
    """
    n = 0
    start = pos
    end = len(buf) - reserve
    for i in range(_MAX_VARINT_BYTES):
        if pos >= end:
            raise WireError(
                f"message truncated: expected at least {pos + 1 + reserve} bytes, got {len(buf)} "
                f"(varint {field} at offset {start} is cut off)"
            )
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            if b == 0 and i > 0:
                raise WireError(f"malformed varint {field} at offset {start}: not minimally encoded")
            if n >= 2**64:
                raise WireError(f"malformed varint {field} at offset {start}: exceeds 64 bits")
            return n, pos
    raise WireError(f"malformed varint {field} at offset {start}: longer than 64 bits")


# -------------------------------------------------------------------------------------------------- frames
def frame(kind: int, body: bytes | bytearray | memoryview, *more: bytes | bytearray | memoryview) -> bytes:
    """The frame of a registered ``kind`` around ``body`` (and ``more`` body parts, appended in order)."""
    kind_name(kind)
    head = bytes((MAGIC, VERSION, kind))
    crc = zlib.crc32(body, zlib.crc32(head))
    for part in more:
        crc = zlib.crc32(part, crc)
    return b"".join((head, body, *more, _CRC.pack(crc)))


def check_header(buf: bytes | bytearray | memoryview) -> int:
    """Check magic and version at the start of ``buf`` and return its kind byte (not yet validated).

    Old-format (version 1) messages raise :class:`WireError` saying so; so does a buffer too short for
    a frame. The CRC is not checked here (see :func:`check_crc`).
    """
    n = len(buf)
    if n >= 1 and buf[0] != MAGIC:
        raise WireError(f"not a Sluice message: first byte (magic) is 0x{buf[0]:02x}, expected 0x{MAGIC:02x}")
    if n >= 2 and buf[1] != VERSION:
        if buf[1] == _OLD_VERSION:
            raise WireError(
                f"old Sluice wire format (version 1, vector payload) that this build no longer reads; "
                f"this build reads version {VERSION}: re-encode it with this build"
            )
        if buf[1] == _OLD_SPLIT_MAGIC[1]:
            raise WireError(
                f"old Sluice wire format (version 1, split-training 'SLT' frame) that this build no longer "
                f"reads; this build reads version {VERSION}: both parties must run a version-{VERSION} build"
            )
        raise WireError(f"unsupported version {buf[1]} (this build reads {VERSION})")
    if n < FRAME_OVERHEAD:
        raise WireError(f"message truncated: expected at least {FRAME_OVERHEAD} bytes, got {n}")
    return buf[2]


def check_crc(buf: bytes | bytearray | memoryview) -> None:
    """Raise :class:`WireError` unless the trailer of ``buf`` is the CRC-32 of every byte before it."""
    n = len(buf)
    if n < TRAILER:
        raise WireError(f"message truncated: expected at least {FRAME_OVERHEAD} bytes, got {n}")
    view = memoryview(buf)
    (stored,) = _CRC.unpack_from(view, n - TRAILER)
    computed = zlib.crc32(view[: n - TRAILER])
    if stored != computed:
        raise WireError(
            f"checksum mismatch (stored 0x{stored:08x}, computed 0x{computed:08x}): "
            f"the {n}-byte message is corrupted or truncated"
        )


def unframe(buf: bytes | bytearray | memoryview) -> tuple[int, memoryview]:
    """``(kind, body)`` of a frame; magic, version, CRC and kind are checked before the body is returned.

    The body is a view into ``buf`` (no copy). Anything wrong raises :class:`WireError`.
    """
    kind = check_header(buf)
    check_crc(buf)
    kind_name(kind)
    return kind, memoryview(buf)[HEADER : len(buf) - TRAILER]

