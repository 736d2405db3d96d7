"""Vector payloads of federated training, over the Sluice frame (format version 2, :mod:`sluice.wire.frame`).

Four payload kinds travel:

* :class:`DensePayload` -- a full vector of ``d`` values;
* :class:`SparsePayload` -- ``k`` values at ``k`` of ``d`` coordinates, with either explicit indices or a
  64-bit seed from which the receiver regenerates them (rand-k), and a scale ``s`` the receiver applies
  (the estimate is ``s * values`` scattered at the indices);
* :class:`SketchPayload` -- a ``rows x cols`` count-sketch table of a ``d``-vector plus its hash seed;
* :class:`PatchChain` -- an ordered list of sparse patches the receiver *adds* one after another (the
  downlink's per-round server updates; a sample upload whose values travel in two codings);
* :class:`ReplayChain` -- the same with server momentum replayed by the receiver on one block of
  coordinates (a patch chain with flag bit 1 set, below).

Message layout (all integers little-endian)::

    offset  size  field
    0       1     magic 0x53 ("S")                                   \\
    1       1     format version (2)                                  | frame header
    2       1     kind (1 dense, 2 sparse, 3 sketch, 4 patch chain)  /
    3       1     flags: bits 0-1 value coding (0 float, 1 int8 times a float32 scale, 2 sign bits
                                  times a float32 scale; 3 reserved)
                         bit  2   float value dtype (0 fp32, 1 fp16; see sluice.wire.dtypes), 0 when scaled
                         bit  3   body is zstd-compressed (magicless frame)
                         bits 4-5 index coding, sparse only (0 seed, 1 Golomb-Rice, 2 bitmap, 3 raw u32)
                         bits 6-7 scale, sparse only (0: 1.0, 1: d/k, 2: explicit float64 follows)
    4       ...   LEB128 varints: dense d | sparse d, k | sketch d, rows, cols
            8     seed (uint64): sparse with index coding "seed", and sketch
            8     scale (float64): sparse with scale mode 2
            4     value scale (float32): value codings 1 and 2 (dense and sparse only)
            ...   body: values (k or d or rows*cols fp16/fp32/int8, or ceil(n/8) bytes of n sign bits),
                  then the index block (sparse)
    -4      4     CRC-32 of every byte before it                     (frame trailer)

A patch chain is: magic, version, kind 4, flags (bit 0 "compact", bits 1 and 2 for replay chains below, the
others reserved and zero), varint
``n``, then ``n`` times (varint length, one part), then the CRC-32 trailer. A part is one complete framed
sparse message when bit 0 is clear. With bit 0 set (what :func:`encode` writes) a varint ``d`` follows
``n``, shared by every part, and a part is a sparse message without its frame header, its ``d`` and its
CRC (flags, varint k, then as above): 10 bytes less per part for d ≥ 16,384, the chain's own CRC-32
covering every byte.

A replay chain sets flag bit 1 (with bit 0): after ``n`` and ``d`` come varint ``lo``, ``n`` float32 decays (one a
part), with flag bit 2 a starting block and velocity (twice ``d − lo`` fp32 values), then varint length and one
complete message (dense, sparse or patch chain) over the first ``lo`` coordinates, then the ``n`` parts: compact
sparse parts over the ``d − lo`` coordinates of the block ``[lo, d)``, the rounds' innovations, which the receiver
replays with their decays: ``v ← decay·v; v[c.indices] += c; x[lo:] += v``, in float32 (:class:`ReplayChain`).

A rand-k message of ``k`` fp16 values therefore costs ``4 + len(varint d) + len(varint k) + 8 + 2k + 4``
bytes: 2k + 21 for d=26,000, k=520.

Index coding of explicit indices ``i_0 < i_1 < ... < i_{k-1}`` picks the smallest of

* Golomb-Rice coded gaps ``g_0 = i_0``, ``g_j = i_j - i_{j-1} - 1`` with parameter ``r``: each gap costs
  ``floor(g / 2^r) + 1`` unary bits and ``r`` remainder bits, so the block holds ``1 + ceil(B(r) / 8)``
  bytes with ``B(r) = k (r + 1) + sum_j floor(g_j / 2^r)``. ``B`` is convex in ``r`` (its decrements
  ``sum_j ceil(floor(g_j / 2^r) / 2) - k`` never increase), so a descent from ``log2(mean gap)`` finds
  the exact minimiser. All remainders are stored first, then all unary codes, which lets numpy decode the
  block without a per-gap loop (the bit count is the same as interleaved Rice codes);
* a bitmap over ``d`` coordinates: ``ceil(d / 8)`` bytes;
* raw uint32 indices: ``4k`` bytes.

Quantised values (value coding 1) are int8 ``q`` with a float32 value scale ``v``: the values they stand
for are ``float32(v) * float32(q)`` (:func:`float_values`), computed the same way by sender and receiver,
so a sender that applies what it sends (the server's steps) and a receiver that adds it agree bit for bit.
When every int8 value is +1 or -1 (a sign quantiser's output, e.g. sparse ternary compression, Sattler et
al. 2019) the encoder picks value coding 2 by itself: the ``n`` values travel as ``ceil(n / 8)`` bytes of
sign bits (1 = negative, most significant bit first, padding bits zero and checked on decode), one bit per
value instead of eight, and decode to the same int8 ``+-1`` (so the values stand for ``v * sign``). A
top-k message of ``k`` signs with Rice-coded positions thus costs the header, the float32 scale,
``ceil(k / 8)`` sign bytes and the index block.

``decode(encode(p))`` reproduces ``p`` bit for bit. Anything malformed -- truncated, corrupted, of another
version or kind, inconsistent -- raises :class:`sluice.errors.WireError`; the CRC is checked before any
body byte is interpreted (only the header's size fields are read first, to report truncation exactly).

The code: :func:`encode` and :func:`decode` dispatch through one table holding a codec per payload type (its
kind, encoder and decoder). The payload types live in :mod:`sluice.wire._vector_payloads`, the dense, sparse and
sketch codecs in :mod:`sluice.wire._vector_codecs`, the index codings in :mod:`sluice.wire._vector_index`; the
chain codecs, which encode and decode their parts through the same table, are here. Everything other modules use
is importable from this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sluice.errors import WireError
from sluice.wire._vector_codecs import (
    _FIXED,
    DENSE,
    FLAG_FP16,
    FLAG_ZSTD,
    SKETCH,
    SPARSE,
    VectorCodec,
    _reserved,
    _truncated,
)
from sluice.wire._vector_index import (
    _CODINGS,
    CODING_BITMAP,
    CODING_RAW,
    CODING_RICE,
    CODING_SEED,
    IndexCoding,
    _rice_bits,
    index_block_sizes,
    rice_decode,
    rice_encode,
    rice_parameter,
)
from sluice.wire._vector_payloads import (
    MAX_D,
    DensePayload,
    PatchChain,
    Payload,
    ReplayChain,
    SketchPayload,
    SparsePayload,
    float_values,
    replay_block,
)
from sluice.wire.frame import (
    HEADER,
    KIND_CHAIN,
    KIND_SPARSE,
    TRAILER,
    check_crc,
    check_header,
    frame,
    kind_name,
    kinds,
    read_varint,
    unframe,
    varint,
)

__all__ = [
    "CODING_BITMAP",
    "CODING_RAW",
    "CODING_RICE",
    "CODING_SEED",
    "FLAG_FP16",
    "FLAG_ZSTD",
    "KINDS",
    "MAX_D",
    "DensePayload",
    "IndexCoding",
    "PatchChain",
    "Payload",
    "ReplayChain",
    "SketchPayload",
    "SparsePayload",
    "_rice_bits",
    "decode",
    "encode",
    "float_values",
    "index_block_sizes",
    "payload_kind",
    "replay_block",
    "rice_decode",
    "rice_encode",
    "rice_parameter",
]

_CHAIN_COMPACT = 0x01  # patch chain flag: parts without their own frame, d and CRC
_CHAIN_REPLAY = 0x02  # patch chain flag: a replay chain (lo, decays and the rest follow d; parts are innovations)
_CHAIN_BASE = 0x04  # replay chain flag: a starting block and velocity follow the decays


# ------------------------------------------------------------------------------------------ chain encoding
def _chain_part(message: bytes, d: int) -> bytes:
    """A framed sparse message as a compact chain part: without its frame header, its ``d`` and its CRC."""
    inner = message[HEADER:-TRAILER]
    return inner[:1] + inner[1 + len(varint(d)):]


def _prefixed(parts: Iterable[bytes]) -> list[bytes]:
    """Each part after its varint length."""
    return [varint(len(part)) + part for part in parts]


def _encode_patch_chain(payload: PatchChain, lossless: bool, index_coding: IndexCoding) -> bytes:
    d = payload.parts[0].d if payload.parts else 0
    parts = [_chain_part(encode(p, lossless=lossless, index_coding=index_coding), d) for p in payload.parts]
    body = bytes([_CHAIN_COMPACT]) + varint(len(parts)) + varint(d)
    return frame(KIND_CHAIN, body, *_prefixed(parts))


def _encode_replay_chain(payload: ReplayChain, lossless: bool, index_coding: IndexCoding) -> bytes:
    rest = encode(payload.rest, lossless=lossless, index_coding=index_coding)
    parts = [_chain_part(encode(c, lossless=lossless, index_coding=index_coding), payload.d - payload.lo)
             for c in payload.innovations]
    flags = _CHAIN_COMPACT | _CHAIN_REPLAY | (_CHAIN_BASE if payload.base is not None else 0)
    head = (varint(len(parts)) + varint(payload.d) + varint(payload.lo)
            + np.asarray(payload.decays, dtype="<f4").tobytes())
    if payload.base is not None:
        head += b"".join(a.astype("<f4").tobytes() for a in payload.base)
    return frame(KIND_CHAIN, bytes([flags]), head, *_prefixed([rest, *parts]))


# ------------------------------------------------------------------------------------------ chain decoding
def _sized(buf: bytes, pos: int, field: str) -> tuple[bytes, int]:
    """The bytes after the varint length ``field`` at ``pos``, and the position after them."""
    size, pos = read_varint(buf, pos, field, reserve=TRAILER)
    if pos + size > len(buf) - TRAILER:
        raise _truncated(pos + size + TRAILER, len(buf), at_least=True)
    return buf[pos : pos + size], pos + size


def _replay_head(buf: bytes, pos: int, count: int, d: int, with_base: bool) -> tuple[tuple[Any, ...], int]:
    """``(lo, rest, decays, base)`` of a replay chain of ``count`` innovations, read from ``pos`` (after ``d``)."""
    n = len(buf)
    lo, pos = read_varint(buf, pos, "lo", reserve=TRAILER)
    if not lo < d:
        raise WireError(f"malformed header: replay chain block [{lo}, {d}) of d={d}")
    m = d - lo
    need = 4 * count + (8 * m if with_base else 0)
    if pos + need > n - TRAILER:
        raise _truncated(pos + need + TRAILER, n, at_least=True)
    decays = tuple(np.frombuffer(buf, dtype="<f4", count=count, offset=pos).tolist())
    pos += 4 * count
    base = None
    if with_base:
        base = tuple(np.frombuffer(buf, dtype="<f4", count=m, offset=pos + 4 * m * i).astype(np.float32)
                     for i in range(2))
        pos += 8 * m
    message, pos = _sized(buf, pos, "rest length")
    rest = decode(message)
    if isinstance(rest, ReplayChain | SketchPayload):
        raise WireError(f"a replay chain's rest must be a dense, sparse or chain payload, got {payload_kind(rest)}")
    return (lo, rest, decays, base), pos


def _chain_parts(buf: bytes, pos: int, count: int, compact_d: int | None) -> tuple[tuple[Payload, ...], int]:
    """``count`` sparse parts from ``pos``: complete messages, or compact parts over ``compact_d`` coordinates."""
    parts = []
    for _ in range(count):
        part, pos = _sized(buf, pos, "part length")
        if compact_d is not None:  # the sparse message's flags, k, ... body; frame and d are the chain's
            if not part:
                raise WireError("a compact patch chain part is empty")
            part = frame(KIND_SPARSE, part[:1], varint(compact_d), part[1:])
        part_kind = check_header(part)
        if part_kind != KIND_SPARSE:
            name = kinds().get(part_kind, "unknown")
            raise WireError(f"a patch chain part must be sparse, got kind {part_kind} ({name})")
        parts.append(decode(part))
    return tuple(parts), pos


def _decode_chain(buf: bytes) -> PatchChain | ReplayChain:
    flags = buf[HEADER]
    allowed = _CHAIN_COMPACT | (_CHAIN_REPLAY | _CHAIN_BASE if flags & _CHAIN_REPLAY else 0)
    if flags & ~allowed or (flags & _CHAIN_REPLAY and not flags & _CHAIN_COMPACT):
        raise _reserved(flags)
    check_crc(buf)
    count, pos = read_varint(buf, _FIXED, "n", reserve=TRAILER)
    d = replay = None
    if flags:
        d, pos = read_varint(buf, pos, "d", reserve=TRAILER)
    if flags & _CHAIN_REPLAY:
        replay, pos = _replay_head(buf, pos, count, d, bool(flags & _CHAIN_BASE))
    parts, pos = _chain_parts(buf, pos, count, d if replay is None else d - replay[0])
    if pos != len(buf) - TRAILER:
        raise WireError(f"patch chain has trailing bytes: expected {pos + TRAILER} bytes, got {len(buf)}")
    if replay is not None:
        lo, rest, decays, base = replay
        return ReplayChain(d, lo, rest, parts, decays, base)
    return PatchChain(parts)


# ------------------------------------------------------------------------------------------------- table
@dataclass(frozen=True)
class _ChainCodec:
    """A chain payload type: its own encoder; every chain message decodes through :func:`_decode_chain` (flag
    bit 1 tells a replay chain from a patch chain)."""

    encode: Callable[[Any, bool, IndexCoding], bytes]
    kind: int = KIND_CHAIN

    def decode(self, buf: bytes) -> Payload:
        return _decode_chain(buf)


_CODECS: dict[type, VectorCodec | _ChainCodec] = {
    DensePayload: DENSE,
    SparsePayload: SPARSE,
    SketchPayload: SKETCH,
    PatchChain: _ChainCodec(_encode_patch_chain),
    ReplayChain: _ChainCodec(_encode_replay_chain),
}
"""The codec of each payload type."""
_DECODERS = {codec.kind: codec.decode for codec in _CODECS.values()}

KINDS = tuple(_DECODERS)
"""The frame kinds of vector payloads."""


def _codec_of(payload: object) -> VectorCodec | _ChainCodec | None:
    return next((codec for cls, codec in _CODECS.items() if isinstance(payload, cls)), None)


# ------------------------------------------------------------------------------------------------ public
def encode(
    payload: Payload,
    *,
    lossless: bool = False,
    index_coding: IndexCoding = "auto",
) -> bytes:
    """Serialise a payload (layout in the module docstring); ``len()`` of the result is its wire cost.

    ``lossless=True`` zstd-compresses the body; when that would not make the message smaller the body
    is sent as is (and the flags say so). ``index_coding`` forces the coding of explicit sparse
    indices ("auto" picks the smallest of "rice", "bitmap", "raw").
    """
    if index_coding != "auto" and index_coding not in _CODINGS:
        raise WireError(f"index_coding must be one of auto, rice, bitmap, raw; got {index_coding!r}")
    codec = _codec_of(payload)
    if codec is None:
        raise WireError(f"cannot encode a {type(payload).__name__}: expected a Dense/Sparse/Sketch payload")
    return codec.encode(payload, lossless, index_coding)


def decode(buf: bytes | bytearray | memoryview) -> Payload:
    """Parse one message produced by :func:`encode`; the exact inverse, or :class:`WireError`."""
    buf = bytes(buf)
    n = len(buf)
    kind = check_header(buf)
    decoder = _DECODERS.get(kind)
    if decoder is None:
        unframe(buf)  # a corrupted or unknown kind says so
        raise WireError(f"not a vector payload: message kind {kind} ({kind_name(kind)})")
    if n < _FIXED + 1 + TRAILER:
        raise _truncated(_FIXED + 1 + TRAILER, n, at_least=True)
    return decoder(buf)


def payload_kind(payload: Payload) -> str:
    """The kind name of a payload: ``"dense"``, ``"sparse"``, ``"sketch"`` or ``"chain"``."""
    codec = _codec_of(payload)
    if codec is None:
        raise WireError(f"not a payload: {type(payload).__name__}")
    return kind_name(codec.kind)
