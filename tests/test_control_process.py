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
    ProcessHooks,
    ProcessOptions,
    ProcessState,
    ReplayEngine,
    TrainingProcess,
    TrainingReport,
    make_process,
    train,
)
from sluice.control import inbox as inbox_mod
from sluice.control.report import EXIT_CODES
from sluice.engine import IterationEvent
from sluice.errors import ConfigError, DataError, NegotiationError
from sluice.local import LocalTrainer
from sluice.roles import threegpp


def _local(ds, **kw) -> LocalTrainer:
    kw.setdefault("hidden", (32,))
    return LocalTrainer.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test, num_classes=ds.num_classes, **kw)


def _acc(values):
    return [{"test_accuracy": v} for v in values]


# --------------------------------------------------------------------------------------- causes
def test_cause_criterion_met_with_model_and_report(digits, tmp_path: Path) -> None:
    eng = _local(digits)
    model = ModelIdentity(id="digits-mlp", version="2", type="fault_prediction")
    records = []
    rep = train(eng, {"iterations": 40, "performance": {"accuracy": 0.9}}, model=model,
                save_path=tmp_path / "m.pt", on_event=lambda ev, proc: records.append(proc.estimate_record()))
    # the record of the iteration whose target fires says what the report says
    assert records[-1]["remaining_iterations"] == 0 and records[-1]["progress_percent"] == 100.0
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
    doc = threegpp.training_report(rep)
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
    assert rep.progress_percent == 100.0  # the budget, the first criterion to fire, is used up
    low, high = rep.estimated_remaining_iterations_low, rep.estimated_remaining_iterations_high
    assert low <= rep.estimated_remaining_iterations <= high and high - low <= 3  # a smooth curve: no spread
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
    eng = LocalTrainer.from_arrays(X[:150], y[:150], X[150:], y[150:], kind="regression", lr=0.5, hidden=(16,))
    rep = train(eng, {"iterations": 30}, save_path=tmp_path / "m.pt")
    assert rep.cause == Cause.DIVERGED and rep.status == ProcessState.FAILED
    assert rep.iterations == 1 and rep.model_path is None and "nan" in rep.detail
    assert not (tmp_path / "m.pt").exists()


