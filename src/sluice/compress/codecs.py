"""Upload compressors as chainable ``(init, update)`` stages, in the style of optax transformations.

A :class:`Stage` is a pair of pure functions::

    state = stage.init(d)
    out, state = stage.update(inp, state, rng)

The first stage of a chain receives the client's update vector ``x`` (1-D, float32 or float64); later
stages receive the previous stage's payload. Stages that need a vector accept a payload too and use the
receiver's estimate of it (:func:`to_dense`). The last stage may turn the payload into wire bytes
(:func:`to_bytes`, :func:`zstd`). Every stage is deterministic given ``rng``.

Estimators (``x`` in R^d, ``k`` kept coordinates):

* rand-k keeps a uniform random ``k``-subset ``S`` and sends ``x_S`` with scale ``d/k``; the receiver's
  estimate ``x_hat = (d/k) * sum_{i in S} x_i e_i`` is unbiased: ``P(i in S) = k/d`` so ``E x_hat = x``.
  The indices are not sent: they are regenerated from the 64-bit seed in the header.
* top-k keeps the ``k`` largest ``|x_i|`` (biased; explicit indices; scale 1).
* sample keeps coordinate ``i`` with probability ``p_i ∝ |x_i|`` capped at 1 (``Σ p_i = k``) and sends
  ``x_i / p_i`` (unbiased; explicit indices; :func:`sample`).
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
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import numpy as np

from sluice.errors import ConfigError, WireError
from sluice.wire import dtypes
from sluice.wire.vector import (
    MAX_D,
    DensePayload,
    IndexCoding,
    PatchChain,
    Payload,
    SketchPayload,
    SparsePayload,
    decode,
    encode,
    float_values,
)

_SEED_BOUND = 2**63


class Stage(NamedTuple):
    """An ``(init, update)`` pair: ``init(d) -> state``; ``update(inp, state, rng) -> (out, state)``."""

    init: Callable[[int], Any]
    update: Callable[[Any, Any, np.random.Generator], tuple[Any, Any]]


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
    (a sample upload whose values travel in two codings, :func:`sample_signs`). ``d``, when given, must match
    the payload.
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


# ------------------------------------------------------------------------------------------------ stages
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


def _vector(inp: Any) -> np.ndarray:
    """A 1-D vector from a stage input: the array itself (a tensor's copy on the CPU), or the estimate a payload
    stands for."""
    if isinstance(inp, DensePayload | SparsePayload | SketchPayload):
        return to_dense(inp)
    arr = inp.detach().cpu().numpy() if _is_tensor(inp) else np.asarray(inp)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.floating):
        raise WireError(f"a compressor expects a 1-D float vector, got {arr.dtype} of shape {arr.shape}")
    return arr


def _wire_values(v: np.ndarray) -> np.ndarray:
    """Keep the value types vector payloads carry (float16/float32); send anything else as float32."""
    return v if dtypes.of_numpy(v.dtype) in dtypes.VECTOR_DTYPES else v.astype(dtypes.FP32.numpy)


def _k_of(ratio: float, d: int) -> int:
    """``k = max(1, round(ratio * d))``, at most ``d``."""
    return min(d, max(1, round(ratio * d)))


def _check_ratio(name: str, ratio: float) -> float:
    if not 0 < ratio <= 1:
        raise ConfigError(f"{name} ratio must be in (0, 1], got {ratio}")
    return float(ratio)


def _new_seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, _SEED_BOUND))


def _no_state(d: int) -> None:
    return None


def dense() -> Stage:
    """Send every coordinate: ``x -> DensePayload(x)`` (float64 travels as float32)."""

    def update(inp: Any, state: Any, rng: np.random.Generator) -> tuple[DensePayload, Any]:
        return DensePayload(_wire_values(_vector(inp))), state

    return Stage(_no_state, update)


def randk(ratio: float) -> Stage:
    """Unbiased rand-k: ``k = max(1, round(ratio d))`` uniform coordinates, scale ``d/k``, seed-only indices.

    A fresh 63-bit seed is drawn from ``rng`` on every call; ``indices = randk_indices(d, k, seed)``.
    """
    ratio = _check_ratio("rand-k", ratio)

    def update(inp: Any, state: Any, rng: np.random.Generator) -> tuple[SparsePayload, Any]:
        x = _vector(inp)
        d = x.shape[0]
        k = _k_of(ratio, d)
        seed = _new_seed(rng)
        idx = randk_indices(d, k, seed)
        scale = d / k if k else 1.0
        return SparsePayload(d=d, values=_wire_values(x[idx]), seed=seed, scale=scale), state

    return Stage(_no_state, update)


def topk(ratio: float) -> Stage:
    """Top-k: the ``k = max(1, round(ratio d))`` largest ``|x_i|`` with explicit indices, scale 1; zeros are
    left out (fewer than ``k`` are sent when ``x`` has fewer nonzero values: a sign value cannot say 0)."""
    ratio = _check_ratio("top-k", ratio)

    def update(inp: Any, state: Any, rng: np.random.Generator) -> tuple[SparsePayload, Any]:
        if dev := _on_device(inp):  # on the tensor's device; the k kept entries come to the CPU
            idx, values = dev.topk(inp, _k_of(ratio, inp.shape[0]))
            return SparsePayload(d=inp.shape[0], values=_wire_values(values), indices=idx), state
        x = _vector(inp)
        idx = topk_indices(x, _k_of(ratio, x.shape[0]))
        idx = idx[x[idx] != 0]
        return SparsePayload(d=x.shape[0], values=_wire_values(x[idx]), indices=idx), state

    return Stage(_no_state, update)


def keep_probabilities(x: np.ndarray, k: int) -> np.ndarray:
    """Per-coordinate keep probabilities ``p_i = min(1, |x_i| / λ)`` with ``Σ p_i = k`` (all nonzero
    coordinates kept, ``p_i = 1``, when ``x`` has at most ``k`` of them).

    These minimise the variance ``Σ x_i² (1/p_i − 1)`` of the unbiased estimate ``x_i / p_i`` among
    probabilities with ``Σ p_i = k`` (Wangni, Wang, Liu, Zhang, "Gradient Sparsification for
    Communication-Efficient Distributed Optimization", NeurIPS 2018). With ``|x|`` sorted decreasingly,
    ``a_0 ≥ a_1 ≥ ...`` and tail sums ``T_c = Σ_{j≥c} a_j``, the first ``c`` coordinates are capped at
    ``p = 1`` for the smallest ``c`` with ``(k − c)·a_c ≤ T_c``, and ``λ = T_c / (k − c)``. Since ``c < k``, only
    the ``k`` largest magnitudes are sorted (a partition finds them) and ``T_c = Σ a − Σ_{j<c} a_j``: O(d + k log k)
    instead of a sort of all d. Non-finite values are kept for sure.
    """
    a = np.abs(np.asarray(x, dtype=np.float64))
    total = float(a.sum())
    if not np.isfinite(total):
        bad = ~np.isfinite(a)
        if bad.any():  # sent for sure, as top-k would send them, so that the receiver sees the divergence
            a[bad] = 0.0
            p = keep_probabilities(a, max(0, k - int(bad.sum())))
            p[bad] = 1.0
            return p
    if k <= 0:
        return np.zeros_like(a)
    if np.count_nonzero(a) <= k:
        return (a > 0).astype(np.float64)
    s = np.sort(np.partition(a, a.shape[0] - k)[a.shape[0] - k:])[::-1]  # the k largest, decreasing
    tail = total - np.concatenate(([0.0], np.cumsum(s[:-1])))  # T_c for c < k
    c = np.arange(k)
    capped = int(np.argmax((k - c) * s <= tail))  # c = k−1 always qualifies: a_{k−1} ≤ T_{k−1}
    p = a / (tail[capped] / (k - capped))
    return np.minimum(p, 1.0, out=p)


def sample(ratio: float) -> Stage:
    """Unbiased sparsification by importance: coordinate ``i`` is kept with probability
    ``p_i`` (:func:`keep_probabilities`, ``k = max(1, round(ratio d))`` expected) and sent as ``x_i / p_i``
    with explicit indices, so the estimate is unbiased, ``E x̂ = x``, with far less variance than rand-k's
    ``(d/k − 1)‖x‖²`` when ``x`` is uneven: the coordinates below the cap all travel as ``±λ``, which a
    sign value coding carries exactly, and the large ones are kept for sure.

    Unlike top-k it needs no residual of what was left out, which is what keeps it sound when a client
    takes part rarely: a top-k client's residual waits, growing stale, until its next participation,
    while a sample's leftovers reach the server in expectation at once. The keep draws come from ``rng`` (for a
    tensor, from a generator on its device seeded from ``rng``: :mod:`sluice.compress.device`).
    """
    ratio = _check_ratio("sample", ratio)

    def update(inp: Any, state: Any, rng: np.random.Generator) -> tuple[SparsePayload, Any]:
        if dev := _on_device(inp):
            idx, values = dev.sample(inp, _k_of(ratio, inp.shape[0]), _new_seed(rng))
            return SparsePayload(d=inp.shape[0], values=_wire_values(values), indices=idx), state
        x = _vector(inp)
        p = keep_probabilities(x, _k_of(ratio, x.shape[0]))
        idx = np.flatnonzero(rng.random(x.shape[0]) < p)
        return SparsePayload(d=x.shape[0], values=_wire_values(x[idx] / p[idx]), indices=idx), state

    return Stage(_no_state, update)


def sample_signs() -> Stage:
    """Value rounding of a :func:`sample` estimate to signs, with the coordinates kept for sure sent apart
    (``compression.up_sure_fp16``).

    Below the cap every value of a sample estimate is ``±λ`` (``x_i / p_i`` with ``p_i = |x_i|/λ``), which
    signs times one scale carry exactly. The coordinates kept for sure (``p_i = 1``, ``|x_i| > λ``) are few
    (about 1 % of an upload of 2 % of d on the suite's federations) but hold much of the update: 12 % of its
    energy on the default federation, 43 % on MNIST shards, 96 % at 8 % of d. Rounded to the signs' scale with
    the rest (:func:`cast`, the default), that energy waits in the client's residual until its next
    participation, so that a larger upload (a larger ``up_ratio``) brings the server less of the update, not
    more (MNIST shards with momentum: 0.869 at 8 % of d, 0.903 at 2 %; 0.908 at 8 % with this rounding). Here
    they travel as fp16 values in a second part: the message is a patch chain of the signs (scale λ) and the
    exceptions, whose estimate is their sum (:func:`to_dense`); an estimate with no value above λ is one sign
    payload. Values count as above λ when they exceed the smallest magnitude by more than one part in a
    million (float rounding of ``x_i / p_i``), or are not finite.

    Not the default: at 2 % of d it gains on MNIST shards (+1.1 points over 9 seeds) and the digits Dirichlet 0.1
    federations (+0.6), but where a round aggregates two uploads (Synthetic(1, 1), 20 clients, q 0.1) one
    client's largest coordinates then reach the server at once, and that federation lost 1.9 points over seeds
    0–8 and 3.3 over seeds 9–26; held back by the signs' scale, they arrive over the client's next
    participations."""

    def update(inp: Any, state: Any, rng: np.random.Generator) -> tuple[Payload, Any]:
        if not isinstance(inp, SparsePayload) or inp.indices is None or inp.vscale is not None:
            raise WireError("sample_signs rounds the float values of a sparse payload with explicit indices")
        v = float_values(inp).astype(np.float64)
        a = np.abs(v)
        above = ~np.isfinite(a) | (a > np.min(a, initial=np.inf) * (1 + 1e-6))
        q, vscale = quantize_sign(v[~above])
        signs = SparsePayload(d=inp.d, values=q, indices=inp.indices[~above], scale=inp.scale, vscale=vscale)
        if not above.any():
            return signs, state
        exceptions = SparsePayload(d=inp.d, values=_to_dtype(v[above], dtypes.FP16.numpy),
                                   indices=inp.indices[above], scale=inp.scale)
        return PatchChain((signs, exceptions)), state

    return Stage(_no_state, update)


def count_sketch(
    rows: int, cols: int | None = None, *, cols_ratio: float | None = None, seed: int | None = None
) -> Stage:
    """Count sketch with ``rows`` hash rows of ``cols`` buckets (or ``max(1, round(cols_ratio d))``).

    ``T[j, c] = sum_{i: h_j(i) = c} s_j(i) x_i`` (see :func:`sketch_hashes`). Without ``seed`` a fresh
    63-bit hash seed is drawn from ``rng`` on every call, which makes the mean unsketch unbiased; a fixed
    ``seed`` lets tables from several senders be summed. State: the number of columns.
    """
    if rows < 1:
        raise ConfigError(f"count sketch needs rows >= 1, got {rows}")
    if (cols is None) == (cols_ratio is None):
        raise ConfigError("count sketch needs exactly one of cols and cols_ratio")
    if cols is not None and cols < 1:
        raise ConfigError(f"count sketch needs cols >= 1, got {cols}")
    if cols_ratio is not None:
        _check_ratio("count sketch column", cols_ratio)
    if seed is not None and not 0 <= seed < 2**64:
        raise ConfigError(f"count sketch seed must be in [0, 2**64), got {seed}")

    def init(d: int) -> int:
        return cols if cols is not None else max(1, round(cols_ratio * d))  # type: ignore[operator]

    def update(inp: Any, state: int, rng: np.random.Generator) -> tuple[SketchPayload, int]:
        x = _vector(inp).astype(np.float64)
        d = x.shape[0]
        s = seed if seed is not None else _new_seed(rng)
        buckets, signs = sketch_hashes(d, rows, state, s)
        table = np.empty((rows, state), dtype=np.float64)
        for j in range(rows):
            table[j] = np.bincount(buckets[j], weights=signs[j] * x, minlength=state)
        return SketchPayload(d=d, seed=s, table=table.astype(np.float32)), state

    return Stage(init, update)


ValueType = Literal["fp32", "fp16", "int8", "sign"]
"""The value type of a vector message: float32, float16, int8 times a per-message float32 scale
(:func:`quantize_int8`), or signs times a per-message float32 scale (:func:`quantize_sign`, one bit per
value on the wire)."""
VALUE_TYPES: tuple[ValueType, ...] = ("fp32", "fp16", "int8", "sign")
"""Names of the value types, as in configuration (``up_values``, ``down_values``, :func:`cast`)."""


def value_type(setting: str, dense: bool, compressed: ValueType = "int8") -> ValueType:
    """The value type of a vector message from its setting (``up_values``, ``down_values``): one of
    :data:`VALUE_TYPES`, or ``"auto"`` = fp32 when every coordinate is sent (``dense``) and ``compressed``
    (int8 unless the caller knows better) when the vector is compressed (sparse or sketched), where the
    saved bytes matter more than the rounding, which error feedback keeps (the residuals of the client's
    uploads and of the server's steps)."""
    if setting == "auto":
        return "fp32" if dense else compressed
    return _check_value_type(setting, "a vector value type", "auto, ")


def _check_value_type(name: str, what: str, also: str = "") -> ValueType:
    """``name`` if it is one of :data:`VALUE_TYPES`, else ConfigError naming ``what``."""
    if name not in VALUE_TYPES:
        raise ConfigError(f"{what} must be one of {also}{', '.join(VALUE_TYPES)}; got {name!r}")
    return name  # type: ignore[return-value]


def quantize_int8(v: np.ndarray) -> tuple[np.ndarray, float]:
    """``(q, s)``: int8 ``q = rint(v / s)`` in [-127, 127] with the float32 scale ``s = max|v| / 127``
    (round to nearest; the error, at most ``s/2`` per value, is for error feedback to keep). Non-finite
    values count as the largest finite ones' sign times 127; an all-zero vector has scale 0."""
    v = np.asarray(v, dtype=np.float64)
    finite = np.isfinite(v)
    top = float(np.abs(v[finite]).max()) if finite.any() else 0.0
    s = np.float32(top / 127.0)
    if s == 0 or not np.isfinite(s):
        return np.where(finite, 0, np.sign(np.nan_to_num(v)) * 127).astype(np.int8), 0.0
    q = np.clip(np.rint(np.where(finite, v / np.float64(s), np.sign(np.nan_to_num(v)) * 127)), -127, 127)
    return q.astype(np.int8), float(s)


def quantize_sign(v: np.ndarray) -> tuple[np.ndarray, float]:
    """``(q, s)``: int8 signs ``q = sign(v)`` in {-1, +1} (0 and NaN count as +1) with the float32 scale
    ``s = mean |v|`` over the finite values: sparse ternary compression's ``mu`` (Sattler, Wiedemann,
    Müller, Samek, "Robust and Communication-Efficient Federated Learning from Non-IID Data", IEEE TNNLS
    2019), which is also the ``s`` minimising ``||v - s q||_2`` for these signs. The error ``v - s q`` is
    for error feedback to keep. ``q`` travels as one bit per value (:mod:`sluice.wire.vector`, value
    coding 2); ``s`` saturates at the float32 range; no finite values give scale 0."""
    v = np.asarray(v, dtype=np.float64)
    finite = np.isfinite(v)
    mean = float(np.abs(v[finite]).mean()) if finite.any() else 0.0
    s = float(np.float32(min(mean, float(np.finfo(np.float32).max))))
    return np.where(v < 0, -1, 1).astype(np.int8), s


QUANTIZERS: dict[str, Callable[[np.ndarray], tuple[np.ndarray, float]]] = {
    "int8": quantize_int8, "sign": quantize_sign}
"""The value types that travel as int8 codes times a per-message scale, and their quantisers."""


def _to_dtype(v: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype == dtypes.FP16.numpy and v.dtype != dtype:
        # saturate finite values at +-65504 instead of overflowing to inf
        v = np.where(np.isfinite(v), np.clip(v, -dtypes.FP16_MAX, dtypes.FP16_MAX), v)
    return v.astype(dtype)


def cast(dtype: ValueType) -> Stage:
    """Round the values (or sketch table) to fp16, fp32, int8 with a per-message scale
    (:func:`quantize_int8`) or signs with a per-message scale (:func:`quantize_sign`); a sketch table is
    not quantised and travels as fp16. Finite values saturate at the fp16 range."""
    quantize = QUANTIZERS.get(_check_value_type(dtype, "cast dtype"))
    np_dtype = {t.name: t.numpy for t in dtypes.VECTOR_DTYPES}["fp16" if quantize else dtype]

    def update(inp: Any, state: Any, rng: np.random.Generator) -> tuple[Payload, Any]:
        if quantize is not None and isinstance(inp, SparsePayload | DensePayload):
            q, vscale = quantize(float_values(inp))
            if isinstance(inp, DensePayload):
                return DensePayload(q, vscale=vscale), state
            return SparsePayload(d=inp.d, values=q, indices=inp.indices, seed=inp.seed, scale=inp.scale,
                                 vscale=vscale), state
        if isinstance(inp, SparsePayload):
            out: Payload = SparsePayload(
                d=inp.d, values=_to_dtype(inp.values, np_dtype), indices=inp.indices, seed=inp.seed,
                scale=inp.scale,
            )
        elif isinstance(inp, SketchPayload):
            out = SketchPayload(d=inp.d, seed=inp.seed, table=_to_dtype(inp.table, np_dtype))
        elif isinstance(inp, DensePayload):
            out = DensePayload(_to_dtype(inp.values, np_dtype))
        else:
            out = DensePayload(_to_dtype(_vector(inp), np_dtype))
        return out, state

    return Stage(_no_state, update)


def error_feedback(main: Stage, values: Stage, *, biased: bool) -> Stage:
    """Compress with ``main`` then ``values`` (the value rounding), keeping what did not travel.

    State: the residual ``e`` (float64; a tensor on the device of ``x`` when ``x`` is one) and the inner
    stages' states. Each call compresses ``x + e``.
    For a biased ``main`` (top-k) the new residual is everything the receiver's estimate lacks,
    ``e = (x + e) − x̂``: the coordinates left out and the rounding of those sent (error feedback as in
    EF-SGD, Karimireddy et al. 2019; DGC keeps it at the client the same way). For an unbiased ``main``
    (rand-k) only the rounding error of the values is kept, ``e = x̃ − x̂`` with ``x̃`` the estimate before
    rounding: the residual then travels inside the next unbiased estimate, so in expectation every
    rounding error reaches the server, one participation later, and nothing is lost.
    """

    def init(d: int) -> tuple[np.ndarray, Any, Any]:
        return np.zeros(d, dtype=np.float64), main.init(d), values.init(d)

    def update(inp: Any, state: tuple[np.ndarray, Any, Any], rng: np.random.Generator) -> tuple[Any, Any]:
        residual, s_main, s_values = state
        if dev := _on_device(inp):
            x = dev.plus(inp, residual)
            picked, s_main = main.update(x, s_main, rng)
            out, s_values = values.update(picked, s_values, rng)
            residual = (x if biased else _dense_like(picked, x)) - _dense_like(out, x)
            return out, (residual, s_main, s_values)
        x = _vector(inp).astype(np.float64) + residual
        picked, s_main = main.update(x, s_main, rng)
        out, s_values = values.update(picked, s_values, rng)
        residual = (x if biased else to_dense(picked)) - to_dense(out)
        return out, (residual, s_main, s_values)

    return Stage(init, update)


def to_bytes(lossless: bool = False, index_coding: IndexCoding = "auto") -> Stage:
    """Final stage: ``payload -> encode(payload, lossless=..., index_coding=...)`` (wire bytes)."""

    def update(inp: Any, state: Any, rng: np.random.Generator) -> tuple[bytes, Any]:
        return encode(inp, lossless=lossless, index_coding=index_coding), state

    return Stage(_no_state, update)


def zstd() -> Stage:
    """Lossless final stage: the payload body is zstd-compressed on the wire (kept raw if not smaller)."""
    return to_bytes(lossless=True)


def chain(*stages: Stage) -> Stage:
    """Compose stages left to right; the state is the tuple of the stages' states."""

    def init(d: int) -> tuple[Any, ...]:
        return tuple(s.init(d) for s in stages)

    def update(inp: Any, state: tuple[Any, ...], rng: np.random.Generator) -> tuple[Any, tuple[Any, ...]]:
        new_state = []
        for s, st in zip(stages, state, strict=True):
            inp, st = s.update(inp, st, rng)
            new_state.append(st)
        return inp, tuple(new_state)

    return Stage(init, update)


# ------------------------------------------------------------------------------------------- compressor
class Compressor:
    """A client's uplink compressor: a stage chain whose output is encoded to bytes.

    ``state = c.init(d)``; ``buf, state = c.encode(x, state, rng)``; the server calls
    :func:`decode_to_dense` ``(buf)``. ``len(buf)`` is the uplink cost of the message, header included. ``x``
    may be a torch tensor on a GPU: top-k, sample and error feedback then compute there
    (:mod:`sluice.compress.device`), the other stages on its copy on the CPU.
    """

    def __init__(self, stage: Stage, *, name: str = "custom") -> None:
        self.stage = stage
        self.name = name

    def __repr__(self) -> str:
        return f"Compressor({self.name})"

    def init(self, d: int) -> tuple[int, Any]:
        """State for vectors of length ``d``."""
        if d < 0:
            raise ConfigError(f"vector length must be >= 0, got {d}")
        return (int(d), self.stage.init(int(d)))

    def encode(
        self, vec: np.ndarray, state: tuple[int, Any], rng: np.random.Generator
    ) -> tuple[bytes, tuple[int, Any]]:
        """Compress ``vec`` and return the wire message and the new state."""
        d, inner = state
        x = vec if _is_tensor(vec) else np.asarray(vec)
        if tuple(x.shape) != (d,):
            raise ValueError(f"compressor was initialised for d={d}, got a vector of shape {x.shape}")
        out, inner = self.stage.update(x, inner, rng)
        if not isinstance(out, bytes):
            out = encode(out)
        return out, (d, inner)


def make_uplink(cfg: Any) -> Compressor:
    """The uplink compressor described by a :class:`sluice.config.CompressionConfig`.

    ``up`` picks the main stage (dense, randk, topk, sample with ``up_ratio``; sketch with ``sketch_rows``
    and ``sketch_cols_ratio``), ``up_values`` the value precision (:func:`value_type`: "auto" is fp32 for
    dense uploads, signs for sample uploads, whose values below the cap are all ``±λ``, and int8 otherwise;
    with ``up_sure_fp16`` a sample upload sends the values above the cap in fp16, :func:`sample_signs`),
    ``lossless`` the zstd final stage.
    """
    auto = "sign" if cfg.up == "sample" else "int8"
    values = value_type(cfg.up_values, dense=cfg.up == "dense", compressed=auto)
    if cfg.up == "dense":
        main = dense()
    elif cfg.up == "randk":
        main = randk(cfg.up_ratio)
    elif cfg.up == "topk":
        main = topk(cfg.up_ratio)
    elif cfg.up == "sample":
        main = sample(cfg.up_ratio)
    elif cfg.up == "sketch":
        main = count_sketch(cfg.sketch_rows, cols_ratio=cfg.sketch_cols_ratio)
    else:
        raise ConfigError(f"compression.up must be one of dense, randk, topk, sample, sketch; got {cfg.up!r}")
    if cfg.lossless not in ("none", "zstd"):
        raise ConfigError(f"compression.lossless must be 'none' or 'zstd', got {cfg.lossless!r}")
    if cfg.up_sure_fp16 and (cfg.up != "sample" or values != "sign"):
        raise ConfigError(f"compression.up_sure_fp16 needs sample uploads with sign values; got up={cfg.up!r}, "
                          f"up_values={cfg.up_values!r}")
    name = f"{cfg.up}" + (f"({cfg.up_ratio:g})" if cfg.up in ("randk", "topk", "sample") else "")
    name += f"+{values}" + ("+fp16 above the cap" if cfg.up_sure_fp16 else "") + (
        "+zstd" if cfg.lossless == "zstd" else "")
    final = zstd() if cfg.lossless == "zstd" else to_bytes()
    rounding = sample_signs() if cfg.up_sure_fp16 else cast(values)
    if cfg.up_feedback and cfg.up in ("randk", "topk", "sample"):
        return Compressor(chain(error_feedback(main, rounding, biased=cfg.up == "topk"), final),
                          name=name + "+ef")
    return Compressor(chain(main, rounding, final), name=name)
