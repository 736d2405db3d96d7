"""Calibrated remaining-iteration estimates: a small regression on what a curve says, with split-conformal
intervals learnt from past runs.

The raw signals of one estimate after ``n`` iterations (:class:`Signals`) are

* ``curve``: the log of the simulated futures' median remaining iterations over ``n``
  (:func:`sluice.control.eta.simulate`; beyond the horizon it counts as the horizon, ``CURVE_CLIP`` bounds it),
  and ``reach``, the share of those futures that pass within the horizon;
* ``gap``: how much of the way from the curve's first values (the mean of up to 3) to the target the
  recent values (their mean over the last tenth, at least 3) have come (0 at the start, 1 at the target,
  between −0.5 and 1.5; it stands in for how far along the run is);
* ``trend``: how far the fitted power law moves from ``n`` to ``2n`` against the noise about it,
  ``log(1 + |fit(2n) − fit(n)| / σ)`` (at most 5): a curve still climbing is where its futures know most;
* ``spread``: the log of the ratio of the futures' 90th to 10th percentile (infinite when either lies
  beyond the horizon);
* ``past``: with runs of the same job shape that met the target (history), the log of the median of their
  stopping iterations still ahead, ``median(N_j > n) − n``, over ``n``.

A clean curve (``clean``: the power law explains :data:`CLEAN_R2` of the variance of at least
:data:`CLEAN_POINTS` values), with no history, is
its own best predictor: when its futures agree to within :data:`SHARP` (``spread``) the estimate is their
median and the interval as wide as their 10th to 90th percentiles, about it; when at most a tenth of them
pass within the horizon, it is "more than the horizon" with their share as the probability (at least
:data:`MIN_PROBABILITY`). Real federated curves are noisy and rarely clean. Otherwise the estimate of
``log(r / n)``, with ``r`` the remaining iterations, is a least-squares combination of these
(``1, curve, reach, gap, gap², trend, curve·trend, gap·trend`` without history; ``1, past`` with at
least :data:`MIN_PAST` runs); its
error distribution is the empirical distribution of the residuals ``log(r/n) − estimate`` on calibration
runs (split conformal), kept per band of ``gap`` (Mondrian: the error shrinks as a run nears its target).
Runs that ended without meeting the target count as right-censored (their residual is at least that of
when they ended; Kaplan–Meier), so the residual distribution can leave mass beyond every run seen: there
the interval is open above and the probability stays below one.
The 80 % interval is the estimate plus the residuals' 10th and 90th percentiles, and the probability of
meeting the target within ``h`` more iterations is the share of residuals below ``log(h/n) − estimate``,
never below ``1/(k+1)`` nor above ``k/(k+1)`` for ``k`` residuals (a finite sample never makes it sure),
nor closer than :data:`MIN_PROBABILITY` to 0 or 1.

Invariants: :func:`fit` depends only on the points it is given (``bench/eta.py`` calibrates on the other
families' runs and scores the family held out); :data:`DEFAULT` is :func:`fit` on every benchmark run
(``bench/eta.py --ship`` writes :mod:`sluice.control.eta_calibration_data`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

CURVE_CLIP = (-4.0, 4.0)
"""Bounds of the ``curve`` signal (log of remaining over done)."""
GAP_BANDS = (0.3, 0.6, 0.8, 0.9, 0.95)
"""Upper edges of the ``gap`` bands whose residuals calibrate the intervals separately (the last is open)."""
MIN_PAST = 3
"""Runs of the same job shape from which the history enters the estimate."""
QUANTILES = np.linspace(0.0, 1.0, 41)
"""The residual quantiles a calibration keeps per band."""
RIDGE = 1e-3
BEYOND = 50.0
"""A residual quantile beyond every run seen (:func:`fit`, right-censored runs): the estimate is open there."""
SHARP = 0.1
"""Largest ``spread`` at which the futures of a clean curve are taken as they are (module docstring)."""
CLEAN_R2 = 0.999
CLEAN_POINTS = 8
"""The share of the variance a power-law fit must explain for the curve to count as clean (noise-free)."""
MIN_PROBABILITY = 0.01
"""The least probability of meeting the target that is reported (and the least distance from 1)."""


@dataclass(frozen=True)
class Signals:
    """What one estimate is made from (module docstring); ``past`` is None without history."""

    curve: float
    reach: float
    gap: float
    past: float | None = None
    spread: float = math.inf
    clean: bool = False
    trend: float = 0.0
    fitted: bool = True
    """Whether the curve has enough values for a fit (without, the answer is an interval only)."""


def _curve_terms(s: Signals) -> list[float]:
    return [1.0, s.curve, s.reach, s.gap, s.gap * s.gap, s.trend, s.curve * s.trend, s.gap * s.trend]


def _past_terms(s: Signals) -> list[float]:
    return [1.0, s.past if s.past is not None else 0.0]


def _band(gap: float) -> int:
    return bisect.bisect_left(GAP_BANDS, gap)


@dataclass(frozen=True)
class Calibration:
    """Coefficients of both regressions and the residual quantiles (:data:`QUANTILES`) per ``gap`` band,
    without history (``curve_residuals``) and with (``past_residuals``); ``counts`` are the residuals
    behind each band (the probability bounds use them)."""

    curve_coef: tuple[float, ...]
    past_coef: tuple[float, ...]
    curve_residuals: tuple[tuple[float, ...], ...]
    past_residuals: tuple[tuple[float, ...], ...]
    curve_counts: tuple[int, ...]
    past_counts: tuple[int, ...]

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (np.asarray(self.curve_coef), np.asarray(self.past_coef), np.asarray(self.curve_residuals),
                np.asarray(self.past_residuals))

    def _pick(self, s: Signals) -> tuple[float, np.ndarray, int]:
        band = _band(s.gap)
        coef, pcoef, res, pres = self._arrays
        if s.past is not None and self.past_counts[band]:
            return float(pcoef @ _past_terms(s)), pres[band], self.past_counts[band]
        return float(coef @ _curve_terms(s)), res[band], self.curve_counts[band]

    def predict(self, s: Signals, n: int, levels: Sequence[float]) -> list[float]:
        """Remaining iterations at the quantile ``levels`` of the predictive distribution (each ≥ 1)."""
        mid, res, _ = self._pick(s)
        q = np.interp(levels, QUANTILES, res)
        return [max(1.0, n * math.exp(min(mid + float(v), 30.0))) for v in q]

    def probability_within(self, s: Signals, n: int, h: float) -> float:
        """Probability that the target fires within ``h`` more iterations (module docstring)."""
        if h <= 0:
            return 0.0
        mid, res, k = self._pick(s)
        p = float(np.interp(math.log(h / max(n, 1)) - mid, res, QUANTILES, left=0.0, right=1.0))
        low = max(1.0 / (k + 1), MIN_PROBABILITY)
        return min(max(p, low), 1.0 - low)


def _lstsq(rows: np.ndarray, y: np.ndarray) -> np.ndarray:
    a = rows.T @ rows + RIDGE * np.eye(rows.shape[1])
    return np.linalg.solve(a, rows.T @ y)


def _quantiles(res: np.ndarray, later: np.ndarray) -> tuple[float, ...]:
    """The residual quantiles at :data:`QUANTILES`, from residuals ``res`` and lower bounds ``later`` (runs
    that had not met the target when they ended): the Kaplan–Meier estimate; a quantile beyond its last
    step (the share of runs later than any seen) is :data:`BEYOND`."""
    if not later.size:
        return tuple(round(float(v), 4) for v in np.quantile(res, QUANTILES))
    from scipy.stats import CensoredData, ecdf

    cdf = ecdf(CensoredData(uncensored=res, right=later)).cdf
    times = np.unique(res)
    probs = cdf.evaluate(times)
    out = np.where(QUANTILES <= probs[-1], np.interp(QUANTILES, probs, times), BEYOND)
    return tuple(round(float(v), 4) for v in out)


def _residual_table(gaps: np.ndarray, res: np.ndarray, later_gaps: np.ndarray, later: np.ndarray
                    ) -> tuple[tuple[tuple[float, ...], ...], tuple[int, ...]]:
    """Per band, the residual quantiles (a band with fewer than 8 residuals borrows all of them)."""
    bands, later_bands = np.searchsorted(GAP_BANDS, gaps), np.searchsorted(GAP_BANDS, later_gaps)
    table, counts = [], []
    for b in range(len(GAP_BANDS) + 1):
        r, c = res[bands == b], later[later_bands == b]
        if r.size < 8:
            r, c = res, later
        table.append(_quantiles(r, c) if r.size else (0.0,) * QUANTILES.size)
        counts.append(int(r.size + c.size))
    return tuple(table), tuple(counts)


Point = tuple[Signals, float, int]


def fit(points: Sequence[Point], later: Sequence[Point] = ()) -> Calibration:
    """Calibrate on ``(signals, true remaining iterations, iterations done)`` of past runs that met their
    target: both regressions by (slightly ridged) least squares on ``log(r/n)``, then their residuals, with
    ``later``: ``(signals, remaining iterations when the run ended without meeting it, iterations done)``
    (right-censored)."""
    sig = [p[0] for p in points]
    y = np.array([math.log(max(p[1], 1) / max(p[2], 1)) for p in points])
    ly = np.array([math.log(max(p[1], 1) / max(p[2], 1)) for p in later])
    gaps, lgaps = np.array([s.gap for s in sig]), np.array([p[0].gap for p in later])
    rows = np.array([_curve_terms(s) for s in sig])
    lrows = np.array([_curve_terms(p[0]) for p in later]).reshape(len(later), rows.shape[1])
    coef = _lstsq(rows, y)
    curve_res, curve_counts = _residual_table(gaps, y - rows @ coef, lgaps, ly - lrows @ coef)
    has = np.array([s.past is not None for s in sig])
    lhas = np.array([p[0].past is not None for p in later], dtype=bool)
    if has.sum() >= 2 * len(_past_terms(sig[0])):
        prow = np.array([_past_terms(s) for s, h in zip(sig, has, strict=True) if h])
        lprow = np.array([_past_terms(p[0]) for p, h in zip(later, lhas, strict=True) if h]).reshape(-1, prow.shape[1])
        pcoef = _lstsq(prow, y[has])
        past_res, past_counts = _residual_table(gaps[has], y[has] - prow @ pcoef, lgaps[lhas], ly[lhas] - lprow @ pcoef)
    else:
        pcoef = np.zeros(len(_past_terms(sig[0])))
        past_res, past_counts = curve_res, (0,) * len(curve_counts)
    return Calibration(tuple(round(float(c), 5) for c in coef), tuple(round(float(c), 5) for c in pcoef),
                       curve_res, past_res, curve_counts, past_counts)


def past_signal(past: Sequence[float], n: int) -> float | None:
    """The ``past`` signal of ``past`` stopping iterations after ``n`` iterations (module docstring); None
    with fewer than :data:`MIN_PAST` runs. When every past run had stopped by ``n``, what is ahead is taken
    as one iteration."""
    if len(past) < MIN_PAST:
        return None
    ahead = [v - n for v in past if v > n]
    return math.log(max(1.0, float(np.median(ahead))) / max(n, 1)) if ahead else math.log(1.0 / max(n, 1))
