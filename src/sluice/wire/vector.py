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
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Literal

import numpy as np
import zstandard

from sluice.errors import WireError
from sluice.wire.dtypes import INT8, VECTOR_DTYPES, WireDtype, of_numpy
from sluice.wire.frame import (
    HEADER,
    KIND_CHAIN,
    KIND_DENSE,
    KIND_SKETCH,
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

MAX_D = 2**32 - 1
"""Largest vector length a sparse or sketch payload may describe (indices travel as uint32)."""

KINDS = (KIND_DENSE, KIND_SPARSE, KIND_SKETCH, KIND_CHAIN)
"""The frame kinds of vector payloads."""
CODING_SEED, CODING_RICE, CODING_BITMAP, CODING_RAW = 0, 1, 2, 3
_CODINGS = {"rice": CODING_RICE, "bitmap": CODING_BITMAP, "raw": CODING_RAW}
_SCALE_ONE, _SCALE_D_OVER_K, _SCALE_EXPLICIT = 0, 1, 2
FLAG_FP16 = 1 << 2
"""Flags bit: the values are fp16 (:data:`sluice.wire.dtypes.FP16`), else fp32."""
FLAG_ZSTD = 1 << 3
"""Flags bit: the body is zstd-compressed."""
_VALUE_CODING = 0b11
_QUANT_INT8 = 1
_QUANT_SIGN = 2
_MAX_RICE = 32
_FIXED = HEADER + 1  # frame header and flags
_CHAIN_COMPACT = 0x01  # patch chain flag: parts without their own frame, d and CRC
_CHAIN_REPLAY = 0x02  # patch chain flag: a replay chain (lo, decays and the rest follow d; parts are innovations)
_CHAIN_BASE = 0x04  # replay chain flag: a starting block and velocity follow the decays

IndexCoding = Literal["auto", "rice", "bitmap", "raw"]

_ZSTD_LEVEL = 3
_ZSTD_PARAMS = zstandard.ZstdCompressionParameters.from_level(
    _ZSTD_LEVEL,
    format=zstandard.FORMAT_ZSTD1_MAGICLESS,
    write_content_size=True,
    write_checksum=False,
    write_dict_id=False,
)


def _value_type(arr: np.ndarray) -> WireDtype | None:
    """The table entry of a vector payload's value type, or None when vector payloads cannot carry it."""
    t = of_numpy(arr.dtype)
    return t if t is not None and t.vector_bit is not None else None


# ----------------------------------------------------------------------------------------------- payloads
def _check_values(values: object, what: str, vscale: float | None = None) -> np.ndarray:
    arr = np.asarray(values)
    if vscale is not None:
        if arr.dtype != INT8.numpy or not math.isfinite(vscale) or vscale < 0:
            raise WireError(f"{what} with a value scale must be int8 and the scale a finite float >= 0, got "
                            f"{arr.dtype} and {vscale!r}")
        if arr.size and int(arr.min()) == -128:
            raise WireError(f"{what}: int8 values lie in [-127, 127]")
        return arr
    if _value_type(arr) is None:
        raise WireError(f"{what} must be float16 or float32 (cast them first), got {arr.dtype}")
    return arr


def _check_vscale(vscale: object) -> float | None:
    if vscale is None:
        return None
    v = float(np.float32(vscale))
    if v != vscale:
        raise WireError(f"a value scale travels as float32 and must be one, got {vscale!r}")
    return v


def float_values(payload: DensePayload | SparsePayload) -> np.ndarray:
    """The float32 values a dense or sparse payload stands for: its values, or ``float32(v) * float32(q)``
    for int8 values ``q`` with value scale ``v``."""
    if payload.vscale is None:
        return payload.values.astype(np.float32)
    return np.float32(payload.vscale) * payload.values.astype(np.float32)


def _same_array(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= int(seed) < 2**64:
        raise WireError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


@dataclass(frozen=True, eq=False)
class DensePayload:
    """A full vector: ``values`` is 1-D float32 or float16, or int8 with a ``vscale``; ``d = len(values)``."""

    values: np.ndarray
    vscale: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "vscale", _check_vscale(self.vscale))
        arr = _check_values(self.values, "dense values", self.vscale)
        if arr.ndim != 1:
            raise WireError(f"dense values must be 1-D, got shape {arr.shape}")
        object.__setattr__(self, "values", arr)

    @property
    def d(self) -> int:
        """Vector length."""
        return int(self.values.shape[0])

    def __eq__(self, other: object) -> bool:
        """Bitwise equality (NaNs with the same bits compare equal)."""
        return isinstance(other, DensePayload) and self.vscale == other.vscale and _same_array(
            self.values, other.values)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class SparsePayload:
    """``k`` values at ``k`` of ``d`` coordinates; the receiver's estimate is ``scale * values`` there.

    Exactly one of ``indices`` (sorted, unique, in ``[0, d)``) and ``seed`` (uint64; the receiver
    regenerates the indices with :func:`sluice.compress.codecs.randk_indices` ``(d, k, seed)``) is given.
    ``values`` are float16/float32, or int8 standing for ``vscale * values`` (:func:`float_values`).
    """

    d: int
    values: np.ndarray
    indices: np.ndarray | None = None
    seed: int | None = None
    scale: float = 1.0
    vscale: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.d, bool) or not isinstance(self.d, int | np.integer) or not 0 <= self.d <= MAX_D:
            raise WireError(f"sparse d must be an integer in [0, {MAX_D}], got {self.d!r}")
        object.__setattr__(self, "d", int(self.d))
        object.__setattr__(self, "vscale", _check_vscale(self.vscale))
        arr = _check_values(self.values, "sparse values", self.vscale)
        if arr.ndim != 1 or arr.shape[0] > self.d:
            raise WireError(f"sparse values must be 1-D with at most d={self.d} entries, got {arr.shape}")
        object.__setattr__(self, "values", arr)
        if (self.indices is None) == (self.seed is None):
            raise WireError("a sparse payload needs exactly one of explicit indices and an index seed")
        if self.indices is not None:
            idx = np.asarray(self.indices)
            if idx.ndim != 1 or idx.shape[0] != arr.shape[0]:
                raise WireError(f"sparse payload has {arr.shape[0]} values but indices of shape {idx.shape}")
            if idx.size and not np.issubdtype(idx.dtype, np.integer):
                raise WireError(f"sparse indices must be integers, got {idx.dtype}")
            idx = idx.astype(np.int64, copy=False)
            if idx.size and (idx[0] < 0 or idx[-1] >= self.d or np.any(np.diff(idx) <= 0)):
                raise WireError(f"sparse indices must be sorted, unique and in [0, {self.d})")
            object.__setattr__(self, "indices", idx)
        else:
            object.__setattr__(self, "seed", _check_seed(self.seed))
        object.__setattr__(self, "scale", float(self.scale))

    @property
    def k(self) -> int:
        """Number of transmitted values."""
        return int(self.values.shape[0])

    def __eq__(self, other: object) -> bool:
        """Bitwise equality of every field."""
        return (
            isinstance(other, SparsePayload)
            and self.d == other.d
            and self.seed == other.seed
            and self.vscale == other.vscale
            and struct.pack("<d", self.scale) == struct.pack("<d", other.scale)
            and _same_array(self.values, other.values)
            and _same_array(self.indices, other.indices)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class SketchPayload:
    """A count sketch of a ``d``-vector: ``table`` is ``rows x cols``; hashes derive from ``seed``."""

    d: int
    seed: int
    table: np.ndarray

    def __post_init__(self) -> None:
        if isinstance(self.d, bool) or not isinstance(self.d, int | np.integer) or not 0 <= self.d <= MAX_D:
            raise WireError(f"sketch d must be an integer in [0, {MAX_D}], got {self.d!r}")
        object.__setattr__(self, "d", int(self.d))
        object.__setattr__(self, "seed", _check_seed(self.seed))
        arr = _check_values(self.table, "sketch table")
        if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
            raise WireError(f"sketch table must be 2-D with at least one row and column, got {arr.shape}")
        object.__setattr__(self, "table", arr)

    @property
    def rows(self) -> int:
        """Number of hash rows."""
        return int(self.table.shape[0])

    @property
    def cols(self) -> int:
        """Number of buckets per row."""
        return int(self.table.shape[1])

    def __eq__(self, other: object) -> bool:
        """Bitwise equality of every field."""
        return (
            isinstance(other, SketchPayload)
            and self.d == other.d
            and self.seed == other.seed
            and _same_array(self.table, other.table)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class PatchChain:
    """Sparse patches of one ``d``-vector, to be added in order (``x[p.indices] += p.values`` for each p)."""

    parts: tuple[SparsePayload, ...]

    def __post_init__(self) -> None:
        parts = tuple(self.parts)
        if any(not isinstance(p, SparsePayload) or p.indices is None for p in parts):
            raise WireError("a patch chain holds sparse payloads with explicit indices only")
        if len({p.d for p in parts}) > 1:
            raise WireError(f"the patches of a chain must share d, got {sorted({p.d for p in parts})}")
        object.__setattr__(self, "parts", parts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PatchChain) and len(self.parts) == len(other.parts) and all(
            a == b for a, b in zip(self.parts, other.parts, strict=True))

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, eq=False)
class ReplayChain:
    """A model message whose last coordinates, the block ``[lo, d)``, carry replayed momentum.

    ``rest`` brings coordinates ``[0, lo)`` (a dense vector, a replacement patch or a patch chain over ``lo``
    coordinates, as the downlink's messages without replay); the block is brought by its ``innovations``
    (sparse payloads over ``d − lo`` coordinates, one a round, which the receiver replays with that round's
    velocity decay, ``decays``, float32 values in [0, 1): :func:`replay_block`) from the block and velocity it
    holds, or from ``base`` = (block, velocity), two fp32 vectors of ``d − lo`` values, when given.
    """

    d: int
    lo: int
    rest: DensePayload | SparsePayload | PatchChain
    innovations: tuple[SparsePayload, ...] = ()
    decays: tuple[float, ...] = ()
    base: tuple[np.ndarray, np.ndarray] | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.lo < self.d <= MAX_D:
            raise WireError(f"a replay chain needs 0 <= lo < d <= {MAX_D}, got lo={self.lo}, d={self.d}")
        rest = self.rest
        rest_d = getattr(rest, "d", None)
        if isinstance(rest, PatchChain):
            rest_d = rest.parts[0].d if rest.parts else self.lo
        if not isinstance(rest, DensePayload | SparsePayload | PatchChain) or rest_d != self.lo:
            raise WireError(f"a replay chain's rest is a dense, sparse or chain payload over lo={self.lo} coordinates")
        if isinstance(rest, SparsePayload) and rest.indices is None:
            raise WireError("a replay chain's rest needs explicit indices")
        innovations = tuple(self.innovations)
        if any(not isinstance(c, SparsePayload) or c.indices is None or c.d != self.d - self.lo for c in innovations):
            raise WireError(f"a replay chain's innovations are sparse payloads over d - lo = {self.d - self.lo} "
                            "coordinates with explicit indices")
        decays = tuple(float(np.float32(r)) for r in self.decays)
        if len(decays) != len(innovations) or not all(0 <= r < 1 for r in decays):
            raise WireError(f"a replay chain needs one decay in [0, 1) per innovation, got {list(self.decays)} for "
                            f"{len(innovations)} innovations")
        object.__setattr__(self, "innovations", innovations)
        object.__setattr__(self, "decays", decays)
        if self.base is not None:
            block, velocity = (np.ascontiguousarray(a, dtype=np.float32) for a in self.base)
            if block.shape != (self.d - self.lo,) or velocity.shape != block.shape:
                raise WireError(f"a replay chain's start is a block and a velocity of {self.d - self.lo} values, "
                                f"got {block.shape} and {velocity.shape}")
            object.__setattr__(self, "base", (block, velocity))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, ReplayChain) and (self.d, self.lo, self.decays) == (other.d, other.lo, other.decays)
                and self.rest == other.rest and len(self.innovations) == len(other.innovations)
                and all(a == b for a, b in zip(self.innovations, other.innovations, strict=True))
                and (self.base is None) == (other.base is None)
                and (self.base is None or all(_same_array(a, b) for a, b in zip(self.base, other.base, strict=True))))

    __hash__ = None  # type: ignore[assignment]


