"""Upload compressors as chainable ``(init, update)`` stages, in the style of optax transformations.

A :class:`Stage` is a pair of pure functions::

    state = stage.init(d)
    out, state = stage.update(inp, state, rng)

The first stage of a chain receives the client's update vector ``x`` (1-D, float32 or float64); later
stages receive the previous stage's payload. Stages that need a vector accept a payload too and use the
receiver's estimate of it (:func:`~sluice.compress.estimate.to_dense`). The last stage may turn the payload
into wire bytes (:func:`to_bytes`, :func:`zstd`). Every stage is deterministic given ``rng``. What each
payload's receiver estimates, and whether it is unbiased, is in :mod:`sluice.compress.estimate`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from sluice.compress.estimate import (
    _dense_like,
    _is_tensor,
    _on_device,
    randk_indices,
    sketch_hashes,
    to_dense,
    topk_indices,
)
from sluice.compress.values import QUANTIZERS, ValueType, _check_value_type, _to_dtype, quantize_sign
from sluice.errors import ConfigError, WireError
from sluice.wire import dtypes
from sluice.wire.vector import (
    DensePayload,
    IndexCoding,
    PatchChain,
    Payload,
    SketchPayload,
    SparsePayload,
    encode,
    float_values,
)

_SEED_BOUND = 2**63


class Stage(NamedTuple):
    """An ``(init, update)`` pair: ``init(d) -> state``; ``update(inp, state, rng) -> (out, state)``."""

    init: Callable[[int], Any]
    update: Callable[[Any, Any, np.random.Generator], tuple[Any, Any]]


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
    exceptions, whose estimate is their sum (:func:`~sluice.compress.estimate.to_dense`); an estimate with no
    value above λ is one sign payload. Values count as above λ when they exceed the smallest magnitude by more
    than one part in a million (float rounding of ``x_i / p_i``), or are not finite.

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

    ``T[j, c] = sum_{i: h_j(i) = c} s_j(i) x_i`` (see :func:`~sluice.compress.estimate.sketch_hashes`).
    Without ``seed`` a fresh 63-bit hash seed is drawn from ``rng`` on every call, which makes the mean
    unsketch unbiased; a fixed ``seed`` lets tables from several senders be summed. State: the number of columns.
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


def cast(dtype: ValueType) -> Stage:
    """Round the values (or sketch table) to fp16, fp32, int8 with a per-message scale
    (:func:`~sluice.compress.values.quantize_int8`) or signs with a per-message scale
    (:func:`~sluice.compress.values.quantize_sign`); a sketch table is not quantised and travels as fp16.
    Finite values saturate at the fp16 range."""
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

