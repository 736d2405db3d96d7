"""Type-specific training errors (T4) and their use as the training-error criterion."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.control import Cause, ModelIdentity, train
from sluice.errors import DataError
from sluice.local import LocalTrainer
from sluice.metrics import (
    coverage_metrics,
    coverage_problem_ratio,
    coverage_ratio_error,
    energy_efficiency,
    energy_efficiency_error,
    energy_metrics,
    normalised_rmse,
    relative_error,
)


def test_coverage_problem_ratio_by_hand() -> None:
    rsrp = np.array([-100, -115, -120, -90, -111, -109.9])
    region = np.array([1, 1, 1, 2, 2, 2])
    ids, ratio = coverage_problem_ratio(rsrp, region, "rsrp")
    assert ids.tolist() == [1, 2]
    np.testing.assert_allclose(ratio, [2 / 3, 1 / 3])
    _, sinr_ratio = coverage_problem_ratio(np.array([-1.0, 3.0, 0.0, 5.0]), np.array([0, 0, 1, 1]), "SINR")
    np.testing.assert_allclose(sinr_ratio, [0.5, 0.0])


def test_coverage_ratio_error_from_values_and_from_ratios() -> None:
    region = np.array([1, 1, 2, 2])
    real = np.array([-120.0, -100.0, -100.0, -100.0])  # ratios 0.5, 0.0
    pred = np.array([-120.0, -119.0, -100.0, -112.0])  # ratios 1.0, 0.5
    assert coverage_ratio_error(real, pred, region, "rsrp") == pytest.approx(0.5)
    assert coverage_ratio_error(real, pred, region, "rsrp", threshold=-125) == 0.0
    assert coverage_ratio_error(np.array([0.1, 0.4]), np.array([0.2, 0.1])) == pytest.approx(0.2)
    with pytest.raises(DataError, match="signal must be"):
        coverage_ratio_error(real, pred, region, "cqi")
    with pytest.raises(DataError, match="one region per sample"):
        coverage_problem_ratio(real, region[:3])


def test_coverage_error_is_the_rmse_over_the_spread_and_no_constant_meets_1() -> None:
    real = np.array([-120.0, -100.0, -110.0, -90.0])  # mean -105, σ = √125
    assert normalised_rmse(real, real) == 0.0
    assert normalised_rmse(real, np.full(4, -105.0)) == pytest.approx(1.0)
    assert normalised_rmse(real, real + 5.0) == pytest.approx(5 / np.sqrt(125))
    for c in np.linspace(-130, -80, 11):  # any constant: RMSE² = σ² + (c − mean)²
        assert normalised_rmse(real, np.full(4, c)) >= 1.0
    with pytest.raises(DataError, match="all equal"):
        normalised_rmse(np.ones(3), np.zeros(3))
    pred = np.column_stack([real + 5.0, np.full(4, 3.0)])  # rsrp off by 5 dB, rsrq a constant
    target = np.column_stack([real, np.array([-10.0, -12.0, -14.0, -16.0])])
    fns = coverage_metrics(columns=("rsrp", "rsrq"))
    assert set(fns) == {"coverage_error", "coverage_error_rsrp", "coverage_error_rsrq"}
    assert fns["coverage_error_rsrq"](pred, target) > 1.0
    assert fns["coverage_error"](pred, target) == pytest.approx(
        (fns["coverage_error_rsrp"](pred, target) + fns["coverage_error_rsrq"](pred, target)) / 2)


def test_energy_errors_by_hand() -> None:
    np.testing.assert_allclose(energy_efficiency([100.0, 300.0], [10.0, 20.0]), [10.0, 15.0])
    assert relative_error([10.0, 20.0], [12.0, 17.0]) == pytest.approx(5 / 30)
    assert energy_efficiency_error([1.0, 1.0], [1.0, 1.0]) == 0.0
    with pytest.raises(DataError, match="> 0"):
        energy_efficiency([1.0], [0.0])
    with pytest.raises(DataError, match="all zero"):
        relative_error([0.0], [1.0])
    with pytest.raises(DataError, match="efficiency"):
        energy_metrics({"power": 0})


def _coverage_scenario(n: int = 900, regions: int = 6, seed: int = 0):
    """Users at distance d from their cell in one of several regions; RSRP follows a log-distance path loss
    with a per-region offset, RSRQ and SINR degrade with RSRP and load. Targets are in units of 10 dB."""
    rng = np.random.default_rng(seed)
    reg = rng.integers(0, regions, n)
    d = rng.uniform(50, 2000, n)
    load = rng.uniform(0, 1, n)
    offset = np.linspace(-6, 6, regions)[reg]
    rsrp = -60 - 37.6 * np.log10(d / 50) + offset + rng.normal(0, 2, n)
    rsrq = -6 + 0.12 * (rsrp + 80) - 6 * load + rng.normal(0, 1, n)
    sinr = 0.35 * (rsrp + 105) - 8 * load + rng.normal(0, 1, n)
    X = np.column_stack([np.log10(d / 50), load, np.eye(regions)[reg]]).astype(np.float32)
    Y = (np.column_stack([rsrp, rsrq, sinr]) / 10).astype(np.float32)
    return X, Y, reg


def test_coverage_training_error_stops_training() -> None:
    X, Y, reg = _coverage_scenario()
    cut = 700
    fns = coverage_metrics(reg[cut:], thresholds={"rsrp": -11.0, "rsrq": -1.5, "sinr": 0.0})
    eng = LocalTrainer.from_arrays(X[:cut], Y[:cut], X[cut:], Y[cut:], kind="regression", hidden=(32,), lr=0.05,
                       metric_fns=fns, seed=1)
    model = ModelIdentity(id="cov", type="coverage_problem_analysis")
    errors: list[float] = []
    rep = train(eng, {"iterations": 200, "training_error": 0.3}, model=model,
                on_event=lambda ev, p: errors.append(ev.metrics["coverage_error"]))
    assert rep.cause == Cause.CRITERION_MET and rep.fired == "training_error"
    hit = rep.criterion.hits[0]
    assert hit.observed == errors[-1] <= 0.3 < max(errors)
    assert all(e > 0.3 for e in errors[:-1])  # stopped at the first iteration that met it
    assert {"coverage_error_rsrp", "coverage_error_rsrq", "coverage_error_sinr"} <= set(rep.performance)
    assert {"coverage_ratio_error", "coverage_ratio_error_rsrp"} <= set(rep.performance)
    assert rep.performance["coverage_error"] == pytest.approx(
        np.mean([rep.performance[f"coverage_error_{s}"] for s in ("rsrp", "rsrq", "sinr")]))


def test_energy_saving_training_error_stops_training() -> None:
    rng = np.random.default_rng(2)
    n = 800
    load = rng.uniform(0.05, 1, n)
    shutdown = rng.integers(0, 2, n)
    traffic = load * rng.uniform(0.8, 1.2, n) * 10  # Gbit per hour
    power = 2.0 + 3.0 * load - 0.8 * shutdown + rng.normal(0, 0.05, n)  # kW
    eff = traffic / power
    X = np.column_stack([load, shutdown, traffic / 10]).astype(np.float32)
    Y = np.column_stack([eff, power]).astype(np.float32)
    eng = LocalTrainer.from_arrays(X[:600], Y[:600], X[600:], Y[600:], kind="regression", hidden=(32,), lr=0.05,
                       metric_fns=energy_metrics({"efficiency": 0, "consumption": 1}), seed=0)
    model = ModelIdentity(id="es", type="energy_saving_analysis")
    rep = train(eng, {"iterations": 200, "training_error": 0.08}, model=model)
    assert rep.fired == "training_error" and 2 <= rep.iterations < 200
    assert rep.performance["energy_error"] <= 0.08
    assert rep.performance["energy_error"] == pytest.approx(
        (rep.performance["energy_efficiency_error"] + rep.performance["energy_consumption_error"]) / 2)
