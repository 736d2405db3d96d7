"""Learning-curve extrapolation and remaining-effort estimates."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sluice.control import Estimator, ReplayEngine, fit_power_law, train


def test_fit_recovers_power_law() -> None:
    n = np.arange(1, 80)
    fit = fit_power_law(n, 0.2 + 1.5 * n**-0.6)
    assert fit is not None
    assert fit.c == pytest.approx(0.2, abs=2e-3)
    assert fit.a == pytest.approx(1.5, rel=1e-2)
    assert fit.alpha == pytest.approx(0.6, rel=1e-2)
    assert fit.r2 > 0.9999
    assert fit_power_law([1, 2, 3], [1, 2, 3]) is None  # too few points
    assert fit_power_law([1, 2, 3, 4, 5], [1.0] * 5) is None  # constant


CURVES = [
    # (c, a, alpha, mode): losses decreasing (a > 0) and accuracies increasing (a < 0)
    (0.10, 2.0, 0.7, "min"),
    (0.05, 1.0, 0.4, "min"),
    (0.97, -0.6, 0.5, "max"),
    (0.90, -0.9, 1.0, "max"),
    (0.30, 3.0, 1.5, "min"),
]


@pytest.mark.parametrize(("c", "a", "alpha", "mode"), CURVES)
@pytest.mark.parametrize("frac", [0.3, 0.5, 0.75])
def test_eta_of_a_smooth_curve_is_its_crossing(c, a, alpha, mode, frac) -> None:
    """Target = the curve's value at N = 200; after frac·N iterations the estimate is N − n, to 8 %."""
    total = 200
    target = c + a * total**-alpha
    n_done = int(frac * total)
    est = Estimator(metric="m", target=target, mode=mode)
    for n in range(1, n_done + 1):
        est.add(n, {"m": c + a * n**-alpha}, seconds=0.2)
    e = est.estimate(n_done, elapsed_s=0.2 * n_done)
    truth = total - n_done
    assert e.remaining_iterations is not None, e.note
    assert abs(e.remaining_iterations - truth) <= max(3, 0.08 * truth)
    assert e.remaining_low <= e.remaining_iterations <= e.remaining_high and e.reach_probability == 1.0
    assert e.remaining_s == pytest.approx(e.remaining_iterations * 0.2)
    assert e.progress_percent == pytest.approx(100 * frac, rel=0.08)


def _noisy_path(rng: np.random.Generator, length: int = 400) -> tuple[np.ndarray, float]:
    """An accuracy-like curve with AR(1) noise, and a target its mean reaches around iteration 120."""
    c, a, alpha = rng.uniform(0.85, 0.97), -rng.uniform(0.5, 1.0), rng.uniform(0.3, 1.0)
    sigma, rho = rng.uniform(0.002, 0.01), rng.uniform(0.0, 0.7)
    n = np.arange(1, length + 1)
    noise = np.zeros(length)
    for i in range(1, length):
        noise[i] = rho * noise[i - 1] + sigma * np.sqrt(1 - rho**2) * rng.normal()
    return c + a * n**-alpha + noise, float(c + a * 120.0**-alpha)


def test_intervals_cover_the_first_passage_of_noisy_curves() -> None:
    """Halfway to the first passage (patience 2) of noisy power-law curves, the 80 % intervals cover the truth
    about 80 % of the time and the median error is below one half. (The estimate is calibrated on real runs,
    whose curves follow a power law less closely than these: ``bench/eta.py``.)"""
    rng = np.random.default_rng(3)
    covered, errors = [], []
    while len(errors) < 40:
        y, target = _noisy_path(rng)
        ok = y >= target
        fired = np.flatnonzero(ok[1:] & ok[:-1])
        if fired.size == 0 or fired[0] + 2 < 20:
            continue
        stop = int(fired[0]) + 2  # the iteration (1-based) at which the criterion fires
        k = stop // 2
        est = Estimator(metric="acc", target=target, mode="max", patience=2, bounds=(0.0, 1.0))
        for i in range(k):
            est.add(i + 1, {"acc": float(y[i])}, 0.1)
        e = est.estimate(k, 0.1 * k)
        truth = stop - k
        low, high = e.remaining_low or 0, e.remaining_high or math.inf
        covered.append(low <= truth <= high)
        errors.append(abs((e.remaining_iterations or math.inf) - truth) / truth)
    assert 0.6 <= np.mean(covered) <= 0.97, np.mean(covered)
    assert np.median(errors) < 0.5, np.median(errors)


