"""Progress and remaining-effort estimates (T5), with their uncertainty: when will the target be met?

A performance target fires when the monitored metric passes its threshold for ``patience`` consecutive
evaluations. Federated curves are noisy and not monotone, so the question is when a noisy curve first
passes, not when a smooth one crosses. :class:`Estimator` answers it by simulating futures:

1. the curve since its steepest improvement (:func:`sluice.control.curves.regime_start`) is fitted with a
   power law ``y(n) = c + a·n^(−α)`` (:mod:`sluice.control.curves`); the latest ``noise_window`` of its
   residuals give the noise level ``σ`` (curves calm down as they converge) and all of them their lag-one
   autocorrelation ``ρ``;
2. ``samples`` curves are refitted on the fit plus residuals resampled in blocks of about
   ``(1 + ρ)/(1 − ρ)`` evaluations (a moving-block bootstrap keeps the residuals' correlation): the spread of
   the fitted curves is the uncertainty of the trend;
3. each refitted curve is continued up to the horizon (``max(min_horizon, horizon_factor·n)`` iterations)
   with AR(1) noise of standard deviation ``noise_scale·σ`` that starts from the last residual, and the
   first evaluation where the threshold has held ``patience`` times is that future's remaining iterations.

The futures are the raw material of a calibrated answer (:mod:`sluice.control.eta_calibration`): their
median, the share of them that pass within the horizon and how far the curve has come towards the target
(with past runs of the same job shape, :meth:`Estimator.set_past`, what those needed) go into a regression
whose errors on past runs give the 80 % interval and the probability of meeting the target within the
horizon (:func:`answer`). There is always an interval once a target is known; its high end is None (open:
"more than ``low``") beyond the horizon, and there is no point estimate when the probability of meeting the
target within the horizon is below one half or while the curve has fewer than ``min_points`` values. The
simulation settings (:class:`EtaSettings`) and the calibration are those of ``bench/eta.py``. The futures
are drawn from a generator seeded with the number of values, so one history gives one estimate. A
simulation is redone once the curve has grown by a ``refresh``-th of its values; in between, the futures
drawn last are aged by the iterations done since.

Progress is the share of the way to the first criterion expected to fire: ``n / (n + r)`` with ``r`` the
target's estimate, or the budgets' share when they end training first (100 % once a budget stopped it);
the remaining iterations and seconds stay the target's, so that a report of a budget stop says how much
more the target would need. Time per iteration is an exponential moving average of measured
iteration times (β = ``smoothing``); the remaining seconds and their interval are the iterations' times it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from sluice.control.curves import PowerLaw, fit_batch, fit_power_law, regime_start
from sluice.control.eta_calibration import (
    CLEAN_POINTS,
    CLEAN_R2,
    CURVE_CLIP,
    MIN_PROBABILITY,
    SHARP,
    Calibration,
    Signals,
    past_signal,
)
from sluice.control.eta_calibration_data import DEFAULT

INTERVAL = (0.1, 0.9)
"""The quantiles of the 80 % interval."""
FIT_POINTS = 64
"""The bootstrap refits use at most this many values of the curve (evenly thinned)."""


@dataclass(frozen=True)
class EtaSettings:
    """How the futures are drawn (see the module docstring)."""

    samples: int = 32
    refresh: int = 2
    noise_window: float = 0.33
    noise_scale: float = 1.3
    horizon_factor: float = 8.0
    min_horizon: int = 100
    smoothing: float = 0.3
    min_points: int = 4
    calibration: Calibration = field(default_factory=lambda: DEFAULT)


@dataclass(frozen=True)
class Estimate:
    """Progress (% of the way to the first criterion expected to fire), and the iterations and seconds the
    target still needs (without a target: what the budgets leave), with the 80 % interval of the iterations
    and the probability of meeting the target within the horizon; each None with ``note`` saying why when
    it cannot be estimated."""

    progress_percent: float | None
    remaining_iterations: int | None
    remaining_s: float | None
    note: str
    seconds_per_iteration: float | None
    fit: PowerLaw | None = None
    remaining_low: int | None = None
    remaining_high: int | None = None
    reach_probability: float | None = None
    remaining_s_low: float | None = None
    remaining_s_high: float | None = None


def _blocks(rng: np.random.Generator, count: int, length: int, block: int) -> np.ndarray:
    """``count`` rows of ``length`` indices into ``[0, length)`` made of random blocks of ``block``."""
    starts = rng.integers(0, length - block + 1, size=(count, -(-length // block)))
    return (starts[:, :, None] + np.arange(block)).reshape(count, -1)[:, :length]


def _first_passes(ysim: np.ndarray, passed: np.ndarray, target: float, mode: str, patience: int) -> np.ndarray:
    """Index of the first future evaluation where the threshold has held ``patience`` times, counting the
    last ``patience − 1`` observed ones (``passed``); −1 where none does."""
    ok = ysim >= target if mode == "max" else ysim <= target
    lead = np.broadcast_to(passed[-(patience - 1):] if patience > 1 else passed[:0], (ok.shape[0], patience - 1))
    both = np.concatenate([lead, ok], axis=1).astype(np.int32)
    cs = np.concatenate([np.zeros((both.shape[0], 1), np.int32), np.cumsum(both, axis=1)], axis=1)
    fired = (cs[:, patience:] - cs[:, :-patience]) == patience  # window ending at each future evaluation
    return np.where(fired.any(axis=1), fired.argmax(axis=1), -1)


def simulate(ns: np.ndarray, ys: np.ndarray, *, now: int, target: float, mode: str, patience: int,
             horizon: int, bounds: tuple[float | None, float | None], settings: EtaSettings
             ) -> tuple[np.ndarray, PowerLaw] | None:
    """Remaining iterations until the target fires in each simulated future (inf beyond ``horizon``), sorted,
    and the central fit; None when the curve cannot be fitted (constant, too few values)."""
    fit = fit_power_law(ns, ys, bounds)
    if fit is None:
        return None
    resid = ys - fit(ns)
    m = resid.size
    late = resid[-max(4, math.ceil(settings.noise_window * m)):]  # the noise now: curves calm down
    sigma = float(np.sqrt(np.mean(late * late))) * settings.noise_scale
    rho = float(np.clip(np.corrcoef(resid[:-1], resid[1:])[0, 1], 0.0, 0.95)) if m > 3 and resid.std() > 0 else 0.0
    rng = np.random.default_rng(m)
    thin = -(-m // FIT_POINTS)  # the refits see at most FIT_POINTS values: every thin-th
    tn, tr = ns[::thin], resid[::thin]
    block = int(np.clip(round((1 + rho) / (1 - rho) / thin), 1, max(1, tr.size // 2)))
    c, a, alpha = fit_batch(tn, fit(tn)[None, :] + tr[_blocks(rng, settings.samples, tr.size, block)], bounds)
    step = max(1.0, float(np.median(np.diff(ns[-8:])))) if m > 1 else 1.0  # iterations per evaluation
    future = ns[-1] + step * np.arange(1, max(2, math.ceil((now + horizon - ns[-1]) / step)) + 1)
    mean = c[:, None] + a[:, None] * np.exp(-alpha[:, None] * np.log(future)[None, :])
    z = rng.standard_normal(mean.shape) * sigma * math.sqrt(1 - rho * rho)
    from scipy.signal import lfilter  # here, not at the top: every process reading a job imports this module

    noise = lfilter([1.0], [1.0, -rho], z, axis=1, zi=np.full((mean.shape[0], 1), rho * resid[-1]))[0]
    passed = ys >= target if mode == "max" else ys <= target
    first = _first_passes(mean + noise, passed, target, mode, patience)
    remaining = np.where(first >= 0, future[np.maximum(first, 0)] - now, np.inf)
    return np.sort(np.where(remaining <= horizon, np.maximum(remaining, 1.0), np.inf)), fit


@dataclass(frozen=True)
class Answer:
    """The calibrated answer: the median remaining iterations (None: beyond the horizon), the 80 % interval
    (``high`` None: open above, beyond the horizon) and the probability of meeting the target within it."""

    mid: int | None
    low: int
    high: int | None
    probability: float


def answer(cal: Calibration, sig: Signals, n: int, horizon: int) -> Answer:
    """The estimate from ``sig`` after ``n`` iterations with ``horizon`` (module docstring)."""
    if sig.clean and sig.past is None and sig.reach <= INTERVAL[0]:  # a clean curve that levels off short of it
        return Answer(None, horizon, None, max(sig.reach, MIN_PROBABILITY))
    if sig.clean and sig.past is None and sig.reach >= INTERVAL[1] and sig.spread <= SHARP:
        lo, hi = (n * math.exp(sig.curve + d) for d in (-sig.spread / 2, sig.spread / 2))
        mid, p = n * math.exp(sig.curve), sig.reach
    else:
        lo, mid, hi = cal.predict(sig, n, (INTERVAL[0], 0.5, INTERVAL[1]))
        p = cal.probability_within(sig, n, horizon)
    low = int(math.floor(min(lo, horizon)))
    point = int(round(mid)) if mid <= horizon and p >= 0.5 and sig.fitted else None
    high = int(math.ceil(hi)) if hi <= horizon else None
    return Answer(point, max(1, low), high, p)


def curve_text(metric: str | None, fit: PowerLaw) -> str:
    """``metric ≈ c − |a|·n^-α`` (the sign of ``a`` written once)."""
    sign = "−" if fit.a < 0 else "+"
    return f"{metric} ≈ {fit.c:.4g} {sign} {abs(fit.a):.4g}·n^-{fit.alpha:.3g}"


class Estimator:
    """Keeps the history of one metric and iteration times; answers :meth:`estimate` on demand.

    ``target`` (with ``mode`` ``"max"``/``"min"``) is the result being trained for; it counts as reached
    once the metric has passed it for ``patience`` consecutive evaluations. The budgets
    (``iteration_budget``, ``time_budget_s``) end training too.
    """

    def __init__(
        self,
        metric: str | None = None,
        target: float | None = None,
        mode: str = "max",
        patience: int = 1,
        iteration_budget: int | None = None,
        time_budget_s: float | None = None,
        bounds: tuple[float | None, float | None] = (None, None),
        settings: EtaSettings | None = None,
        past: Sequence[float] = (),
    ) -> None:
        self.metric, self.target, self.mode, self.patience = metric, target, mode, max(1, patience)
        self.iteration_budget, self.time_budget_s = iteration_budget, time_budget_s
        self.bounds = bounds
        self.settings = settings or EtaSettings()
        self.smoothing, self.min_points = self.settings.smoothing, self.settings.min_points
        self.calibration = self.settings.calibration
        self.past = tuple(float(v) for v in past)
        self.ns: list[float] = []
        self.ys: list[float] = []
        self.spi: float | None = None
        self._memo: tuple[int, int, tuple[np.ndarray, PowerLaw, int] | str] | None = None
        self._last: tuple[tuple, Estimate] | None = None

    def set_past(self, past: Sequence[float]) -> None:
        """The stopping iterations of past runs of the same job shape (the history the estimate learns from)."""
        self.past = tuple(float(v) for v in past)
        self._last = None

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

    def _seconds(self, iterations: int | None) -> float | None:
        return None if iterations is None or self.spi is None else iterations * self.spi

    def estimate(self, n: int, elapsed_s: float, reached: bool = False) -> Estimate:
        """Estimate after ``n`` iterations and ``elapsed_s`` seconds; ``reached`` = the result is obtained.
        Asked again with nothing new, it answers the same estimate without computing it again."""
        key = (len(self.ns), n, elapsed_s, reached, self.spi)
        if self._last is None or self._last[0] != key:
            self._last = key, self._estimate(n, elapsed_s, reached)
        return self._last[1]

    def _estimate(self, n: int, elapsed_s: float, reached: bool) -> Estimate:
        if reached:
            return Estimate(100.0, 0, 0.0, "result obtained", self.spi, None, 0, 0, 1.0, 0.0, 0.0)
        b_prog, b_rem, b_s = self._budget(n, elapsed_s)
        if self.target is None:
            if b_prog is None:
                return Estimate(None, None, None, "no target and no budget to measure progress against",
                                self.spi, None)
            note = "from the iteration/time budget (no performance target)"
            if b_s is None:
                note += "; no iteration time measured yet"
            return Estimate(b_prog, b_rem, b_s, note, self.spi, None, b_rem, b_rem, None, b_s, b_s)
        sig, fit, horizon = self.signals(n)
        ans = answer(self.calibration, sig, n, horizon)
        shape = "" if fit is None else f"; {curve_text(self.metric, fit)}"
        src = f"; from {len(self.past)} past runs of this job" if sig.past is not None else ""
        lo, hi = ans.low, ans.high
        if ans.mid is None:
            note = (f"target {self.target:g} is not expected within {horizon} more iterations: more than {lo} "
                    f"(probability {ans.probability:.0%} within the horizon{src}{shape})")
            prog = b_prog
            return Estimate(prog, None, None, note + self._budget_note(b_rem, None), self.spi, fit, lo, None,
                            ans.probability, self._seconds(lo), None)
        rem = ans.mid
        note = (f"target {self.target:g} expected in {rem} iterations (80 % interval {lo}–"
                + (f"{hi}" if hi is not None else f"over {horizon}") + f"{src}{shape})")
        prog = 100.0 * n / (n + rem)
        if b_rem is not None and b_rem < rem:
            prog = max(b_prog or 0.0, 100.0 * n / (n + b_rem) if n + b_rem else 100.0)
        return Estimate(prog, rem, self._seconds(rem), note + self._budget_note(b_rem, rem), self.spi, fit, lo, hi,
                        ans.probability, self._seconds(lo), self._seconds(hi))

    @staticmethod
    def _budget_note(b_rem: int | None, rem: int | None) -> str:
        if b_rem is None or (rem is not None and b_rem >= rem):
            return ""
        return f"; the budget leaves {b_rem} iterations" if rem is None else (
            f"; the budget ends training {rem - b_rem} iterations earlier")

    def signals(self, n: int) -> tuple[Signals, PowerLaw | None, int]:
        """What the estimate after ``n`` iterations is made from (:class:`Signals`), the central power-law
        fit (None without one) and the horizon."""
        horizon = max(self.settings.min_horizon, math.ceil(self.settings.horizon_factor * n))
        fut = self._futures(n)
        nn = max(n, 1)
        spread = math.inf
        if isinstance(fut, str):
            curve, reach, fit = 0.0, 0.5, None
        else:
            samples, fit, _ = fut
            reach = float(np.isfinite(samples).mean())
            lo, mid, hi = (float(samples[min(samples.size - 1, int(q * samples.size))]) for q in (*INTERVAL[:1], 0.5,
                                                                                                   INTERVAL[1]))
            curve = math.log((mid if math.isfinite(mid) else 2.0 * horizon) / nn)
            if math.isfinite(hi):
                spread = math.log(hi / lo)
        curve = min(max(curve, CURVE_CLIP[0]), CURVE_CLIP[1])
        clean = fit is not None and fit.r2 >= CLEAN_R2 and fit.points >= CLEAN_POINTS
        return Signals(curve, reach, self._gap(), past_signal(self.past, n), spread, clean,
                       self._trend(fit, nn), len(self.ys) >= self.min_points), fit, horizon

    def _trend(self, fit: PowerLaw | None, n: int) -> float:
        """``log(1 + |fit(2n) − fit(n)| / σ)`` (at most 5), σ the RMS of the last third of the residuals."""
        if fit is None or len(self.ys) < 3:
            return 0.0
        k = max(3, len(self.ys) // 3)
        resid = np.asarray(self.ys[-k:]) - fit(np.asarray(self.ns[-k:]))
        sigma = float(np.sqrt(np.mean(resid * resid)))
        step = abs(float(fit(2.0 * n) - fit(float(n))))
        return float(min(5.0, math.log1p(step / sigma))) if sigma > 0 else 5.0

    def _gap(self) -> float:
        """How much of the way from the first values to the target the recent values have come."""
        if not self.ys:
            return 0.0
        sgn = 1.0 if self.mode == "max" else -1.0
        z = sgn * np.asarray(self.ys)
        first = float(z[: min(3, z.size)].mean())
        level = float(z[-max(3, z.size // 10):].mean())
        span = sgn * float(self.target) - first
        return 1.0 if span <= 0 else min(max((level - first) / span, -0.5), 1.5)

    def probability_within(self, n: int, h: float) -> float:
        """Probability that the target fires within ``h`` more iterations, after ``n``."""
        return self.calibration.probability_within(self.signals(n)[0], n, h)

    def _futures(self, n: int) -> tuple[np.ndarray, PowerLaw, int] | str:
        """:meth:`_target`, simulated again once the curve has ``1/refresh`` more values than at the last
        simulation (or has a first one); in between, the last futures less the iterations done since, without
        those in which the target would already have fired."""
        m = len(self.ns)
        if self._memo is not None:
            m0, n0, out = self._memo
            if m - m0 < max(1, m0 // self.settings.refresh) and not isinstance(out, str):
                left = out[0] - (n - n0)
                alive = left[left >= 1]
                if alive.size * 2 >= left.size:
                    return alive, out[1], out[2] - (n - n0)
        self._memo = m, n, self._target(n)
        return self._memo[2]

    def _target(self, n: int) -> tuple[np.ndarray, PowerLaw, int] | str:
        """The simulated remaining iterations, the fit and the horizon; or why there are none."""
        if len(self.ns) < self.min_points:
            return (f"{len(self.ns)} values of {self.metric} so far; the learning curve needs "
                    f"{self.min_points}")
        ns, ys = np.asarray(self.ns), np.asarray(self.ys)
        s = self.settings
        start = regime_start(ys, self.mode)
        if len(ys) - start < self.min_points or np.ptp(ys[start:]) == 0:
            start = 0
        horizon = max(s.min_horizon, math.ceil(s.horizon_factor * n))
        out = simulate(ns[start:], ys[start:], now=n, target=float(self.target), mode=self.mode,
                       patience=self.patience, horizon=horizon, bounds=self.bounds, settings=s)
        if out is None:
            return f"{self.metric} has not changed; no learning curve to fit"
        return out[0], out[1], horizon
