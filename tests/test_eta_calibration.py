"""Calibrated remaining-iteration estimates: conformal intervals, probabilities never sure, history, seconds,
and the runs of a runs directory as the history of the command line."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import numpy as np
import pytest

from sluice.cli import main
from sluice.control import Estimator
from sluice.control.eta_calibration import GAP_BANDS, MIN_PROBABILITY, Signals, fit, past_signal
from sluice.control.history import job_shape, past_iterations, runs_dir_history, target_of
from sluice.control.params import ModelIdentity, parse_termination
from sluice.control.report import _interval
from sluice.runtimes.training import eta_text


def _draw(rng: np.random.Generator, count: int) -> list[tuple[Signals, float, int]]:
    """Points whose log(r/n) is 0.4 + 0.5·curve − gap plus noise that shrinks with the gap."""
    out = []
    for _ in range(count):
        s = Signals(curve=float(rng.uniform(-2, 2)), reach=float(rng.uniform()), gap=float(rng.uniform(0, 1.2)))
        sd = 1.0 if s.gap < GAP_BANDS[0] else 0.3
        n = int(rng.integers(5, 200))
        out.append((s, n * math.exp(0.4 + 0.5 * s.curve - s.gap + sd * rng.standard_normal()), n))
    return out


def test_conformal_intervals_cover_fresh_points_per_band() -> None:
    rng = np.random.default_rng(0)
    cal = fit(_draw(rng, 3000))
    assert cal.curve_coef[1] == pytest.approx(0.5, abs=0.05)
    fresh = _draw(rng, 3000)
    for lo_gap, hi_gap in ((0.0, GAP_BANDS[0]), (GAP_BANDS[0], 2.0)):
        band = [p for p in fresh if lo_gap <= p[0].gap < hi_gap]
        cover = np.mean([lo <= r <= hi for s, r, n in band
                         for lo, hi in [cal.predict(s, n, (0.1, 0.9))]])
        assert 0.76 <= cover <= 0.84, (lo_gap, cover)
    # the probability of meeting the target within h is calibrated too: its mean is the observed share
    probs = [cal.probability_within(s, n, 2 * n) for s, _, n in fresh]
    met = [r <= 2 * n for s, r, n in fresh]
    assert np.mean(probs) == pytest.approx(np.mean(met), abs=0.03)


def test_probability_is_never_0_or_1() -> None:
    cal = fit(_draw(np.random.default_rng(1), 500))
    s = Signals(curve=0.0, reach=0.5, gap=0.3)
    assert cal.probability_within(s, 10, 1e-6) == pytest.approx(MIN_PROBABILITY)
    assert cal.probability_within(s, 10, 1e12) == pytest.approx(1 - MIN_PROBABILITY)
    assert cal.probability_within(s, 10, 0) == 0.0  # within no iteration at all: never


def _flat_noisy(rng: np.random.Generator, n: int) -> list[float]:
    return [float(0.8 + 0.01 * rng.standard_normal()) for _ in range(n)]


def test_always_an_interval_after_the_first_evaluations() -> None:
    rng = np.random.default_rng(2)
    for target in (0.81, 0.9, 0.99):  # just above the plateau, well above, beyond reach
        est = Estimator(metric="acc", target=target, mode="max", bounds=(0.0, 1.0))
        for n, v in enumerate(_flat_noisy(rng, 12), start=1):
            est.add(n, {"acc": v}, 0.5)
            e = est.estimate(n, 0.5 * n)
            assert e.remaining_low is not None and e.remaining_low >= 1, e.note
            assert 0 < e.reach_probability < 1, e.note
            if e.remaining_iterations is None:  # no point: "more than low", open above
                assert e.remaining_high is None and f"more than {e.remaining_low}" in e.note
            else:
                assert e.remaining_low <= e.remaining_iterations <= (e.remaining_high or math.inf)
                # the seconds come with their interval, from the measured seconds per iteration
                assert e.remaining_s == pytest.approx(0.5 * e.remaining_iterations)
                assert e.remaining_s_low == pytest.approx(0.5 * e.remaining_low)


def test_history_moves_the_estimate_to_what_past_runs_needed() -> None:
    rng = np.random.default_rng(3)
    values = _flat_noisy(rng, 40)
    answers = {}
    for past in ((), (300, 320, 310, 305)):
        est = Estimator(metric="acc", target=0.83, mode="max", bounds=(0.0, 1.0), past=past)
        for n, v in enumerate(values, start=1):
            est.add(n, {"acc": v}, 0.1)
        answers[past] = est.estimate(40, 4.0)
    with_past = answers[(300, 320, 310, 305)]
    assert "from 4 past runs" in with_past.note
    assert with_past.remaining_iterations is not None
    assert with_past.remaining_low <= 270 <= (with_past.remaining_high or math.inf)
    assert abs(with_past.remaining_iterations - 270) < abs((answers[()].remaining_iterations or 10**6) - 270)
    assert past_signal([100, 200], 10) is None  # fewer than three runs: no history
    assert past_signal([100, 200, 300], 250) == pytest.approx(math.log(50 / 250))


def test_interval_text() -> None:
    assert _interval(120, 90, 160, "d", "") == "120 (80 %: 90–160)"
    assert _interval(120, 90, None, "d", "") == "120 (80 %: 90–…)"
    assert _interval(None, 90, None, "d", "") == "more than 90"
    assert _interval(None, None, None, "d", "") == "-"
    assert _interval(0, 0, 0, "d", "") == "0"
    assert _interval(12.0, 9.0, 16.0, ".1f", " s") == "12.0 s (80 %: 9.0–16.0 s)"
    # the live progress bar says the same
    assert eta_text({"remaining_iterations": None, "remaining_iterations_low": 90}) == ">90"
    assert eta_text({"remaining_iterations": 120, "remaining_iterations_low": 90}) == "120 (90–…)"
    assert eta_text({}) == "-"


def _run(out: Path, seed: int, threshold: float) -> int:
    return main(["run", "--out", str(out), "--set", f"seed={seed}", "--set", "train.rounds=40",
                 "--set", "termination.iterations=40",
                 "--set", f"termination.performance.accuracy.threshold={threshold}"])


def test_runs_directory_is_the_history_of_the_command_line(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    stops = []
    for seed in range(3):
        assert _run(runs / f"r{seed}", seed, 0.5) == 0
        rep = json.loads((runs / f"r{seed}" / "report.json").read_text())
        stops.append(rep["iterations"])
        # a finished run: the report, status.json and the last metrics line agree that nothing remains
        last = json.loads((runs / f"r{seed}" / "metrics.jsonl").read_text().splitlines()[-1])
        status = json.loads((runs / f"r{seed}" / "status.json").read_text())
        assert rep["cause"] == "CRITERION_MET" and rep["estimated_remaining_iterations"] == 0
        assert last["remaining_iterations"] == 0 and last["progress_percent"] == 100.0
        assert status["estimated_remaining_iterations"] == 0 and status["progress_percent"] == 100.0
    assert _run(runs / "other", 0, 0.3) == 0  # a looser target: says nothing about 0.5
    capsys.readouterr()
    shape = job_shape("run", tomllib.loads((runs / "r0" / "config.toml").read_text()))
    hist = runs_dir_history(runs, "run", exclude=runs / "r0")
    model = ModelIdentity()
    strict = target_of(parse_termination({"performance": {"accuracy": {"threshold": 0.5}}}), None, model)
    assert sorted(past_iterations(hist, model, strict, shape)) == sorted(stops[1:])
    loose = target_of(parse_termination({"performance": {"accuracy": {"threshold": 0.3}}}), None, model)
    assert len(past_iterations(hist, model, loose, shape)) == 3  # those that met 0.5 met 0.3, and "other"
    assert past_iterations(hist, model, strict, "another shape") == []


def test_a_worker_spec_history_teaches_the_process_estimate(tmp_path: Path) -> None:
    """The service sends a worker the runs of the job's shape; those that met a target at least as strict
    as the process's become its estimate's history."""
    from sluice.control.history import RunRecord
    from sluice.runtimes.remote import _build

    def record(iterations: int, threshold: float, shape: str = "S") -> dict:
        return RunRecord(model_id="m", model_type=None, version="1", cause="CRITERION_MET", fired=None,
                         iterations=iterations, duration_s=1.0, performance={}, shape=shape,
                         reached={"test_accuracy": threshold}).model_dump(mode="json")

    spec = {"kind": "local", "raw": {"train": {"iterations": 5}}, "work_dir": str(tmp_path),
            "termination": {"iterations": 5, "performance": {"accuracy": {"threshold": 0.9}}},
            "history_shape": "S",
            "history": [record(30, 0.95), record(40, 0.9), record(50, 0.8), record(60, 0.99, shape="T")]}
    _, proc = _build(spec, lambda msg: None)
    assert sorted(proc.past_iterations) == [30, 40]
    assert sorted(proc.estimator.past) == [30.0, 40.0]


def test_a_target_on_a_metric_of_the_engine_own_is_read_with_the_engine_specs() -> None:
    from sluice.errors import ConfigError
    from sluice.metrics import MetricSpec

    term = parse_termination({"performance": {"anomaly_f1": {"threshold": 0.65}}})
    with pytest.raises(ConfigError, match="unknown metric 'anomaly_f1'"):
        target_of(term, None, ModelIdentity())  # Sluice's known metrics do not name it
    target = target_of(term, None, ModelIdentity(), {"anomaly_f1": MetricSpec("anomaly_f1", True, 0.0, 1.0)})
    assert target is not None and (target.metric, target.threshold, target.mode) == ("anomaly_f1", 0.65, "max")
