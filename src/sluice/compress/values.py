"""The value types of vector messages and the quantisers of those that travel as int8 codes times a scale."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

from sluice.errors import ConfigError
from sluice.wire import dtypes

ValueType = Literal["fp32", "fp16", "int8", "sign"]
"""The value type of a vector message: float32, float16, int8 times a per-message float32 scale
(:func:`quantize_int8`), or signs times a per-message float32 scale (:func:`quantize_sign`, one bit per
value on the wire)."""
VALUE_TYPES: tuple[ValueType, ...] = ("fp32", "fp16", "int8", "sign")
"""Names of the value types, as in configuration (``up_values``, ``down_values``,
:func:`sluice.compress.stages.cast`)."""


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