# --------------------------------------------------------------------------------------- data loop (T6)
def test_data_loop_resumes_with_identical_weights(digits) -> None:
    X, y = digits.X_train, digits.y_train
    eng = LocalTrainer.from_arrays(X[:100], y[:100], digits.X_test, digits.y_test, num_classes=10, hidden=(32,),
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
    fresh = LocalTrainer.from_arrays(X[:600], y[:600], digits.X_test, digits.y_test, num_classes=10, hidden=(32,))
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
    eng = LocalTrainer.from_arrays(X[:50], y[:50], digits.X_test, digits.y_test, num_classes=10, hidden=(16,),
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
    eng = LocalTrainer.from_arrays(X[:50], y[:50], digits.X_test, digits.y_test, num_classes=10, hidden=(16,),
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
    proc = TrainingProcess(eng, {"iterations": 5}, hooks=ProcessHooks(on_state=lambda s, p, r: states.append(s)),
                           options=ProcessOptions(clock=eng.clock))

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


def test_make_process_takes_hooks_and_options_by_name() -> None:
    eng = ReplayEngine(_acc([0.1] * 3))
    proc = make_process(eng, {"iterations": 2}, hooks=ProcessHooks(checkpoint_every=3), probe_iterations=0,
                        checkpoint_every=2, save_path="m.pt", clock=eng.clock)
    assert (proc.checkpoint_every, proc.probe_iterations, proc.save_path, proc.clock) == (2, 1, "m.pt", eng.clock)
    with pytest.raises(TypeError, match="'on_events'"):
        make_process(eng, {"iterations": 2}, on_events=print)
    with pytest.raises(ConfigError, match="checkpoint_every"):
        TrainingProcess(eng, {"iterations": 2}, hooks=ProcessHooks(checkpoint_every=-1))


def test_metrics_validated_against_engine(digits) -> None:
    """A target the engine cannot report is refused before training, naming what it reports."""
    eng = _local(digits)
    with pytest.raises(ConfigError) as exc:
        TrainingProcess(eng, {"iterations": 2, "performance": {"auc": 0.9}})
    msg = str(exc.value)
    assert "unknown metric 'test_auc'" in msg and "LocalTrainer reports" in msg and "test_f1" in msg
    assert eng.model is None or eng.iteration == 0
    with pytest.raises(ConfigError, match="LocalTrainer sends nothing over a network"):
        TrainingProcess(eng, {"resources": {"network_bytes": 1e6}})
    # an engine that declares test_auc may be trained to it
    rep = train(ReplayEngine([{"test_auc": a} for a in (0.6, 0.8, 0.95)]), {"performance": {"auc": 0.9}})
    assert rep.fired == "performance.test_auc" and rep.iterations == 3


def test_resource_sampler_measures_this_process() -> None:
    from sluice.control import ResourceSampler

    s = ResourceSampler(min_interval_s=0.0)
    c0, w0 = time.process_time(), time.monotonic()
    x = np.ones(10**6)
    for _ in range(20):
        x = np.sqrt(x + 1.0)
    r = s.sample()
    used = 100 * (time.process_time() - c0) / ((time.monotonic() - w0) * s.cores)
    assert r["memory_bytes"] > 10**7 and 0 < r["memory_percent"] < 100
    # the CPU this process used over the sampler's window, as a share of every core
    assert r["cpu_percent"] > 0 and r["cpu_percent"] == pytest.approx(used, rel=0.3, abs=2.0)
    cached = ResourceSampler(min_interval_s=60.0)
    assert cached.sample() is cached.sample()


# --------------------------------------------------------------------------------------- honest causes
def _rising(n: int = 40) -> list[dict[str, float]]:
    return [{"test_accuracy": 0.95 - 0.5 * k**-0.5, "train_loss": 0.5 * k**-0.5} for k in range(1, n + 1)]


@pytest.mark.parametrize(
    ("termination", "rule"),
    [
        ({"iterations": 5, "performance": {"accuracy": 0.99}}, "iterations"),
        ({"training_time_s": 3.0, "performance": {"accuracy": 0.99}}, "training_time_s"),
        ({"iterations": 5, "training_error": 0.01}, "iterations"),
        ({"plateau": {"test_accuracy": {"min_delta": 0.05, "patience": 2}}, "performance": {"accuracy": 0.99}},
         "plateau.test_accuracy"),
        ({"iterations": 4, "all_of": [{"iterations": 2, "performance": {"f1": 0.9}}]}, "iterations"),
    ],
)
def test_budget_before_target_is_budget_exhausted(termination, rule, tmp_path: Path) -> None:
    stream = [{**m, "test_f1": m["test_accuracy"]} for m in _rising()]
    eng = ReplayEngine(stream)
    rep = train(eng, termination, clock=eng.clock, save_path=tmp_path / "m.pt")
    assert rep.fired == rule
    assert rep.cause == Cause.BUDGET_EXHAUSTED and rep.status == ProcessState.FINISHED
    assert not rep.ok and rep.exit_code == EXIT_CODES[Cause.BUDGET_EXHAUSTED] != 0
    assert rep.model_path == str(tmp_path / "m.pt") and eng.saved == [rep.model_path]
    assert "before the result was reached" in rep.detail


def test_budget_is_the_request_without_a_target() -> None:
    for term in ({"iterations": 5}, {"plateau": {"test_accuracy": {"min_delta": 0.05, "patience": 2}}},
                 {"training_time_s": 3.0}):
        eng = ReplayEngine(_rising())
        rep = train(eng, term, clock=eng.clock)
        assert rep.cause == Cause.CRITERION_MET and rep.ok and rep.exit_code == 0, term


def test_budget_exhausted_report_estimates_the_rest() -> None:
    eng = ReplayEngine(_rising(60), seconds_per_iteration=0.5)
    rep = train(eng, {"iterations": 20, "performance": {"accuracy": 0.9}}, clock=eng.clock)
    assert rep.cause == Cause.BUDGET_EXHAUSTED
    # 0.95 - 0.5/sqrt(n) >= 0.9  <=>  n >= 100
    assert rep.estimated_remaining_iterations == pytest.approx(80, rel=0.05)
    assert "test_accuracy is 0.838" in rep.detail and "target 0.9" in rep.detail


def test_report_carries_the_parameters_in_force() -> None:
    eng = ReplayEngine(_rising())

    def on_event(ev, proc):
        if proc.n == 1:
            proc.update({"iterations": 3})

    rep = train(eng, {"iterations": 5, "performance": {"accuracy": 0.99}}, {"max_training_time_s": 100},
                on_event=on_event, clock=eng.clock)
    assert rep.termination is not None and rep.termination.iterations == 3
    assert rep.termination.performance["test_accuracy"].threshold == 0.99
    assert rep.requirements is not None and rep.requirements.max_training_time_s == 100
    rows = dict(rep.rows())
    assert rows["termination"] == "iterations=3; performance.test_accuracy=0.99"
    assert rows["requirements"] == "max_training_time_s=100"
    back = TrainingReport.model_validate(json.loads(json.dumps(rep.to_json())))
    assert back.termination == rep.termination and back.requirements == rep.requirements


def test_loss_blown_up_past_its_initial_value_is_divergence() -> None:
    stream = [{"test_loss": v, "test_accuracy": 0.1} for v in (1.5, 12.0, 30.0, 40.0)]
    rep = train(ReplayEngine(stream, initial={"test_loss": 2.3}), {"iterations": 4})
    assert rep.cause == Cause.DIVERGED and rep.iterations == 3 and "initial value 2.3" in rep.detail
    rep = train(ReplayEngine(stream, initial={"test_loss": 2.3}), {"iterations": 4, "divergence_factor": 20})
    assert rep.iterations == 4 and rep.cause == Cause.CRITERION_MET
    rep = train(ReplayEngine(stream, initial={"test_loss": 2.3}), {"iterations": 4, "divergence_factor": 0})
    assert rep.cause == Cause.CRITERION_MET
    # without the untrained model's value there is no reference: the first reported value is none
    assert train(ReplayEngine(stream), {"iterations": 4}).cause == Cause.CRITERION_MET


def test_learning_rate_far_too_high_diverges(digits, tmp_path: Path) -> None:
    """lr=1e6: the losses stay finite but explode; the run must not read as a success."""
    rep = train(_local(digits, lr=1e6), {"iterations": 5}, save_path=tmp_path / "m.pt")
    assert rep.cause == Cause.DIVERGED and rep.iterations == 1 and not rep.ok
    assert "test_loss" in rep.detail and rep.model_path is None


# --------------------------------------------------------------------------------------- engine failures
class _Breaks(ReplayEngine):
    def __init__(self, at: int, **kw) -> None:
        super().__init__(_acc([0.1] * 10), **kw)
        self.at = at

    def iterate(self) -> IterationEvent:
        if self.calls + 1 == self.at:
            raise RuntimeError("GPU fell off the bus")
        return super().iterate()


def test_engine_failure_during_training_has_a_cause(tmp_path: Path) -> None:
    eng = _Breaks(at=3)
    states: list[ProcessState] = []
    rep = train(eng, {"iterations": 8}, save_path=tmp_path / "m.pt", on_state=lambda s, p, r: states.append(s))
    assert rep.cause == Cause.ENGINE_FAILURE and rep.status == ProcessState.FAILED
    assert rep.exit_code == EXIT_CODES[Cause.ENGINE_FAILURE] != 0
    assert "RuntimeError: GPU fell off the bus" in rep.detail and "iteration 3" in rep.detail
    assert rep.iterations == 2 and eng.saved == [str(tmp_path / "m.pt")] == [rep.model_path]
    assert eng.stopped and states[-1] == ProcessState.FAILED
    # failing at the first iteration: nothing to save
    eng = _Breaks(at=1)
    rep = train(eng, {"iterations": 8}, save_path=tmp_path / "m.pt")
    assert rep.cause == Cause.ENGINE_FAILURE and rep.model_path is None and eng.saved == []


class _Parts(ReplayEngine):
    """An engine of parts that end on their own: ``outcome`` says how, once ``save`` has gathered them."""

    def __init__(self) -> None:
        super().__init__(_acc([0.1, 0.2, 0.3, 0.4]))
        self.ended = "still training"

    def save(self, path: str) -> str:
        self.ended = "east FINISHED CRITERION_MET after 3 iterations"
        return super().save(path)

    def outcome(self) -> str:
        return self.ended


def test_report_says_how_the_engine_parts_ended_whichever_criterion_fired(tmp_path: Path) -> None:
    """The process's own criterion can fire before an engine's parts are seen to end (a chain whose
    producers stop at the same iteration): the report still names how each part ended, read after the
    engine saved, and an outcome already in the detail is not repeated."""
    rep = train(_Parts(), {"iterations": 3}, save_path=tmp_path / "m.pt")
    assert rep.cause == Cause.CRITERION_MET and rep.detail.startswith("iterations met at iteration 3")
    assert rep.detail.endswith("; east FINISHED CRITERION_MET after 3 iterations")
    eng = _Parts()
    eng.ended = "iterations met"
    assert train(eng, {"iterations": 3}).detail.count("iterations met") == 1


def test_engine_error_before_training_is_raised() -> None:
    class NoStart(ReplayEngine):
        def start(self) -> None:
            raise DataError("dataset missing")

    with pytest.raises(DataError, match="dataset missing"):
        train(NoStart(_acc([0.1])), {"iterations": 1})


# --------------------------------------------------------------------------------------- refused data
def test_refused_data_is_recorded_and_the_process_keeps_waiting() -> None:
    class Picky(ReplayEngine):
        def __init__(self) -> None:
            super().__init__([{"anomaly": "INADEQUATE_TRAINING_DATA"}, *_acc([0.5, 0.6])])

        def check_data(self, data) -> None:
            if data == "bad":
                raise DataError("labels are NaN")

    eng = Picky()
    proc = TrainingProcess(eng, {"iterations": 2, "data_wait_s": 20})

    def feeder():
        while proc.state != ProcessState.AWAITING_DATA:
            time.sleep(0.01)
        proc.add_data("bad")
        while not proc.data_refused:
            time.sleep(0.01)
        assert proc.state == ProcessState.AWAITING_DATA
        assert proc.progress_status()["data_refused"] == ["add_data: labels are NaN"]
        proc.add_data("good")

    t = threading.Thread(target=feeder)
    t.start()
    rep = proc.run()
    t.join()
    assert rep.cause == Cause.CRITERION_MET and eng.data == ["good"] and rep.awaited_data == 1
    assert rep.data_refused == ["add_data: labels are NaN"]


def test_bad_inbox_files_are_rejected_with_a_reason(digits, tmp_path: Path) -> None:
    X, y = digits.X_train, digits.y_train
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, X=np.zeros((10, 5)), y=np.zeros(10))
    good = tmp_path / "good.npz"
    np.savez(good, X=X[50:300], y=y[50:300])
    eng = LocalTrainer.from_arrays(X[:50], y[:50], digits.X_test, digits.y_test, num_classes=10, hidden=(16,),
                       min_samples=200)
    box = inbox_mod.inbox_of(tmp_path)

    def on_state(state, proc, report):
        if state == ProcessState.AWAITING_DATA:
            inbox_mod.put(tmp_path, wrong)
            (box / "00000000000000000001-1.npz").write_bytes(b"not a zip file")  # corrupted after queueing
            inbox_mod.put(tmp_path, good)

    rep = train(eng, {"iterations": 2, "data_wait_s": 20}, inbox=box, on_state=on_state)
    assert rep.cause == Cause.CRITERION_MET and eng.num_samples == 300
    rejected = sorted((box / "rejected").glob("*.npz"))
    assert len(rejected) == 2 and len(list((box / "consumed").glob("*.npz"))) == 1
    reasons = [Path(f"{f}.reason.txt").read_text() for f in rejected]
    assert any("not a readable .npz" in r for r in reasons) and any("5 features" in r for r in reasons)
    assert len(rep.data_refused) == 2


# --------------------------------------------------------------------------------------- live status
def test_progress_status_is_live() -> None:
    seen: list[dict] = []
    eng = ReplayEngine(_rising(30), seconds_per_iteration=0.5)
    rep = train(eng, {"iterations": 30, "performance": {"accuracy": 0.9}}, clock=eng.clock,
                on_event=lambda ev, p: seen.append(p.progress_status()))
    assert [s["iterations"] for s in seen] == list(range(1, 31))
    last = seen[-1]
    assert last["status"] == "RUNNING" and last["progressStateInfo"] == "TRAINING"
    assert last["elapsed_s"] == pytest.approx(15.0)
    assert last["metrics"]["test_accuracy"] == pytest.approx(0.95 - 0.5 / 30**0.5)
    assert last["estimated_remaining_iterations"] == pytest.approx(70, rel=0.1)
    assert last["estimated_remaining_s"] == pytest.approx(35, rel=0.1)
    # progress: the way to the first criterion expected to fire, here the 30-iteration budget
    assert last["progress_percent"] == 100.0 and seen[14]["progress_percent"] == pytest.approx(50.0)
    assert seen[14]["progressPercentage"] == int(seen[14]["progress_percent"])
    assert "expected in" in last["estimate_note"] and "the budget ends training" in last["estimate_note"]
    assert seen[0]["estimated_remaining_iterations"] is None and seen[0]["estimate_note"]
    json.dumps(last, allow_nan=False)
    assert rep.cause == Cause.BUDGET_EXHAUSTED