def replay_block(block: np.ndarray, velocity: np.ndarray, innovations: tuple[SparsePayload, ...] | list[SparsePayload],
                 decays: tuple[float, ...] | list[float]) -> tuple[np.ndarray, np.ndarray]:
    """The (block, velocity) after replaying ``innovations`` with their ``decays``, one a round, in float32:
    ``v ← float32(decay)·v``, ``v[c.indices] += c``, ``block += v``. New arrays; the inputs are not changed. The
    server runs this same function on its own innovations, so sender and receiver hold the same bits."""
    x, v = (np.array(a, dtype=np.float32) for a in (block, velocity))
    if x.shape != v.shape or any(c.d != x.shape[0] for c in innovations) or len(decays) != len(innovations):
        raise WireError(f"cannot replay innovations over {[c.d for c in innovations]} coordinates with "
                        f"{len(decays)} decays on a block of {x.shape[0]} and a velocity of {v.shape[0]} values")
    for c, r in zip(innovations, decays, strict=True):
        v *= np.float32(r)
        v[c.indices] += float_values(c)
        x += v
    return x, v


Payload = DensePayload | SparsePayload | SketchPayload | PatchChain | ReplayChain
"""Any payload the wire format carries."""


# ------------------------------------------------------------------------------------------ index coding
def _gaps(indices: np.ndarray) -> np.ndarray:
    """``g_0 = i_0``, ``g_j = i_j - i_{j-1} - 1`` (all >= 0 for sorted unique indices)."""
    g = np.empty(indices.shape[0], dtype=np.uint64)
    if indices.size:
        g[0] = indices[0]
        g[1:] = np.diff(indices) - 1
    return g


