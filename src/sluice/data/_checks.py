"""Argument checks shared by the data modules; each failure is a :class:`DataError` naming the field."""

from __future__ import annotations

import numbers

import numpy as np

from sluice.errors import DataError


def check_seed(seed: object) -> int:
    """Return ``seed`` as an int, or raise when it is not an integer in ``[0, 2**32)``."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= int(seed) < 2**32:
        raise DataError(f"seed must be an integer in [0, 2**32), got {seed!r}")
    return int(seed)


def check_fraction(name: str, value: object) -> float:
    """Return ``value`` as a float, or raise when it is not strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 < float(value) < 1.0:
        raise DataError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
    return float(value)


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` as an int, or raise when it is not an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise DataError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_labels(y: object) -> np.ndarray:
    """Return ``y`` as a 1-D int64 array of non-negative labels, or raise."""
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise DataError(f"labels y must be a 1-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.issubdtype(arr.dtype, np.floating) or not np.all(np.mod(arr, 1) == 0):
            raise DataError(f"labels y must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise DataError(f"labels y must be non-negative class indices, got minimum {int(arr.min())}")
    return arr
