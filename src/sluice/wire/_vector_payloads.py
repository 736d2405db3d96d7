"""The vector payloads of federated training: what :mod:`sluice.wire.vector` encodes and decodes.

:class:`DensePayload`, :class:`SparsePayload`, :class:`SketchPayload`, :class:`PatchChain` and :class:`ReplayChain`
check their fields on construction, so every payload that exists can be encoded, and a decoder that builds one
from a message gets the same checks. Payloads are immutable and compare bit for bit (NaNs with the same bits are
equal); they are unhashable. :func:`float_values` and :func:`replay_block` are the float32 arithmetic that sender
and receiver share, so both hold the same bits.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from sluice.errors import WireError
from sluice.wire.dtypes import INT8, WireDtype, of_numpy

MAX_D = 2**32 - 1
"""Largest vector length a sparse or sketch payload may describe (indices travel as uint32)."""


def _value_type(arr: np.ndarray) -> WireDtype | None:
    """The table entry of a vector payload's value type, or None when vector payloads cannot carry it."""
    t = of_numpy(arr.dtype)
    return t if t is not None and t.vector_bit is not None else None


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
    regenerates the indices with :func:`sluice.compress.estimate.randk_indices` ``(d, k, seed)``) is given.
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