def _rice_bits(gaps: np.ndarray, r: int) -> int:
    """``B(r) = k (r + 1) + sum_j floor(g_j / 2^r)``: bits of all Rice codes with parameter ``r``."""
    return int(gaps.shape[0]) * (r + 1) + int(np.sum(gaps >> np.uint64(r), dtype=np.uint64))


def rice_parameter(gaps: np.ndarray) -> int:
    """The ``r`` in ``[0, 32]`` minimising :func:`_rice_bits` (exact: ``B`` is convex, ties go low)."""
    if gaps.size == 0:
        return 0
    mean = float(np.mean(gaps, dtype=np.float64))
    r = min(_MAX_RICE, max(0, int(math.floor(math.log2(mean + 1.0)))))
    cost = _rice_bits(gaps, r)
    while r > 0:
        c = _rice_bits(gaps, r - 1)
        if c > cost:
            break
        r, cost = r - 1, c
    while r < _MAX_RICE:
        c = _rice_bits(gaps, r + 1)
        if c >= cost:
            break
        r, cost = r + 1, c
    return r


def rice_encode(indices: np.ndarray) -> bytes:
    """The Golomb-Rice index block of sorted, unique ``indices``: ``[r][k*r remainder bits][unary codes: q_j
    zeros then a one]``, bit-packed MSB first, ``r`` the optimal parameter for the gaps
    (:func:`rice_parameter`)."""
    gaps = _gaps(indices)
    k = gaps.shape[0]
    r = rice_parameter(gaps)
    q = (gaps >> np.uint64(r)).astype(np.int64)
    rem = np.empty((k, r), dtype=np.uint8)
    for j in range(r):
        rem[:, j] = (gaps >> np.uint64(r - 1 - j)) & np.uint64(1)
    unary = np.zeros(int(q.sum()) + k, dtype=np.uint8)
    unary[np.cumsum(q + 1) - 1] = 1
    bits = np.concatenate([rem.reshape(-1), unary])
    return bytes([r]) + np.packbits(bits).tobytes()


