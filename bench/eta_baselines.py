"""The rules ``bench/eta.py`` compares Sluice's remaining-iteration estimate with, each from the curve so far.

* **as many again**: remaining = iterations done;
* **linear extrapolation**: a straight line through the last quarter of the values (at least 4) continued to
  the threshold (no estimate when it moves away from it);
* **cross-seed oracle**: the median stopping iteration of the other seeds of the same job and target, less
  the iterations done (at least 1): what a consumer who knew the job's other runs would say;
* **learning-curve ensemble** in the manner of Domhan et al. (2015): four parametric families (pow3
  ``c − a·n^−α``, exp3 ``c − a·e^(−b·n)``, log-linear ``a + b·log n``, ilog2 ``c − a/log(n + 1)``) fitted by
  least squares, weighted by ``exp(−BIC/2)``, the weighted curve continued to the threshold (up to 50× the
  iterations done).
"""

from __future__ import annotations

import math
import statistics
import warnings

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit


def as_many_again(n: int) -> float:
    return float(n)


def linear(ns: np.ndarray, ys: np.ndarray, target: float, sgn: float, n: int) -> float:
    k = max(4, ns.size // 4)
    if ns.size < 4:
        return math.inf
    x, y = ns[-k:], sgn * ys[-k:]
    slope, icpt = np.polyfit(x, y, 1)
    if slope <= 0:
        return math.inf
    cross = (sgn * target - icpt) / slope
    return max(1.0, cross - n)


def oracle(other_stops: list[int], n: int) -> float:
    return math.inf if not other_stops else max(1.0, statistics.median(other_stops) - n)


CURVES = {
    "pow3": (lambda n, c, a, al: c - a * np.power(n, -al), (1.0, 1.0, 0.5), ([-10, -10, 0.01], [10, 10, 4])),
    "exp3": (lambda n, c, a, b: c - a * np.exp(-b * n), (1.0, 1.0, 0.05), ([-10, -10, 1e-5], [10, 10, 5])),
    "loglin": (lambda n, a, b: a + b * np.log(n), (0.0, 0.1), ([-10, -10], [10, 10])),
    "ilog2": (lambda n, c, a: c - a / np.log(n + 1), (1.0, 1.0), ([-10, -10], [10, 10])),
}


def ensemble(ns: np.ndarray, ys: np.ndarray, target: float, sgn: float, n: int) -> float:
    """Remaining iterations until the weighted parametric curve passes ``target`` (inf: not within 50×)."""
    if ns.size < 5:
        return math.inf
    z = sgn * ys
    fits, bics = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OptimizeWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        for fn, p0, bounds in CURVES.values():
            try:
                p, _ = curve_fit(fn, ns, z, p0=p0, bounds=bounds, maxfev=400)
            except (RuntimeError, ValueError):
                continue
            sse = float(np.sum((fn(ns, *p) - z) ** 2))
            fits.append((fn, p))
            bics.append(ns.size * math.log(max(sse, 1e-12) / ns.size) + len(p) * math.log(ns.size))
    if not fits:
        return math.inf
    b = np.array(bics)
    w = np.exp(-(b - b.min()) / 2)
    w /= w.sum()
    step = max(1.0, float(np.median(np.diff(ns[-8:]))))
    future = ns[-1] + step * np.arange(1, int(50 * ns[-1] / step) + 2)
    curve = sum(wi * fn(future, *p) for wi, (fn, p) in zip(w, fits, strict=True))
    hit = np.flatnonzero(curve >= sgn * target)
    return math.inf if hit.size == 0 else max(1.0, float(future[hit[0]] - n))
