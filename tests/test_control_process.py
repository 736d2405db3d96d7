"""The training process: every cause, the inadequate-data loop, suspend/cancel, feasibility, reports."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from sluice.control import (
    Cause,
    ModelIdentity,
    ProcessState,
    ReplayEngine,
    TrainingProcess,
    TrainingReport,
    train,
)
from sluice.control import inbox as inbox_mod
from sluice.engine import IterationEvent
from sluice.errors import ConfigError, NegotiationError
from sluice.local import LocalTrainer


def _local(ds, **kw) -> LocalTrainer:
    kw.setdefault("hidden", (32,))
    return LocalTrainer(ds.X_train, ds.y_train, ds.X_test, ds.y_test, num_classes=ds.num_classes, **kw)


def _acc(values):
    return [{"test_accuracy": v} for v in values]


# --------------------------------------------------------------------------------------- causes
def test_cause_criterion_met_with_model_and_report(digits, tmp_path: Path) -> None:
    eng = _local(digits)
    model = ModelIdentity(id="digits-mlp", version="2", type="fault_prediction")
    rep = train(eng, {"iterations": 40, "performance": {"accuracy": 0.9}}, model=model,
                save_path=tmp_path / "m.pt")
    assert rep.cause == Cause.CRITERION_MET and rep.status == ProcessState.FINISHED and rep.ok
    assert rep.fired == "performance.test_accuracy"
    assert rep.performance["test_accuracy"] >= 0.9
    assert set(rep.performance) >= {"test_loss", "test_precision", "test_recall", "test_f1", "train_loss"}
    assert rep.iterations == eng.iteration < 40
    assert rep.model.id == "digits-mlp" and rep.model.version == "2"
    assert rep.model.type == "MDA_ASSISTED_FAULT_MANAGEMENT_FAILURE_PREDICTION"
    assert rep.model_path == str(tmp_path / "m.pt") and Path(rep.model_path).is_file()
    assert rep.progress_percent == 100.0 and rep.estimated_remaining_iterations == 0
    assert rep.duration_s > 0
    doc = rep.to_3gpp()
    assert doc["progressStatus"]["resultStateInfo"] == "CRITERION_MET"
    assert doc["mLModel"]["mLModelId"] == "digits-mlp"
    assert {p["performanceMetric"] for p in doc["modelPerformanceValidation"]} >= {"test_accuracy"}
    assert doc["vsDataContainer"]["vsData"]["criterion"]["rule"] == "performance.test_accuracy"
    json.dumps(rep.to_json())
    assert TrainingReport.model_validate(rep.to_json()).fired == rep.fired


def test_cause_performance_not_met_with_estimate() -> None:
    # accuracy climbs like 0.95 - 0.5 n^-0.5; the budget ends before the 0.9 requirement is met
    stream = _acc([0.95 - 0.5 * n**-0.5 for n in range(1, 60)])
    eng = ReplayEngine(stream, seconds_per_iteration=0.5)
    rep = train(eng, {"iterations": 30}, {"performance": {"accuracy": 0.9}}, clock=eng.clock)
    assert rep.cause == Cause.PERFORMANCE_NOT_MET and rep.status == ProcessState.FAILED
    assert rep.fired == "iterations" and rep.requirements_met is False and not rep.ok
    # 0.95 - 0.5/sqrt(n) >= 0.9  <=>  n >= 100: 70 more iterations, 35 s
    assert rep.estimated_remaining_iterations == pytest.approx(70, rel=0.05)
    assert rep.estimated_remaining_s == pytest.approx(35, rel=0.05)
    assert rep.progress_percent == pytest.approx(30, rel=0.05)
    assert "test_accuracy" in rep.detail and "needs 0.9" in rep.detail


def test_requirements_alone_stop_training_when_met() -> None:
    eng = ReplayEngine([{"test_accuracy": a, "test_f1": f} for a, f in
                        [(0.5, 0.5), (0.91, 0.7), (0.92, 0.86), (0.95, 0.9)]])
    rep = train(eng, None, {"performance": {"accuracy": 0.9, "f1": 0.85}}, clock=eng.clock)
    assert rep.cause == Cause.CRITERION_MET and rep.fired == "requirements.performance"
    assert eng.calls == 3 and rep.requirements_met is True


def test_requirements_stop_only_when_termination_sets_no_result() -> None:
    stream = _acc([0.3, 0.55, 0.7, 0.92, 0.95])
    eng = ReplayEngine(stream)
    rep = train(eng, {"performance": {"accuracy": 0.9}}, {"performance": {"accuracy": 0.5}}, clock=eng.clock)
    assert rep.fired == "performance.test_accuracy" and eng.calls == 4 and rep.requirements_met
    eng = ReplayEngine(stream)
    req = {"performance": {"accuracy": 0.5}, "stop_when_met": True}
    rep = train(eng, {"performance": {"accuracy": 0.9}}, req, clock=eng.clock)
    assert rep.fired == "requirements.performance" and eng.calls == 2
    eng = ReplayEngine(stream)
    req = {"performance": {"accuracy": 0.5}, "stop_when_met": False}
    rep = train(eng, {"iterations": 3}, req, clock=eng.clock)
    assert rep.fired == "iterations" and eng.calls == 3 and rep.cause == Cause.CRITERION_MET


def test_max_training_time_requirement_is_a_stop_rule() -> None:
    eng = ReplayEngine(_acc([0.1] * 20), seconds_per_iteration=2.0)
    rep = train(eng, None, {"max_training_time_s": 7.0, "performance": {"accuracy": 0.9}}, clock=eng.clock)
    assert rep.fired == "requirements.max_training_time_s" and eng.calls == 4
    assert rep.cause == Cause.PERFORMANCE_NOT_MET


def test_cause_cancelled(digits) -> None:
    eng = _local(digits)
    rep = train(eng, {"iterations": 50}, on_event=lambda ev, p: p.cancel() if p.n == 3 else None)
    assert rep.cause == Cause.CANCELLED and rep.status == ProcessState.CANCELLED
    assert rep.iterations == 3 == eng.iteration


def test_cause_inadequate_data_without_new_data(digits) -> None:
    eng = _local(digits, min_samples=5000)
    rep = train(eng, {"iterations": 5})
    assert rep.cause == Cause.INADEQUATE_TRAINING_DATA and rep.iterations == 0
    assert "1437 training samples" in rep.detail


def test_cause_insufficient_training_samples_before_training(digits) -> None:
    eng = _local(digits)
    rep = train(eng, {"iterations": 5}, {"min_data_amount": 2000})
    assert rep.cause == Cause.INSUFFICIENT_TRAINING_SAMPLES and rep.iterations == 0 and eng.iteration == 0
    assert "1437" in rep.detail and "2000" in rep.detail
    rep = train(_local(digits), {"iterations": 5}, {"data_amount": 1500})
    assert rep.cause == Cause.INSUFFICIENT_TRAINING_SAMPLES


def test_cause_insufficient_compute_from_probe(digits) -> None:
    eng = _local(digits)
    before = eng.params.copy()
    rep = train(eng, {"iterations": 100000}, {"max_training_time_s": 1.0})
    assert rep.cause == Cause.INSUFFICIENT_COMPUTE and rep.iterations == 0
    assert "maximum training time" in rep.detail
    np.testing.assert_array_equal(eng.params, before)  # the probe did not train the model


def test_insufficient_compute_without_probe_method() -> None:
    """An engine without probe(): the first iterations are the probe."""
    eng = ReplayEngine(_acc([0.1] * 50), seconds_per_iteration=1.0)
    rep = train(eng, {"iterations": 40}, {"max_training_time_s": 10.0}, clock=eng.clock, probe_iterations=2)
    assert rep.cause == Cause.INSUFFICIENT_COMPUTE and eng.calls == 2
    assert "first 2 iterations" in rep.detail


def test_feasible_request_trains_and_limits_data(digits) -> None:
    eng = _local(digits)
    rep = train(eng, {"iterations": 2}, {"max_data_amount": 300, "layers": 1, "max_training_time_s": 60})
    assert rep.cause == Cause.CRITERION_MET and eng.num_samples == 300
    with pytest.raises(NegotiationError, match="model has 2"):
        train(_local(digits), {"iterations": 2}, {"layers": 3})


def test_cause_diverged(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 5)).astype(np.float32)
    y = (X @ rng.normal(size=5) * 100).astype(np.float32)
    eng = LocalTrainer(X[:150], y[:150], X[150:], y[150:], task="regression", lr=0.5, hidden=(16,))
    rep = train(eng, {"iterations": 30}, save_path=tmp_path / "m.pt")
    assert rep.cause == Cause.DIVERGED and rep.status == ProcessState.FAILED
    assert rep.iterations == 1 and rep.model_path is None and "nan" in rep.detail
    assert not (tmp_path / "m.pt").exists()


# --------------------------------------------------------------------------------------- data loop (T6)
def test_data_loop_resumes_with_identical_weights(digits) -> None:
    X, y = digits.X_train, digits.y_train
    eng = LocalTrainer(X[:100], y[:100], digits.X_test, digits.y_test, num_classes=10, hidden=(32,),
                       min_samples=400)
    seen: list[ProcessState] = []
    snap: dict[str, np.ndarray] = {}

    def provider(interim: TrainingReport):
        assert interim.cause == Cause.INADEQUATE_TRAINING_DATA
        snap["at_wait"] = eng.params.copy()
        return {"X": X[100:600], "y": y[100:600]}

    def on_state(state, proc, report):
        seen.append(state)

    def on_event(ev, proc):
        if proc.n == 1:
            snap["after_first"] = eng.params.copy()

    rep = train(eng, {"iterations": 3}, data_provider=provider, on_state=on_state, on_event=on_event)
    S = ProcessState
    assert seen == [S.RUNNING, S.AWAITING_DATA, S.RUNNING, S.FINISHED]
    assert rep.cause == Cause.CRITERION_MET and rep.iterations == 3 and rep.awaited_data == 1
    assert eng.num_samples == 600
    # no training happened while waiting: the first iteration after the data starts from the initial weights
    fresh = LocalTrainer(X[:600], y[:600], digits.X_test, digits.y_test, num_classes=10, hidden=(32,))
    np.testing.assert_array_equal(snap["at_wait"], fresh.params)
    fresh.iterate()
    np.testing.assert_array_equal(snap["after_first"], fresh.params)


def test_data_loop_mid_training_keeps_model_state() -> None:
    """A scripted engine that runs short of data after 2 iterations, then continues after add_data."""

    class Hungry(ReplayEngine):
        def __init__(self) -> None:
            super().__init__([])
            self.weights = np.zeros(3)
            self.need = False
            self.n = 0

        def iterate(self) -> IterationEvent:
            self.calls += 1
            if self.n == 2 and not self.data:
                return IterationEvent(iteration=self.n, anomaly="INADEQUATE_TRAINING_DATA",
                                      detail="class 7 missing")
            self.n += 1
            self.weights = self.weights + 1
            return IterationEvent(iteration=self.n, metrics={"train_loss": 1.0 / self.n}, seconds=1.0)

    eng = Hungry()
    weights_at_wait = {}

    def provider(interim):
        weights_at_wait["w"] = eng.weights.copy()
        assert interim.iterations == 2
        return "more data"

    rep = train(eng, {"iterations": 4}, data_provider=provider)
    np.testing.assert_array_equal(weights_at_wait["w"], [2, 2, 2])
    np.testing.assert_array_equal(eng.weights, [4, 4, 4])
    assert eng.data == ["more data"] and rep.iterations == 4 and rep.cause == Cause.CRITERION_MET
    assert not eng.suspended


def test_data_arrives_from_another_thread(digits) -> None:
    X, y = digits.X_train, digits.y_train
    eng = LocalTrainer(X[:50], y[:50], digits.X_test, digits.y_test, num_classes=10, hidden=(16,),
                       min_samples=200)
    proc = TrainingProcess(eng, {"iterations": 2, "data_wait_s": 20})

    def feeder():
        while proc.state != ProcessState.AWAITING_DATA:
            time.sleep(0.01)
        proc.add_data((X[50:300], y[50:300]))

    t = threading.Thread(target=feeder)
    t.start()
    rep = proc.run()
    t.join()
    assert rep.cause == Cause.CRITERION_MET and rep.awaited_data == 1 and eng.num_samples == 300


def test_data_arrives_through_the_inbox(digits, tmp_path: Path) -> None:
    X, y = digits.X_train, digits.y_train
    f = tmp_path / "more.npz"
    np.savez(f, X=X[50:300], y=y[50:300])
    eng = LocalTrainer(X[:50], y[:50], digits.X_test, digits.y_test, num_classes=10, hidden=(16,),
                       min_samples=200)
    box = inbox_mod.inbox_of(tmp_path)

    def on_state(state, proc, report):
        if state == ProcessState.AWAITING_DATA:
            inbox_mod.put(tmp_path, f)

    rep = train(eng, {"iterations": 2, "data_wait_s": 20}, inbox=box, on_state=on_state)
    assert rep.cause == Cause.CRITERION_MET and eng.num_samples == 300
    assert not list(box.glob("*.npz")) and len(list((box / "consumed").glob("*.npz"))) == 1


def test_data_wait_times_out() -> None:
    eng = ReplayEngine([{"anomaly": "INADEQUATE_TRAINING_DATA", "detail": "empty"}])
    t0 = time.monotonic()
    rep = train(eng, {"iterations": 3, "data_wait_s": 0.3})
    assert 0.25 < time.monotonic() - t0 < 5
    assert rep.cause == Cause.INADEQUATE_TRAINING_DATA and rep.detail == "empty"


# --------------------------------------------------------------------------------------- controls
def test_suspend_and_resume_from_another_thread() -> None:
    eng = ReplayEngine(_acc([0.1] * 10))
    states: list[ProcessState] = []
    proc = TrainingProcess(eng, {"iterations": 5}, on_state=lambda s, p, r: states.append(s), clock=eng.clock)

    def on_event(ev, p):
        if p.n == 2:
            p.suspend()
            threading.Timer(0.05, p.resume).start()

    proc.on_event = on_event
    rep = proc.run()
    S = ProcessState
    assert states == [S.RUNNING, S.SUSPENDED, S.RUNNING, S.FINISHED]
    assert rep.iterations == 5 and eng.calls == 5 and not eng.suspended


def test_process_runs_once_and_checks_the_engine() -> None:
    eng = ReplayEngine(_acc([0.1] * 3))
    proc = TrainingProcess(eng, {"iterations": 1})
    proc.run()
    with pytest.raises(ConfigError, match="already ran"):
        proc.run()
    with pytest.raises(ConfigError, match="engine protocol"):
        TrainingProcess(object(), {"iterations": 1})  # type: ignore[arg-type]


def test_metrics_validated_against_engine(digits) -> None:
    from sluice.control import register_metric

    register_metric("bleu", "max", 0, 1)
    with pytest.raises(ConfigError, match="does not report"):
        train(_local(digits), {"iterations": 2, "performance": {"bleu": 0.3}})


def test_resource_sampler_measures_this_process() -> None:
    from sluice.control import ResourceSampler

    s = ResourceSampler(min_interval_s=0.0)
    x = np.ones(10**6)
    for _ in range(20):
        x = np.sqrt(x + 1.0)
    r = s.sample()
    assert r["memory_bytes"] > 10**7 and 0 < r["memory_percent"] < 100
    assert 0 <= r["cpu_percent"] <= 100
    cached = ResourceSampler(min_interval_s=60.0)
    assert cached.sample() is cached.sample()