def _rice_size(indices: np.ndarray) -> int:
    gaps = _gaps(indices)
    return 1 + (_rice_bits(gaps, rice_parameter(gaps)) + 7) // 8


def rice_decode(block: bytes, k: int, d: int) -> np.ndarray:
    """The ``k`` indices in ``[0, d)`` of a :func:`rice_encode` block; :class:`WireError` for a corrupt one."""
    if len(block) < 1:
        raise WireError("corrupt index block: Golomb-Rice parameter missing")
    r = block[0]
    if r > _MAX_RICE:
        raise WireError(f"corrupt index block: Golomb-Rice parameter {r} exceeds {_MAX_RICE}")
    bits = np.unpackbits(np.frombuffer(block, dtype=np.uint8, offset=1))
    if bits.shape[0] < k * (r + 1):
        raise WireError(f"corrupt index block: {bits.shape[0]} bits cannot hold {k} Rice codes with r={r}")
    rem_bits = bits[: k * r].reshape(k, r)
    unary = bits[k * r :]
    ends = np.flatnonzero(unary)
    if ends.shape[0] != k:
        raise WireError(f"corrupt index block: found {ends.shape[0]} unary codes, expected {k}")
    used = k * r + (int(ends[-1]) + 1 if k else 0)
    if bits.shape[0] - used >= 8:
        raise WireError("corrupt index block: trailing bytes after the last Rice code")
    q = np.diff(ends, prepend=-1) - 1
    if k and int(q.max()) > d >> r:
        raise WireError(f"corrupt index block: a gap exceeds d={d}")
    gaps = q.astype(np.uint64) << np.uint64(r)
    for j in range(r):
        gaps |= rem_bits[:, j].astype(np.uint64) << np.uint64(r - 1 - j)
    idx = np.cumsum(gaps.astype(np.int64) + 1) - 1
    if k and (int(idx[-1]) >= d or int(idx[0]) < 0 or np.any(np.diff(idx) <= 0)):
        raise WireError(f"corrupt index block: indices not sorted, unique and in [0, {d})")
    return idx