def test_beyond_the_asymptote_an_open_interval_and_a_probability_never_0() -> None:
    est = Estimator(metric="test_accuracy", target=0.99, mode="max")
    for n in range(1, 30):
        est.add(n, {"test_accuracy": 0.9 - 0.5 * n**-0.8}, 0.1)
    e = est.estimate(29, 2.9)
    assert e.remaining_iterations is None and e.remaining_s is None and e.progress_percent is None
    assert e.remaining_high is None and e.remaining_low is not None and e.remaining_low >= 1
    assert "not expected within" in e.note and f"more than {e.remaining_low}" in e.note and "0.9" in e.note
    assert 0 < e.reach_probability < 0.5 and "probability 0%" not in e.note


def test_an_interval_from_the_first_value_and_for_a_curve_going_the_wrong_way() -> None:
    est = Estimator(metric="train_loss", target=0.1, mode="min")
    est.add(1, {"train_loss": 1.0}, 0.1)
    e = est.estimate(1, 0.1)
    assert e.remaining_low is not None and 0 < e.reach_probability < 1, e.note
    for n in range(2, 10):
        est.add(n, {"train_loss": 1.0 + 0.1 * math.log(n)}, 0.1)
    e = est.estimate(9, 0.9)
    assert e.remaining_low is not None and 0 < e.reach_probability < 1, e.note
    assert e.remaining_iterations is None or e.remaining_iterations > 9


def test_budget_only_progress() -> None:
    est = Estimator(iteration_budget=50, time_budget_s=100.0)
    for n in range(1, 11):
        est.add(n, {}, 1.0)
    e = est.estimate(10, 10.0)
    assert e.progress_percent == pytest.approx(20.0)
    assert e.remaining_iterations == 40 and e.remaining_s == pytest.approx(40.0)
    # time runs out first: 5 s left at 1 s per iteration
    e = est.estimate(10, 95.0)
    assert e.progress_percent == pytest.approx(95.0) and e.remaining_iterations == 5
    assert Estimator().estimate(3, 1.0).progress_percent is None


def test_report_estimate_when_budget_stops_a_replayed_run() -> None:
    losses = [0.1 + 2.0 * n**-0.7 for n in range(1, 400)]
    target = 0.1 + 2.0 * 300**-0.7
    eng = ReplayEngine([{"train_loss": v} for v in losses], seconds_per_iteration=0.25)
    rep = train(eng, {"iterations": 100, "training_error": target}, clock=eng.clock)
    assert rep.fired == "iterations"
    assert rep.estimated_remaining_iterations == pytest.approx(200, abs=3)  # what the target would still need
    assert rep.estimated_remaining_s == pytest.approx(50, rel=0.02)
    assert rep.progress_percent == 100.0  # the budget, the first criterion to fire, is used up
    assert "budget" in rep.estimate_note and "e+" not in rep.estimate_note


def test_asymptote_kept_in_the_metric_range() -> None:
    n = np.arange(1, 30)
    y = 1.3 - 1.2 * n**-0.3  # would level off above 1: impossible for an accuracy
    free = fit_power_law(n, y)
    bounded = fit_power_law(n, y, bounds=(0.0, 1.0))
    assert free.c == pytest.approx(1.3, abs=0.01)
    assert bounded.c == 1.0 and bounded.a < 0


def test_fit_starts_after_the_initial_transient() -> None:
    """A flat start (clipped at chance level), then a power law: the estimate uses the power-law part."""
    n = np.arange(1, 61, dtype=float)
    y = np.maximum(0.95 - 3.0 * n**-0.7, 0.1)
    est = Estimator(metric="acc", target=float(0.95 - 3.0 * 100.0**-0.7), mode="max", bounds=(0.0, 1.0))
    for i, v in zip(n, y, strict=True):
        est.add(int(i), {"acc": float(v)}, 0.1)
    e = est.estimate(60, 6.0)
    assert e.remaining_iterations is not None, e.note
    assert abs(e.remaining_iterations - 40) <= 0.15 * 40
    assert e.fit is not None and e.fit.points < 60
