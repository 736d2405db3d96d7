"""Progress and remaining-effort estimates (T5): learning-curve extrapolation plus smoothed iteration time.

The monitored metric is modelled as a power law in the iteration count ``n``::

    y(n) = c + a · n^(−α),   α > 0

(``c`` is the asymptote; ``a > 0`` for a decreasing loss, ``a < 0`` for an increasing accuracy). For a
fixed ``α`` the least-squares ``(c, a)`` has a closed form (simple linear regression of ``y`` on
``x = n^(−α)``: ``a = Sxy/Sxx``, ``c = ȳ − a·x̄``); when the metric has a range (accuracy in [0, 1], a
loss ≥ 0) and ``c`` falls outside it, ``c`` is clamped to the bound and ``a = Σx(y − c)/Σx²``. ``α`` is
found by a vectorised grid search over log-spaced values, refined twice around the best.

A power law describes the regime after the initial transient (many curves first stay flat, then rise
steeply): the fit uses the iterations from the steepest improvement of the moving average (window
``max(3, n/10)``) on, when at least ``min_points`` remain. The iteration where the curve reaches a
target ``T`` solves ``T = c + a·n^(−α)``::

    n* = ((T − c) / a)^(−1/α)        defined only when (T − c)/a > 0

otherwise the target lies beyond the fitted asymptote and no estimate is given; nor is one given when
the fit is degenerate (``α`` at the lower end of its search range) or explains less than half of the
variance (``R² < 0.5``). Time per iteration is an exponential moving average ``s ← β·x + (1 − β)·s``
of measured iteration times (β = ``smoothing``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_MAX_ITERATIONS = 1e9
_ALPHA_MIN, _ALPHA_MAX = 0.02, 4.0
_MIN_R2 = 0.5


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

    def iterations_to(self, target: float) -> tuple[float | None, str]:
        """Iteration count ``n*`` at which the curve reaches ``target``, or None with the reason."""
        if self.a == 0:
            return None, "the fitted curve is flat"
        ratio = (target - self.c) / self.a
        if ratio <= 0:
            side = "above" if self.a < 0 else "below"
            return None, (
                f"target {target:.6g} is {side} the fitted asymptote {self.c:.6g}; "
                "the metric is not expected to reach it"
            )
        n = ratio ** (-1.0 / self.alpha)
        if not math.isfinite(n) or n > _MAX_ITERATIONS:
            return None, f"target {target:.6g} would need more than {_MAX_ITERATIONS:.0e} iterations"
        return n, ""


def _grid_fit(
    n: np.ndarray, y: np.ndarray, alphas: np.ndarray, bounds: tuple[float | None, float | None]
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    x = np.power(n[None, :], -alphas[:, None])  # (A, N)
    xm = x.mean(axis=1, keepdims=True)
    ym = y.mean()
    dx = x - xm
    sxx = (dx * dx).sum(axis=1)
    sxy = (dx * (y - ym)[None, :]).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(sxx > 0, sxy / sxx, 0.0)
    c = ym - a * xm[:, 0]
    xx = (x * x).sum(axis=1)
    for bound, outside in ((bounds[0], lambda v, b: v < b), (bounds[1], lambda v, b: v > b)):
        if bound is None:
            continue
        mask = outside(c, bound)
        if mask.any():
            a = np.where(mask, (x * (y - bound)[None, :]).sum(axis=1) / xx, a)
            c = np.where(mask, bound, c)
    sse = ((y[None, :] - c[:, None] - a[:, None] * x) ** 2).sum(axis=1)
    return int(np.argmin(sse)), a, c, sse


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
    alphas = np.geomspace(_ALPHA_MIN, _ALPHA_MAX, 64)
    for _ in range(3):
        i, a, c, sse = _grid_fit(n, y, alphas, bounds)
        lo = alphas[max(i - 1, 0)]
        hi = alphas[min(i + 1, alphas.size - 1)]
        best = (float(alphas[i]), float(a[i]), float(c[i]), float(sse[i]))
        alphas = np.geomspace(lo, hi, 24)
    alpha, av, cv, sv = best
    syy = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - sv / syy if syy > 0 else 0.0
    return PowerLaw(c=cv, a=av, alpha=alpha, r2=r2, points=int(n.size))


def regime_start(ys: np.ndarray, mode: str) -> int:
    """Index from which the curve is past its steepest improvement (moving average of ``max(3, n/10)``)."""
    n = ys.size
    k = max(3, n // 10)
    if n < k + 2:
        return 0
    smooth = np.convolve(ys, np.ones(k) / k, mode="valid")
    gain = np.diff(smooth) * (1.0 if mode == "max" else -1.0)
    return int(np.argmax(gain)) + k // 2


@dataclass(frozen=True)
class Estimate:
    """Progress (% of the way to a result) and the remaining iterations and seconds, each None with
    ``note`` saying why when it cannot be estimated."""

    progress_percent: float | None
    remaining_iterations: int | None
    remaining_s: float | None
    note: str
    seconds_per_iteration: float | None
    fit: PowerLaw | None = None


class Estimator:
    """Keeps the history of one metric and iteration times; answers :meth:`estimate` on demand.

    ``target`` (with ``mode`` ``"max"``/``"min"``) is the result being trained for; it counts as reached
    once the curve has passed it for ``patience`` iterations (``n* + patience − 1``). Without a target,
    the budgets (``iteration_budget``, ``time_budget_s``) define the end of training.
    """

    def __init__(
        self,
        metric: str | None = None,
        target: float | None = None,
        mode: str = "max",
        patience: int = 1,
        iteration_budget: int | None = None,
        time_budget_s: float | None = None,
        smoothing: float = 0.3,
        min_points: int = 4,
        bounds: tuple[float | None, float | None] = (None, None),
    ) -> None:
        self.metric, self.target, self.mode, self.patience = metric, target, mode, max(1, patience)
        self.iteration_budget, self.time_budget_s = iteration_budget, time_budget_s
        self.smoothing, self.min_points, self.bounds = smoothing, min_points, bounds
        self.ns: list[float] = []
        self.ys: list[float] = []
        self.spi: float | None = None

    def add(self, n: int, metrics: dict[str, float], seconds: float) -> None:
        """Record iteration ``n`` (1-based count) with its metrics and duration."""
        if self.metric is not None:
            v = metrics.get(self.metric)
            if v is not None and math.isfinite(v):
                self.ns.append(float(n))
                self.ys.append(float(v))
        if seconds > 0:
            b = self.smoothing
            self.spi = seconds if self.spi is None else b * seconds + (1 - b) * self.spi

    def _budget(self, n: int, elapsed_s: float) -> tuple[float | None, int | None, float | None]:
        fracs, rem_i, rem_s = [], None, None
        if self.iteration_budget:
            fracs.append(n / self.iteration_budget)
            rem_i = max(self.iteration_budget - n, 0)
        if self.time_budget_s:
            fracs.append(elapsed_s / self.time_budget_s)
            rem_s = max(self.time_budget_s - elapsed_s, 0.0)
        if rem_s is not None and self.spi:
            by_time = math.ceil(rem_s / self.spi)
            rem_i = by_time if rem_i is None else min(rem_i, by_time)
        if rem_i is not None and self.spi is not None:
            t = rem_i * self.spi
            rem_s = t if rem_s is None else min(rem_s, t)
        prog = min(100.0, 100.0 * max(fracs)) if fracs else None
        return prog, rem_i, rem_s

    def estimate(self, n: int, elapsed_s: float, reached: bool = False) -> Estimate:
        """Estimate after ``n`` iterations and ``elapsed_s`` seconds; ``reached`` = the result is obtained."""
        if reached:
            return Estimate(100.0, 0, 0.0, "result obtained", self.spi, None)
        if self.target is None:
            prog, rem_i, rem_s = self._budget(n, elapsed_s)
            if prog is None:
                return Estimate(None, None, None, "no target and no budget to measure progress against",
                                self.spi, None)
            note = "from the iteration/time budget (no performance target)"
            if rem_s is None:
                note += "; no iteration time measured yet"
            return Estimate(prog, rem_i, rem_s, note, self.spi, None)
        if len(self.ns) < self.min_points:
            return Estimate(None, None, None, f"{len(self.ns)} values of {self.metric} so far; "
                            f"the learning curve needs {self.min_points}", self.spi, None)
        ys = np.asarray(self.ys)
        start = regime_start(ys, self.mode)
        if len(ys) - start < self.min_points:
            start = 0
        fit = fit_power_law(self.ns[start:], ys[start:], self.bounds)
        if fit is None:
            return Estimate(None, None, None, f"{self.metric} has not changed; no learning curve to fit",
                            self.spi, None)
        if (fit.a < 0) != (self.mode == "max"):
            return Estimate(None, None, None, f"{self.metric} is not improving (fitted trend goes the "
                            "wrong way)", self.spi, fit)
        if fit.alpha <= _ALPHA_MIN * 1.01 or fit.r2 < _MIN_R2:
            why = (f"fitted exponent at the search bound {_ALPHA_MIN}" if fit.r2 >= _MIN_R2
                   else f"the fit explains {fit.r2:.0%} of its variance, under {_MIN_R2:.0%}")
            return Estimate(None, None, None, f"{self.metric} does not follow a power law yet ({why})",
                            self.spi, fit)
        n_star, why = fit.iterations_to(self.target)
        if n_star is None:
            return Estimate(None, None, None, why, self.spi, fit)
        rem_i = max(math.ceil(n_star) - n, 1) + self.patience - 1
        rem_s = rem_i * self.spi if self.spi is not None else None
        note = (f"{self.metric} ≈ {fit.c:.4g} + {fit.a:.4g}·n^-{fit.alpha:.3g} (R²={fit.r2:.3f}); "
                f"target {self.target:g} expected at iteration {math.ceil(n_star)}")
        _, b_rem, _ = self._budget(n, elapsed_s)
        if b_rem is not None and b_rem < rem_i:
            note += f"; the budget ends {rem_i - b_rem} iterations earlier"
        return Estimate(100.0 * n / (n + rem_i), rem_i, rem_s, note, self.spi, fit)