def _bitmap_encode(indices: np.ndarray, d: int) -> bytes:
    mask = np.zeros(d, dtype=np.uint8)
    mask[indices] = 1
    return np.packbits(mask).tobytes()


def _bitmap_decode(block: bytes, k: int, d: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(block, dtype=np.uint8))
    if np.any(bits[d:]):
        raise WireError("corrupt index block: bitmap padding bits are set")
    idx = np.flatnonzero(bits[:d]).astype(np.int64)
    if idx.shape[0] != k:
        raise WireError(f"corrupt index block: bitmap marks {idx.shape[0]} coordinates, expected {k}")
    return idx


def _raw_decode(block: bytes, k: int, d: int) -> np.ndarray:
    idx = np.frombuffer(block, dtype="<u4", count=k).astype(np.int64)
    if k and (int(idx[-1]) >= d or np.any(np.diff(idx) <= 0)):
        raise WireError(f"corrupt index block: raw indices not sorted, unique and in [0, {d})")
    return idx


def index_block_sizes(indices: np.ndarray, d: int) -> dict[str, int]:
    """Bytes each index coding would take for these sorted unique indices (before any zstd)."""
    idx = np.asarray(indices, dtype=np.int64)
    return {"rice": _rice_size(idx), "bitmap": (d + 7) // 8, "raw": 4 * int(idx.shape[0])}


def _choose_coding(indices: np.ndarray, d: int) -> int:
    sizes = index_block_sizes(indices, d)
    best = min(("raw", "bitmap", "rice"), key=lambda name: sizes[name])  # first minimum wins ties
    return _CODINGS[best]


# --------------------------------------------------------------------------------------------- encoding
def _only_signs(arr: np.ndarray) -> bool:
    """Whether every value is +1 or -1 (an int8 payload whose values value coding 2 carries)."""
    return bool(np.all((arr == 1) | (arr == -1)))


def _value_bytes(arr: np.ndarray, signs: bool = False) -> bytes:
    """The values as they travel: packed sign bits (1 = negative, MSB first) or in their wire layout."""
    if signs:
        return np.packbits(arr < 0).tobytes()
    t = INT8 if arr.dtype == INT8.numpy else _value_type(arr)
    assert t is not None  # payload constructors check the value type
    return arr.astype(t.wire, copy=False).tobytes()


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
    if isinstance(payload, ReplayChain):
        rest = encode(payload.rest, lossless=lossless, index_coding=index_coding)
        parts = [_chain_part(encode(c, lossless=lossless, index_coding=index_coding), payload.d - payload.lo)
                 for c in payload.innovations]
        flags = _CHAIN_COMPACT | _CHAIN_REPLAY | (_CHAIN_BASE if payload.base is not None else 0)
        head = (varint(len(parts)) + varint(payload.d) + varint(payload.lo)
                + np.asarray(payload.decays, dtype="<f4").tobytes())
        if payload.base is not None:
            head += b"".join(a.astype("<f4").tobytes() for a in payload.base)
        return frame(KIND_CHAIN, bytes([flags]), head, varint(len(rest)), rest,
                     *(varint(len(part)) + part for part in parts))
    if isinstance(payload, PatchChain):
        d = payload.parts[0].d if payload.parts else 0
        parts = [_chain_part(encode(p, lossless=lossless, index_coding=index_coding), d) for p in payload.parts]
        body = bytes([_CHAIN_COMPACT]) + varint(len(parts)) + varint(d)
        return frame(KIND_CHAIN, body, *(varint(len(part)) + part for part in parts))
    extra = b""
    vscale = getattr(payload, "vscale", None)
    signs = vscale is not None and _only_signs(payload.values)
    if isinstance(payload, DensePayload):
        kind, arr = KIND_DENSE, payload.values
        head = varint(payload.d)
        body = _value_bytes(arr, signs)
        high = 0
    elif isinstance(payload, SparsePayload):
        kind, arr = KIND_SPARSE, payload.values
        d, k = payload.d, payload.k
        head = varint(d) + varint(k)
        if payload.indices is None:
            coding = CODING_SEED
            extra = struct.pack("<Q", payload.seed)
            block = b""
        else:
            coding = _choose_coding(payload.indices, d) if index_coding == "auto" else _CODINGS[index_coding]
            if coding == CODING_RICE:
                block = rice_encode(payload.indices)
            elif coding == CODING_BITMAP:
                block = _bitmap_encode(payload.indices, d)
            else:
                block = payload.indices.astype("<u4").tobytes()
        if payload.scale == 1.0:
            scale_mode = _SCALE_ONE
        elif k > 0 and payload.scale == d / k:
            scale_mode = _SCALE_D_OVER_K
        else:
            scale_mode = _SCALE_EXPLICIT
            extra += struct.pack("<d", payload.scale)
        high = (coding << 4) | (scale_mode << 6)
        body = _value_bytes(arr, signs) + block
    elif isinstance(payload, SketchPayload):
        kind, arr = KIND_SKETCH, payload.table
        head = varint(payload.d) + varint(payload.rows) + varint(payload.cols)
        extra = struct.pack("<Q", payload.seed)
        body = _value_bytes(np.ascontiguousarray(arr))
        high = 0
    else:
        raise WireError(f"cannot encode a {type(payload).__name__}: expected a Dense/Sparse/Sketch payload")
    if vscale is not None:
        flags = (_QUANT_SIGN if signs else _QUANT_INT8) | high
        extra += struct.pack("<f", vscale)
    else:
        vtype = _value_type(arr)
        assert vtype is not None and vtype.vector_bit is not None
        flags = (vtype.vector_bit << 2) | high
    if lossless and body:
        packed = zstandard.ZstdCompressor(compression_params=_ZSTD_PARAMS).compress(body)
        if len(packed) < len(body):
            body = packed
            flags |= FLAG_ZSTD
    return frame(kind, bytes([flags]), head, extra, body)


# --------------------------------------------------------------------------------------------- decoding
def _truncated(expected: int, got: int, *, at_least: bool = False) -> WireError:
    qual = "at least " if at_least else ""
    return WireError(f"message truncated: expected {qual}{expected} bytes, got {got}")


def _chain_part(message: bytes, d: int) -> bytes:
    """A framed sparse message as a compact chain part: without its frame header, its ``d`` and its CRC."""
    inner = message[HEADER:-TRAILER]
    return inner[:1] + inner[1 + len(varint(d)):]


def _decode_chain(buf: bytes) -> PatchChain | ReplayChain:
    n = len(buf)
    flags = buf[HEADER]
    allowed = _CHAIN_COMPACT | (_CHAIN_REPLAY | _CHAIN_BASE if flags & _CHAIN_REPLAY else 0)
    if flags & ~allowed or (flags & _CHAIN_REPLAY and not flags & _CHAIN_COMPACT):
        raise WireError(f"malformed header: reserved flag bits set (flags=0x{flags:02x})")
    check_crc(buf)
    count, pos = read_varint(buf, _FIXED, "n", reserve=TRAILER)
    if flags:
        d, pos = read_varint(buf, pos, "d", reserve=TRAILER)
    rest = part_d = None
    if flags & _CHAIN_REPLAY:
        lo, pos = read_varint(buf, pos, "lo", reserve=TRAILER)
        if not lo < d:
            raise WireError(f"malformed header: replay chain block [{lo}, {d}) of d={d}")
        part_d = d - lo
        need = 4 * count + (8 * part_d if flags & _CHAIN_BASE else 0)
        if pos + need > n - TRAILER:
            raise _truncated(pos + need + TRAILER, n, at_least=True)
        decays = tuple(np.frombuffer(buf, dtype="<f4", count=count, offset=pos).tolist())
        pos += 4 * count
        base = None
        if flags & _CHAIN_BASE:
            base = tuple(np.frombuffer(buf, dtype="<f4", count=part_d, offset=pos + 4 * part_d * i).astype(np.float32)
                         for i in range(2))
            pos += 8 * part_d
        size, pos = read_varint(buf, pos, "rest length", reserve=TRAILER)
        if pos + size > n - TRAILER:
            raise _truncated(pos + size + TRAILER, n, at_least=True)
        rest = decode(buf[pos : pos + size])
        if isinstance(rest, ReplayChain | SketchPayload):
            raise WireError(f"a replay chain's rest must be a dense, sparse or chain payload, got {payload_kind(rest)}")
        pos += size
    parts = []
    for _ in range(count):
        size, pos = read_varint(buf, pos, "part length", reserve=TRAILER)
        if pos + size > n - TRAILER:
            raise _truncated(pos + size + TRAILER, n, at_least=True)
        part = buf[pos : pos + size]
        if flags:  # a compact part: the sparse message's flags, k, ... body; frame and d are the chain's
            if not part:
                raise WireError("a compact patch chain part is empty")
            part = frame(KIND_SPARSE, part[:1], varint(d if part_d is None else part_d), part[1:])
        part_kind = check_header(part)
        if part_kind != KIND_SPARSE:
            name = kinds().get(part_kind, "unknown")
            raise WireError(f"a patch chain part must be sparse, got kind {part_kind} ({name})")
        parts.append(decode(part))
        pos += size
    if pos != n - TRAILER:
        raise WireError(f"patch chain has trailing bytes: expected {pos + TRAILER} bytes, got {n}")
    if rest is not None:
        return ReplayChain(d, lo, rest, tuple(parts), decays, base)
    return PatchChain(tuple(parts))


def decode(buf: bytes | bytearray | memoryview) -> Payload:
    """Parse one message produced by :func:`encode`; the exact inverse, or :class:`WireError`."""
    buf = bytes(buf)
    n = len(buf)
    kind = check_header(buf)
    if kind not in KINDS:
        unframe(buf)  # a corrupted or unknown kind says so
        raise WireError(f"not a vector payload: message kind {kind} ({kind_name(kind)})")
    if n < _FIXED + 1 + TRAILER:
        raise _truncated(_FIXED + 1 + TRAILER, n, at_least=True)
    flags = buf[HEADER]
    if kind == KIND_CHAIN:
        return _decode_chain(buf)
    quant = flags & _VALUE_CODING
    if quant > _QUANT_SIGN or (quant and (kind == KIND_SKETCH or flags & FLAG_FP16)):
        raise WireError(f"malformed header: reserved flag bits set (flags=0x{flags:02x})")
    vtype = INT8 if quant else VECTOR_DTYPES[(flags >> 2) & 1]
    dtype = vtype.numpy
    zstd_body = bool(flags & FLAG_ZSTD)
    coding = (flags >> 4) & 0b11
    scale_mode = flags >> 6
    pos = _FIXED
    seed: int | None = None
    scale = 1.0
    if kind == KIND_DENSE:
        if flags >> 4:
            raise WireError(f"malformed header: reserved flag bits set (flags=0x{flags:02x})")
        d, pos = read_varint(buf, pos, "d", reserve=TRAILER)
        count = d
    elif kind == KIND_SPARSE:
        d, pos = read_varint(buf, pos, "d", reserve=TRAILER)
        k, pos = read_varint(buf, pos, "k", reserve=TRAILER)
        if d > MAX_D or k > d:
            raise WireError(f"malformed header: sparse d={d}, k={k} (need k <= d <= {MAX_D})")
        if scale_mode == 3:
            raise WireError("malformed header: unknown scale mode 3")
        count = k
    else:
        if flags >> 4:
            raise WireError(f"malformed header: reserved flag bits set (flags=0x{flags:02x})")
        d, pos = read_varint(buf, pos, "d", reserve=TRAILER)
        rows, pos = read_varint(buf, pos, "rows", reserve=TRAILER)
        cols, pos = read_varint(buf, pos, "cols", reserve=TRAILER)
        if d > MAX_D or rows < 1 or cols < 1:
            raise WireError(f"malformed header: sketch d={d}, rows={rows}, cols={cols}")
        count = rows * cols
    if kind == KIND_SKETCH or (kind == KIND_SPARSE and coding == CODING_SEED):
        if n < pos + 8 + TRAILER:
            raise _truncated(pos + 8 + TRAILER, n, at_least=True)
        (seed,) = struct.unpack_from("<Q", buf, pos)
        pos += 8
    if kind == KIND_SPARSE and scale_mode == _SCALE_EXPLICIT:
        if n < pos + 8 + TRAILER:
            raise _truncated(pos + 8 + TRAILER, n, at_least=True)
        (scale,) = struct.unpack_from("<d", buf, pos)
        pos += 8
    elif kind == KIND_SPARSE and scale_mode == _SCALE_D_OVER_K:
        if k == 0:
            raise WireError("malformed header: scale d/k with k=0")
        scale = d / k
    vscale: float | None = None
    if quant:
        if n < pos + 4 + TRAILER:
            raise _truncated(pos + 4 + TRAILER, n, at_least=True)
        (vscale,) = struct.unpack_from("<f", buf, pos)
        pos += 4

    value_bytes = (count + 7) // 8 if quant == _QUANT_SIGN else count * vtype.itemsize
    if kind == KIND_SPARSE:
        fixed_block = {CODING_SEED: 0, CODING_BITMAP: (d + 7) // 8, CODING_RAW: 4 * k}.get(coding)
        min_block = 1 if coding == CODING_RICE else fixed_block
        max_block = 1 + (33 * k + d + 7) // 8 if coding == CODING_RICE else fixed_block
    else:
        fixed_block = min_block = max_block = 0
    body_size = None if fixed_block is None else value_bytes + fixed_block
    if zstd_body:
        if n < pos + 1 + TRAILER:
            raise _truncated(pos + 1 + TRAILER, n, at_least=True)
    elif body_size is not None:
        expected = pos + body_size + TRAILER
        if n < expected:
            raise _truncated(expected, n)
        if n > expected:
            raise WireError(f"message has trailing bytes: expected {expected} bytes, got {n}")
    elif n < pos + value_bytes + min_block + TRAILER:
        raise _truncated(pos + value_bytes + min_block + TRAILER, n, at_least=True)

    check_crc(buf)
    body = buf[pos : n - TRAILER]
    if zstd_body:
        body = _unzstd(body, value_bytes + min_block, value_bytes + max_block)
    if len(body) < value_bytes + min_block or len(body) > value_bytes + max_block:
        raise WireError(f"corrupt body: {len(body)} bytes, expected {value_bytes + min_block}")
    try:
        if quant == _QUANT_SIGN:
            values = _read_signs(body[:value_bytes], count)
        else:
            values = np.frombuffer(body, dtype=vtype.wire, count=count).astype(dtype)
        block = body[value_bytes:]
        if kind == KIND_DENSE:
            return DensePayload(values, vscale=vscale)
        if kind == KIND_SKETCH:
            assert seed is not None
            return SketchPayload(d=d, seed=seed, table=values.reshape(rows, cols))
        if coding == CODING_SEED:
            return SparsePayload(d=d, values=values, seed=seed, scale=scale, vscale=vscale)
        if coding == CODING_RICE:
            idx = rice_decode(block, k, d)
        elif coding == CODING_BITMAP:
            idx = _bitmap_decode(block, k, d)
        else:
            idx = _raw_decode(block, k, d)
        return SparsePayload(d=d, values=values, indices=idx, scale=scale, vscale=vscale)
    except WireError:
        raise
    except (ValueError, IndexError, OverflowError) as exc:  # pragma: no cover - CRC makes this unlikely
        raise WireError(f"corrupt {kind_name(kind)} body: {exc}") from exc


def _read_signs(block: bytes, count: int) -> np.ndarray:
    """int8 ``+-1`` from ``count`` packed sign bits (1 = negative); set padding bits are corruption."""
    bits = np.unpackbits(np.frombuffer(block, dtype=np.uint8))
    if np.any(bits[count:]):
        raise WireError("corrupt values: sign padding bits are set")
    return np.where(bits[:count] == 1, -1, 1).astype(np.int8)


def _unzstd(body: bytes, min_size: int, max_size: int) -> bytes:
    """Decompress a magicless zstd frame whose declared size lies in ``[min_size, max_size]``."""
    try:
        params = zstandard.get_frame_parameters(body, format=zstandard.FORMAT_ZSTD1_MAGICLESS)
        size = params.content_size
        if size == zstandard.CONTENTSIZE_UNKNOWN or not min_size <= size <= max_size:
            raise WireError(
                f"corrupt compressed body: declared size {size}, allowed [{min_size}, {max_size}]"
            )
        dctx = zstandard.ZstdDecompressor(format=zstandard.FORMAT_ZSTD1_MAGICLESS)
        reader = dctx.decompressobj()
        out = reader.decompress(body)
        if not reader.eof or reader.unused_data or len(out) != size:
            raise WireError("corrupt compressed body: zstd frame incomplete or followed by extra bytes")
        return out
    except zstandard.ZstdError as exc:
        raise WireError(f"corrupt compressed body: {exc}") from exc


def payload_kind(payload: Payload) -> str:
    """The kind name of a payload: ``"dense"``, ``"sparse"``, ``"sketch"`` or ``"chain"``."""
    if isinstance(payload, DensePayload):
        return kind_name(KIND_DENSE)
    if isinstance(payload, SparsePayload):
        return kind_name(KIND_SPARSE)
    if isinstance(payload, SketchPayload):
        return kind_name(KIND_SKETCH)
    if isinstance(payload, PatchChain | ReplayChain):
        return kind_name(KIND_CHAIN)
    raise WireError(f"not a payload: {type(payload).__name__}")
