"""Learning curves: power-law fits, one curve or a batch of curves at once, and where the fitted regime starts.

The monitored metric is modelled as a power law in the iteration count ``n``::

    y(n) = c + a · n^(−α),   α > 0

(``c`` is the asymptote; ``a > 0`` for a decreasing loss, ``a < 0`` for an increasing accuracy). For a
fixed ``α`` the least-squares ``(c, a)`` has a closed form (simple linear regression of ``y`` on
``x = n^(−α)``: ``a = Sxy/Sxx``, ``c = ȳ − a·x̄``); when the metric has a range (accuracy in [0, 1], a
loss ≥ 0) and ``c`` falls outside it, ``c`` is clamped to the bound and ``a = Σx(y − c)/Σx²``. ``α`` is the
best of a log-spaced grid refined twice around the best (:func:`fit_power_law`; :func:`fit_batch` fits a
batch of curves at once, with a few array products).

A power law describes the regime after the initial transient (many curves first stay flat, then rise
steeply): :func:`regime_start` finds the steepest improvement of the moving average (window
``max(3, n/10)``); fits use the iterations from there on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALPHA_MIN, ALPHA_MAX = 0.02, 4.0


@dataclass(frozen=True)
class PowerLaw:
    """Fitted ``y(n) = c + a·n^(−α)``; ``r2`` is the fraction of variance explained."""

    c: float
    a: float
    alpha: float
    r2: float
    points: int

    def __call__(self, n: float | np.ndarray) -> float | np.ndarray:
        return self.c + self.a * np.power(n, -self.alpha)


def _grid_fit(n: np.ndarray, ys: np.ndarray, alphas: np.ndarray,
              bounds: tuple[float | None, float | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares of every curve of ``ys`` (B, N) at the exponents ``alphas`` (A,), or (B, A) for one grid
    per curve: ``(a, c, sse)``, each (B, A), from the sums ``Σx, Σx², Σy, Σy², Σxy``."""
    grid = alphas if alphas.ndim == 2 else alphas[None, :]
    x = np.exp(-grid[:, :, None] * np.log(n)[None, None, :])  # n^(−α): (1 or B, A, N)
    m = n.shape[0]
    sx, sxx = x.sum(axis=2), (x * x).sum(axis=2)
    sy, syy = ys.sum(axis=1)[:, None], (ys * ys).sum(axis=1)[:, None]
    sxy = np.einsum("ban,bn->ba", x, ys) if alphas.ndim == 2 else ys @ x[0].T
    vx = sxx - sx * sx / m
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(vx > 0, (sxy - sx * sy / m) / vx, 0.0)
    c = (sy - a * sx) / m
    for bound, outside in ((bounds[0], np.less), (bounds[1], np.greater)):
        if bound is not None:
            mask = outside(c, bound)
            a = np.where(mask, (sxy - bound * sx) / sxx, a)
            c = np.where(mask, bound, c)
    sse = syy - 2 * c * sy - 2 * a * sxy + m * c * c + 2 * a * c * sx + a * a * sxx
    return a, c, np.maximum(sse, 0.0)


def fit_batch(ns: np.ndarray, ys: np.ndarray, bounds: tuple[float | None, float | None] = (None, None)
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Power-law fits of every curve of ``ys`` (B, N) at iterations ``ns`` (N,): ``(c, a, α)``, each (B,): the
    best ``α`` of a log grid on ``[ALPHA_MIN, ALPHA_MAX]``, refined three times around each curve's best."""
    n, y = np.asarray(ns, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    alphas = np.geomspace(ALPHA_MIN, ALPHA_MAX, 32)
    ratio = alphas[1] / alphas[0]
    a, c, sse = _grid_fit(n, y, alphas, bounds)
    best = alphas[np.argmin(sse, axis=1)]
    rows = np.arange(y.shape[0])
    for _ in range(3):
        grid = np.clip(best[:, None] * np.geomspace(1 / ratio, ratio, 7)[None, :], ALPHA_MIN, ALPHA_MAX)
        a, c, sse = _grid_fit(n, y, grid, bounds)
        i = np.argmin(sse, axis=1)
        best, ratio = grid[rows, i], ratio ** 0.25
    return c[rows, i], a[rows, i], best


def fit_power_law(
    ns: np.ndarray | list[float],
    ys: np.ndarray | list[float],
    bounds: tuple[float | None, float | None] = (None, None),
) -> PowerLaw | None:
    """Least-squares power-law fit with the asymptote kept in ``bounds``; None when fewer than 4 finite
    points or ``y`` is constant."""
    n = np.asarray(ns, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    ok = np.isfinite(n) & np.isfinite(y) & (n > 0)
    n, y = n[ok], y[ok]
    if n.size < 4 or np.ptp(y) == 0 or np.ptp(n) == 0:
        return None
    alphas = np.geomspace(ALPHA_MIN, ALPHA_MAX, 64)
    for _ in range(3):
        a, c, sse = (v[0] for v in _grid_fit(n, y[None, :], alphas, bounds))
        i = int(np.argmin(sse))
        best = (float(alphas[i]), float(a[i]), float(c[i]), float(sse[i]))
        alphas = np.geomspace(alphas[max(i - 1, 0)], alphas[min(i + 1, alphas.size - 1)], 24)
    alpha, av, cv, sv = best
    syy = float(((y - y.mean()) ** 2).sum())
    return PowerLaw(c=cv, a=av, alpha=alpha, r2=1.0 - sv / syy if syy > 0 else 0.0, points=int(n.size))


def regime_start(ys: np.ndarray, mode: str) -> int:
    """Index from which the curve is past its steepest improvement (moving average of ``max(3, n/10)``)."""
    n = ys.size
    k = max(3, n // 10)
    if n < k + 2:
        return 0
    smooth = np.convolve(ys, np.ones(k) / k, mode="valid")
    gain = np.diff(smooth) * (1.0 if mode == "max" else -1.0)
    return int(np.argmax(gain)) + k // 2
