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
    # (c, a, alpha, noise, mode): losses decreasing (a > 0) and accuracies increasing (a < 0)
    (0.10, 2.0, 0.7, 0.002, "min"),
    (0.05, 1.0, 0.4, 0.002, "min"),
    (0.97, -0.6, 0.5, 0.002, "max"),
    (0.90, -0.9, 1.0, 0.0003, "max"),
    (0.30, 3.0, 1.5, 0.0001, "min"),
]


@pytest.mark.parametrize(("c", "a", "alpha", "noise", "mode"), CURVES)
@pytest.mark.parametrize("frac", [0.3, 0.5, 0.75])
def test_eta_within_15_percent_once_30_percent_done(c, a, alpha, noise, mode, frac) -> None:
    """Target = the curve's value at N = 200; after frac·N iterations the estimate is within 15 %."""
    rng = np.random.default_rng(7)
    total = 200
    target = c + a * total**-alpha
    n_done = int(frac * total)
    est = Estimator(metric="m", target=target, mode=mode)
    for n in range(1, n_done + 1):
        est.add(n, {"m": c + a * n**-alpha + rng.normal(0, noise)}, seconds=0.2 + 0.01 * rng.normal())
    e = est.estimate(n_done, elapsed_s=0.2 * n_done)
    truth = total - n_done
    assert e.remaining_iterations is not None, e.note
    assert abs(e.remaining_iterations - truth) <= 0.15 * truth
    assert e.remaining_s == pytest.approx(truth * 0.2, rel=0.2)
    assert e.progress_percent == pytest.approx(100 * frac, rel=0.15)


def test_eta_null_with_reason_when_target_beyond_asymptote() -> None:
    est = Estimator(metric="test_accuracy", target=0.99, mode="max")
    for n in range(1, 30):
        est.add(n, {"test_accuracy": 0.9 - 0.5 * n**-0.8}, 0.1)
    e = est.estimate(29, 2.9)
    assert e.remaining_iterations is None and e.remaining_s is None and e.progress_percent is None
    assert "asymptote" in e.note and "0.9" in e.note


def test_eta_null_when_too_few_points_or_wrong_direction() -> None:
    est = Estimator(metric="train_loss", target=0.1, mode="min")
    est.add(1, {"train_loss": 1.0}, 0.1)
    e = est.estimate(1, 0.1)
    assert e.remaining_iterations is None and "needs 4" in e.note
    for n in range(2, 10):
        est.add(n, {"train_loss": 1.0 + 0.1 * math.log(n)}, 0.1)
    e = est.estimate(9, 0.9)
    assert e.remaining_iterations is None and "not improving" in e.note


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
    assert rep.estimated_remaining_iterations == pytest.approx(200, abs=3)
    assert rep.estimated_remaining_s == pytest.approx(50, rel=0.02)
    assert rep.progress_percent == pytest.approx(100 / 3, rel=0.02)


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
