"""The codings of a sparse message's explicit indices (layout and costs in :mod:`sluice.wire.vector`).

An index block holds ``k`` sorted, unique indices in ``[0, d)`` as Golomb-Rice coded gaps, a bitmap over the ``d``
coordinates or raw uint32 values; :data:`CODING_SEED` (the receiver regenerates the indices from a seed) has no
block. Every decoder refuses, with :class:`sluice.errors.WireError`, a block whose indices are not ``k`` sorted,
unique values in ``[0, d)``. :func:`encode_indices` with ``"auto"`` picks the smallest block.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import numpy as np

from sluice.errors import WireError

CODING_SEED, CODING_RICE, CODING_BITMAP, CODING_RAW = 0, 1, 2, 3
_CODINGS = {"rice": CODING_RICE, "bitmap": CODING_BITMAP, "raw": CODING_RAW}
_MAX_RICE = 32

IndexCoding = Literal["auto", "rice", "bitmap", "raw"]


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


def _raw_encode(indices: np.ndarray, d: int) -> bytes:
    return indices.astype("<u4").tobytes()


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


_BLOCKS: dict[int, tuple[Callable[[np.ndarray, int], bytes], Callable[[bytes, int, int], np.ndarray]]] = {
    CODING_RICE: (lambda indices, d: rice_encode(indices), rice_decode),
    CODING_BITMAP: (_bitmap_encode, _bitmap_decode),
    CODING_RAW: (_raw_encode, _raw_decode),
}
"""Encoder ``(indices, d) -> block`` and decoder ``(block, k, d) -> indices`` of each coding with a block."""


def encode_indices(indices: np.ndarray, d: int, index_coding: IndexCoding) -> tuple[int, bytes]:
    """``(coding, block)`` of sorted unique ``indices`` in ``[0, d)``: the forced coding, or with ``"auto"`` the
    smallest block (ties go to raw, then bitmap)."""
    coding = _choose_coding(indices, d) if index_coding == "auto" else _CODINGS[index_coding]
    return coding, _BLOCKS[coding][0](indices, d)


def decode_indices(coding: int, block: bytes, k: int, d: int) -> np.ndarray:
    """The ``k`` indices in ``[0, d)`` of an index block of ``coding`` (not :data:`CODING_SEED`)."""
    return _BLOCKS[coding][1](block, k, d)


def block_bounds(coding: int, k: int, d: int) -> tuple[int, int, bool]:
    """``(fewest, most, exact)``: the bytes an index block of ``coding`` for ``k`` of ``d`` coordinates may hold,
    and whether its size is known exactly (Rice blocks vary; the others, the empty seed block included, do not)."""
    if coding == CODING_RICE:
        return 1, 1 + (33 * k + d + 7) // 8, False
    size = {CODING_SEED: 0, CODING_BITMAP: (d + 7) // 8, CODING_RAW: 4 * k}[coding]
    return size, size, True
