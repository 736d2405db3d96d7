"""What a receiver makes of a vector message: the estimate of the sent vector, and the index and hash
tables a sender and its receiver both regenerate from a seed.

Estimators (``x`` in R^d, ``k`` kept coordinates; the stages that send them are in :mod:`sluice.compress.stages`):

* rand-k keeps a uniform random ``k``-subset ``S`` and sends ``x_S`` with scale ``d/k``; the receiver's
  estimate ``x_hat = (d/k) * sum_{i in S} x_i e_i`` is unbiased: ``P(i in S) = k/d`` so ``E x_hat = x``.
  The indices are not sent: they are regenerated from the 64-bit seed in the header.
* top-k keeps the ``k`` largest ``|x_i|`` (biased; explicit indices; scale 1).
* sample keeps coordinate ``i`` with probability ``p_i ∝ |x_i|`` capped at 1 (``Σ p_i = k``) and sends
  ``x_i / p_i`` (unbiased; explicit indices; :func:`sluice.compress.stages.sample`).
* count sketch with ``R`` rows and ``C`` columns: row ``j`` has a bucket hash ``h_j: [d] -> [C]`` and a
  sign hash ``s_j: [d] -> {-1, +1}`` (independent fair signs), both derived from a seed carried in the
  payload. ``T[j, c] = sum_{i: h_j(i) = c} s_j(i) x_i``. The receiver unsketches with the MEAN over rows,
  ``x_hat_i = (1/R) sum_j s_j(i) T[j, h_j(i)] = x_i + (1/R) sum_j sum_{l != i, h_j(l) = h_j(i)}
  s_j(i) s_j(l) x_l``, which is unbiased because ``E[s_j(i) s_j(l)] = 0`` for ``l != i``; each row adds
  variance about ``||x||^2 / C``. (:func:`unsketch` also offers the median, which is robust but biased.)
  The sketch is linear: tables with the same seed and shape may be summed before unsketching.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Literal

import numpy as np

from sluice.errors import ConfigError, WireError
from sluice.wire.vector import (
    MAX_D,
    DensePayload,
    PatchChain,
    Payload,
    SketchPayload,
    SparsePayload,
    decode,
    float_values,
)


# ------------------------------------------------------------------------------------------- sampling
def _uniform_below(bitgen: np.random.PCG64, n: int, count: int) -> np.ndarray:
    """Up to ``count`` exactly uniform draws from ``[0, n)``, ``1 <= n <= 2^32`` (Lemire's method).

    From a 32-bit uniform ``u``, ``m = u * n``; ``m >> 32`` is uniform on ``[0, n)`` once draws whose low
    half ``m mod 2^32`` falls below ``2^32 mod n`` are rejected. Only the PCG64 raw stream is used, so
    the result does not depend on the numpy version.
    """
    u = bitgen.random_raw(count) >> np.uint64(32)
    m = u * np.uint64(n)
    keep = (m & np.uint64(0xFFFFFFFF)) >= np.uint64((1 << 32) % n)
    return (m[keep] >> np.uint64(32)).astype(np.int64)


def _distinct_uniform(bitgen: np.random.PCG64, d: int, m: int) -> np.ndarray:
    """The first ``m`` distinct values of a uniform stream on ``[0, d)``: a uniform ``m``-subset."""
    draws = np.empty(0, dtype=np.int64)
    # expected draws for m distinct values: d (H_d - H_{d-m}) ~ d ln(d / (d - m))
    want = int(d * math.log(d / (d - m)) * 1.05) + 16 if m < d else 4 * d + 16
    while True:
        draws = np.concatenate([draws, _uniform_below(bitgen, d, want)])
        _, first = np.unique(draws, return_index=True)
        if first.shape[0] >= m:
            return draws[np.sort(first)[:m]]
        want = max(16, 2 * (m - first.shape[0]) * d // max(1, d - first.shape[0]))


def randk_indices(d: int, k: int, seed: int) -> np.ndarray:
    """Sorted int64 indices of a uniform random ``k``-subset of ``[0, d)`` drawn from ``seed``.

    Deterministic in ``(d, k, seed)`` across platforms and numpy versions (PCG64 raw stream; for
    ``k > d/2`` the complement of a uniform ``(d-k)``-subset is returned, which is again uniform).
    """
    if not 0 <= k <= d <= MAX_D:
        raise WireError(f"rand-k needs 0 <= k <= d <= {MAX_D}, got d={d}, k={k}")
    if not 0 <= seed < 2**64:
        raise WireError(f"rand-k seed must be in [0, 2**64), got {seed}")
    if k == 0:
        return np.empty(0, dtype=np.int64)
    if k == d:
        return np.arange(d, dtype=np.int64)
    bitgen = np.random.PCG64(seed)
    if 2 * k <= d:
        return np.sort(_distinct_uniform(bitgen, d, k))
    mask = np.ones(d, dtype=bool)
    mask[_distinct_uniform(bitgen, d, d - k)] = False
    return np.flatnonzero(mask).astype(np.int64)


def topk_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Sorted int64 indices of the ``k`` largest ``|x_i|``; ties go to the lower index, NaN counts as inf."""
    key = np.abs(np.asarray(x, dtype=np.float64).reshape(-1))
    key[np.isnan(key)] = np.inf
    n = key.shape[0]
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if k >= n:
        return np.arange(n, dtype=np.int64)
    t = np.partition(key, n - k)[n - k]
    above = np.flatnonzero(key > t)
    ties = np.flatnonzero(key == t)[: k - above.shape[0]]
    return np.sort(np.concatenate([above, ties])).astype(np.int64)


def sketch_hashes(d: int, rows: int, cols: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Bucket ``h_j(i)`` (int64, ``rows x d``) and sign ``s_j(i)`` (float64 +-1) tables from ``seed``.

    One PCG64 word per (row, coordinate): its high 32 bits ``u`` give the bucket ``(u * cols) >> 32`` and
    its lowest bit the sign, so signs are independent fair coins (what unbiasedness needs).
    """
    raw = np.random.PCG64(seed).random_raw(rows * d).reshape(rows, d)
    buckets = (((raw >> np.uint64(32)) * np.uint64(cols)) >> np.uint64(32)).astype(np.int64)
    signs = 1.0 - 2.0 * (raw & np.uint64(1)).astype(np.float64)
    return buckets, signs


def unsketch(payload: SketchPayload, how: Literal["mean", "median"] = "mean") -> np.ndarray:
    """Float64 estimate ``x_hat_i = agg_j s_j(i) T[j, h_j(i)]``; ``"mean"`` is unbiased, ``"median"`` not."""
    buckets, signs = sketch_hashes(payload.d, payload.rows, payload.cols, payload.seed)
    table = payload.table.astype(np.float64)
    per_row = signs * np.take_along_axis(table, buckets, axis=1)
    if how == "mean":
        return per_row.mean(axis=0) if payload.d else np.zeros(0)
    if how == "median":
        return np.median(per_row, axis=0) if payload.d else np.zeros(0)
    raise ConfigError(f"unsketch: how must be 'mean' or 'median', got {how!r}")


# ---------------------------------------------------------------------------------- receiver estimate
def to_dense(payload: Payload, d: int | None = None) -> np.ndarray:
    """The receiver's float64 estimate of the sent vector (unbiased for rand-k and count sketch).

    Dense: the values. Sparse: zeros with ``scale * values`` at the indices (regenerated from the seed
    when not sent). Sketch: :func:`unsketch` with the mean. Patch chain: the sum of its parts' estimates
    (a sample upload whose values travel in two codings, :func:`sluice.compress.stages.sample_signs`). ``d``,
    when given, must match the payload.
    """
    if isinstance(payload, PatchChain) and payload.parts:
        out = to_dense(payload.parts[0], d)
        for part in payload.parts[1:]:
            out += to_dense(part, d)
        return out
    if isinstance(payload, DensePayload):
        n = payload.d
    elif isinstance(payload, SparsePayload | SketchPayload):
        n = payload.d
    else:
        raise WireError(f"to_dense expects a Dense/Sparse/Sketch payload, got {type(payload).__name__}")
    if d is not None and d != n:
        raise WireError(f"payload describes a vector of length {n}, expected {d}")
    if isinstance(payload, DensePayload):
        return float_values(payload).astype(np.float64)
    if isinstance(payload, SketchPayload):
        return unsketch(payload)
    idx = payload.indices if payload.indices is not None else randk_indices(n, payload.k, payload.seed)
    out = np.zeros(n, dtype=np.float64)
    out[idx] = float_values(payload).astype(np.float64) * payload.scale
    return out


def decode_to_dense(buf: bytes, d: int | None = None) -> np.ndarray:
    """``to_dense(decode(buf), d)``."""
    return to_dense(decode(buf), d)


def add_estimate(g: Any, estimate: Any, coef: float) -> None:
    """``g += coef * estimate`` in place. ``g``: a float64 numpy array, or a tensor on any device (only a sparse
    payload's ``k`` entries travel to it); ``estimate``: a payload (:func:`decode_estimate`) or a dense vector.
    A sparse payload with explicit indices adds ``coef * (scale * value)`` at its indices only, which is what
    adding ``coef *`` :func:`to_dense` would add there."""
    put = dev.put(g) if (dev := _on_device(g)) else np.asarray
    if isinstance(estimate, PatchChain):
        for part in estimate.parts:
            add_estimate(g, part, coef)
    elif isinstance(estimate, SparsePayload) and estimate.indices is not None:
        vals = float_values(estimate).astype(np.float64) * estimate.scale
        g[put(estimate.indices.astype(np.int64))] += put(coef * vals)
    else:
        g += put(coef * (estimate if isinstance(estimate, np.ndarray) else to_dense(estimate)))


def _dense_like(payload: Payload, like: Any) -> Any:
    """:func:`to_dense` of ``payload`` as a float64 tensor on the device of the tensor ``like``."""
    out = like.new_zeros(like.shape[0], dtype=like.dtype)
    add_estimate(out, payload, 1.0)
    return out


def decode_estimate(buf: bytes, d: int) -> Payload:
    """``decode(buf)`` checked to be what :func:`to_dense` turns into an estimate of a ``d``-vector (the
    same :class:`WireError` otherwise), kept as a payload so that its receiver adds only its entries."""
    payload = decode(buf)
    parts = payload.parts if isinstance(payload, PatchChain) else (payload,)
    if not parts or not all(isinstance(p, DensePayload | SparsePayload | SketchPayload) for p in parts):
        raise WireError(f"to_dense expects a Dense/Sparse/Sketch payload, got {type(payload).__name__}")
    if parts[0].d != d:
        raise WireError(f"payload describes a vector of length {parts[0].d}, expected {d}")
    return payload


def _is_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (without importing torch where nothing has)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _on_device(x: Any) -> Any:
    """:mod:`sluice.compress.device` when ``x`` is a tensor (imported then), else None."""
    if not _is_tensor(x):
        return None
    from sluice.compress import device

    return device

