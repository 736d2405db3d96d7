"""Each termination criterion fires at exactly the right iteration on scripted metric streams, and the
engine is never asked for an iteration after that."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.control import Cause, ModelIdentity, ReplayEngine, TrainingProcess, train
from sluice.metrics import MetricSpec


def _run(stream, termination, **kw):
    eng = ReplayEngine(stream, seconds_per_iteration=kw.pop("spi", 1.0), metrics=kw.pop("metrics", ()))
    rep = train(eng, termination, clock=eng.clock, **kw)
    return eng, rep


def _acc(values):
    return [{"test_accuracy": v, "train_loss": 1 - v} for v in values]


def _assert_stopped_at(eng, rep, n, rule):
    assert rep.iterations == n
    assert eng.calls == n, "the engine ran an iteration after the criterion held"
    assert rep.fired == rule
    assert rep.criterion is not None and rep.criterion.iteration == n


def test_iterations_fire_at_count() -> None:
    eng, rep = _run(_acc([0.1] * 20), {"iterations": 7})
    _assert_stopped_at(eng, rep, 7, "iterations")
    assert rep.cause == Cause.CRITERION_MET
    assert rep.criterion.hits[0].observed == 7


def test_training_time_fires_when_limit_reached() -> None:
    # 0.75 s per iteration: 2.25 s after 3, 3.0 s after 4 -> a 3 s limit fires at iteration 4
    eng, rep = _run(_acc([0.1] * 20), {"training_time_s": 3.0}, spi=0.75)
    _assert_stopped_at(eng, rep, 4, "training_time_s")
    assert rep.duration_s == pytest.approx(3.0)


def test_training_error_defaults_to_train_loss() -> None:
    stream = [{"train_loss": v} for v in (0.9, 0.5, 0.31, 0.3, 0.2)]
    eng, rep = _run(stream, {"training_error": 0.3})
    _assert_stopped_at(eng, rep, 4, "training_error")
    assert rep.criterion.hits[0].observed == 0.3


def test_training_error_follows_model_type() -> None:
    """For coverage problem analysis the training error is the coverage error (T4)."""
    stream = [{"train_loss": 0.01, "coverage_error": v} for v in (0.4, 0.2, 0.09, 0.05)]
    model = ModelIdentity(id="cov", type="coverage_problem_analysis")
    eng, rep = _run(stream, {"training_error": 0.1}, model=model)
    _assert_stopped_at(eng, rep, 3, "training_error")
    eng, rep = _run(stream, {"training_error": 0.1, "error_metric": "train_loss"}, model=model)
    _assert_stopped_at(eng, rep, 1, "training_error")


@pytest.mark.parametrize("metric", ["accuracy", "precision", "recall", "f1"])
def test_each_performance_target(metric: str) -> None:
    values = [0.5, 0.7, 0.79, 0.81, 0.9]
    stream = [{f"test_{metric}": v, "test_accuracy": 0.0 if metric != "accuracy" else v} for v in values]
    eng, rep = _run(stream, {"performance": {metric: 0.8}})
    _assert_stopped_at(eng, rep, 4, f"performance.test_{metric}")


def test_several_targets_any_of() -> None:
    stream = [{"test_accuracy": a, "test_f1": f} for a, f in [(0.5, 0.5), (0.6, 0.72), (0.9, 0.9)]]
    eng, rep = _run(stream, {"performance": {"accuracy": 0.85, "f1": 0.7}})
    _assert_stopped_at(eng, rep, 2, "performance.test_f1")


def test_metric_declared_by_the_engine() -> None:
    """A metric Sluice does not know is a target once the engine declares it, with its direction."""
    stream = [{"mean_reward": v} for v in (-3.0, -1.0, 2.0, 5.0)]
    reward = MetricSpec("mean_reward", True)
    eng, rep = _run(stream, {"performance": {"mean_reward": 1.5}}, metrics=[reward])
    _assert_stopped_at(eng, rep, 3, "performance.mean_reward")
    # the same name declared as a metric to minimise: the target holds at the first value ≤ 1.5
    eng, rep = _run(stream, {"performance": {"mean_reward": 1.5}}, metrics=[MetricSpec("mean_reward", False)])
    _assert_stopped_at(eng, rep, 1, "performance.mean_reward")


def test_min_delta_is_a_margin() -> None:
    eng, rep = _run(_acc([0.5, 0.80, 0.805, 0.82, 0.9]), {"performance": {"accuracy": {"threshold": 0.8,
                                                                                      "min_delta": 0.01}}})
    _assert_stopped_at(eng, rep, 4, "performance.test_accuracy")


def test_patience_needs_consecutive_holds() -> None:
    # holds at 2, breaks at 3, holds at 4, 5, 6 -> patience 3 fires at 6
    vals = [0.5, 0.85, 0.7, 0.86, 0.87, 0.88, 0.9]
    eng, rep = _run(_acc(vals), {"performance": {"accuracy": {"threshold": 0.8, "patience": 3}}})
    _assert_stopped_at(eng, rep, 6, "performance.test_accuracy")


def test_warmup_ignores_early_iterations() -> None:
    vals = [0.9, 0.9, 0.9, 0.5, 0.95]
    eng, rep = _run(_acc(vals), {"performance": {"accuracy": {"threshold": 0.8, "warmup": 3}}})
    _assert_stopped_at(eng, rep, 5, "performance.test_accuracy")
    # warm-up and patience together: checks start at iteration 2, two consecutive holds needed
    eng, rep = _run(_acc([0.9, 0.9, 0.9, 0.9]), {"performance": {"accuracy": {"threshold": 0.8, "warmup": 1,
                                                                               "patience": 2}}})
    _assert_stopped_at(eng, rep, 3, "performance.test_accuracy")


def test_plateau_fires_after_patience_without_improvement() -> None:
    losses = [1.0, 0.8, 0.7, 0.695, 0.71, 0.692, 0.6, 0.6, 0.6, 0.6]
    stream = [{"test_loss": v} for v in losses]
    # improvements > 0.01 at 1, 2, 3; none at 4, 5, 6 (best stays 0.7) -> fires at 6
    eng, rep = _run(stream, {"plateau": {"test_loss": {"min_delta": 0.01, "patience": 3}}})
    _assert_stopped_at(eng, rep, 6, "plateau.test_loss")
    eng, rep = _run(stream, {"plateau": {"test_loss": {"min_delta": 0.0, "patience": 3}}})
    _assert_stopped_at(eng, rep, 10, "plateau.test_loss")


class FakeSampler:
    """Scripted resource samples, one per iteration."""

    def __init__(self, rows: list[dict[str, float]]) -> None:
        self.rows = rows
        self.i = -1

    def sample(self, force: bool = False) -> dict[str, float]:
        if force:
            return dict(self.rows[0])
        self.i += 1
        return dict(self.rows[self.i])


@pytest.mark.parametrize(
    ("resource", "values", "threshold", "expect"),
    [
        ("cpu_percent", [10, 50, 95, 99], 90.0, 3),
        ("memory_percent", [10, 20, 30, 40], 30.0, 3),
        ("memory_bytes", [1e6, 2e6, 3e6, 4e6], 2e6, 2),
        ("storage_bytes", [0, 0, 5e5, 2e6], 1e6, 4),
    ],
)
def test_resource_thresholds(resource: str, values: list[float], threshold: float, expect: int) -> None:
    sampler = FakeSampler([{resource: float(v)} for v in values])
    eng, rep = _run(_acc([0.1] * 4), {"resources": {resource: threshold}}, sampler=sampler)
    _assert_stopped_at(eng, rep, expect, f"resources.{resource}")
    assert rep.resources_peak[resource] == pytest.approx(values[expect - 1])


def test_resource_patience_sustained_load() -> None:
    sampler = FakeSampler([{"cpu_percent": v} for v in (95, 20, 95, 96, 97, 10)])
    eng, rep = _run(_acc([0.1] * 6), {"resources": {"cpu_percent": {"threshold": 90, "patience": 3}}},
                    sampler=sampler)
    _assert_stopped_at(eng, rep, 5, "resources.cpu_percent")


def test_network_bytes_from_engine_events() -> None:
    stream = [{"metrics": {"x": 1.0}, "bytes_up": 300, "bytes_down": 100} for _ in range(10)]
    eng, rep = _run(stream, {"resources": {"network_bytes": 1500}})
    _assert_stopped_at(eng, rep, 4, "resources.network_bytes")  # 400, 800, 1200, 1600
    assert (rep.bytes_up, rep.bytes_down) == (1200, 400)


def test_all_of_group_needs_every_criterion_at_once() -> None:
    vals = [0.9, 0.91, 0.5, 0.6, 0.92, 0.93]
    term = {"all_of": [{"name": "good_and_long", "iterations": 4, "performance": {"accuracy": 0.9}}]}
    eng, rep = _run(_acc(vals), term)
    _assert_stopped_at(eng, rep, 5, "good_and_long")
    assert {h.name for h in rep.criterion.hits} == {"good_and_long.iterations",
                                                    "good_and_long.performance.test_accuracy"}
    # OR of the group with a plain budget: the budget fires first
    eng, rep = _run(_acc(vals), {**term, "iterations": 3})
    _assert_stopped_at(eng, rep, 3, "iterations")


def test_simultaneous_rules_prefer_the_result() -> None:
    eng, rep = _run(_acc([0.1, 0.2, 0.95]), {"iterations": 3, "performance": {"accuracy": 0.9}})
    _assert_stopped_at(eng, rep, 3, "performance.test_accuracy")
    assert rep.criterion.also == ["iterations"]
    assert rep.progress_percent == 100.0 and rep.estimated_remaining_iterations == 0


def test_metric_missing_on_some_iterations() -> None:
    """Metrics evaluated only every few iterations: criteria wait; patience counts evaluations."""
    stream = [{"train_loss": 1.0}, {"train_loss": 0.9, "test_accuracy": 0.85}, {"train_loss": 0.8},
              {"train_loss": 0.7, "test_accuracy": 0.86}, {"train_loss": 0.6}]
    eng, rep = _run(stream, {"performance": {"accuracy": {"threshold": 0.8, "patience": 2}}})
    _assert_stopped_at(eng, rep, 4, "performance.test_accuracy")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_metric_is_divergence(bad: float) -> None:
    stream = [{"train_loss": 1.0}, {"train_loss": 0.9}, {"train_loss": bad}, {"train_loss": 0.1}]
    eng, rep = _run(stream, {"iterations": 10})
    assert rep.cause == Cause.DIVERGED and rep.iterations == 3 and eng.calls == 3
    assert rep.criterion is None and "train_loss" in rep.detail


def test_divergence_bound_and_engine_anomaly() -> None:
    stream = [{"train_loss": v} for v in (1.0, 2.0, 12.0, 0.1)]
    eng, rep = _run(stream, {"iterations": 10, "divergence": {"train_loss": 10}})
    assert rep.cause == Cause.DIVERGED and eng.calls == 3
    stream = [{"train_loss": 1.0}, {"train_loss": 1.0, "anomaly": "DIVERGED", "detail": "exploding"}]
    eng, rep = _run(stream, {"iterations": 10})
    assert rep.cause == Cause.DIVERGED and rep.detail == "exploding" and eng.calls == 2
    # check_finite = false: NaN is then only "not evaluable"
    stream = [{"train_loss": math.nan}, {"train_loss": 0.1}]
    eng, rep = _run(stream, {"training_error": 0.2, "check_finite": False})
    _assert_stopped_at(eng, rep, 2, "training_error")


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.floats(0, 1, allow_nan=False), min_size=1, max_size=40),
    threshold=st.floats(0, 1, allow_nan=False),
    patience=st.integers(1, 4),
    warmup=st.integers(0, 5),
    budget=st.integers(1, 45),
)
def test_first_firing_matches_brute_force(values, threshold, patience, warmup, budget) -> None:
    """Against a direct scan of the stream: the process stops at the first qualifying iteration."""
    expect_perf = None
    streak = 0
    for i, v in enumerate(values, start=1):
        streak = streak + 1 if (i > warmup and v >= threshold) else 0
        if streak >= patience:
            expect_perf = i
            break
    limit = min(budget, len(values))
    term = {"iterations": limit,
            "performance": {"accuracy": {"threshold": threshold, "patience": patience, "warmup": warmup}}}
    eng, rep = _run(_acc(values), term)
    expect = limit if expect_perf is None else min(expect_perf, limit)
    assert rep.iterations == expect == eng.calls
    if expect_perf is not None and expect_perf <= limit:
        assert rep.fired == "performance.test_accuracy"
    else:
        assert rep.fired == "iterations"


def test_update_takes_effect_at_next_iteration() -> None:
    """New parameters sent after iteration 3 apply from iteration 4 on."""
    eng = ReplayEngine(_acc([0.5, 0.6, 0.7, 0.8, 0.85, 0.9]))

    def on_event(ev, proc: TrainingProcess) -> None:
        if proc.n == 3:
            proc.update({"performance": {"accuracy": 0.6}})

    rep = train(eng, {"iterations": 6}, on_event=on_event, clock=eng.clock)
    # the new target already holds at iteration 3, but it only counts from iteration 4
    _assert_stopped_at(eng, rep, 4, "performance.test_accuracy")


def test_update_keeps_state_of_unchanged_criteria() -> None:
    eng = ReplayEngine(_acc([0.9] * 8))

    def on_event(ev, proc: TrainingProcess) -> None:
        if proc.n == 2:
            proc.update({"iterations": 50})

    term = {"iterations": 100, "performance": {"accuracy": {"threshold": 0.8, "patience": 4}}}
    rep = train(eng, term, on_event=on_event, clock=eng.clock)
    _assert_stopped_at(eng, rep, 4, "performance.test_accuracy")


def test_replay_a_recorded_run(tmp_path) -> None:
    """What-if: replay a run's metrics.jsonl under other termination parameters."""
    from sluice.engine import IterationEvent
    from sluice.runs import History, RunDir

    hist = History("round")
    with RunDir(tmp_path) as run:
        for r, acc in enumerate([0.2, 0.5, 0.7, 0.8, 0.9], start=1):
            run.log(hist.add(IterationEvent(iteration=r, metrics={"test_accuracy": acc}, bytes_up=10,
                                            bytes_down=5, seconds=0.5)))
    eng = ReplayEngine.from_run(tmp_path)
    rep = train(eng, {"performance": {"accuracy": 0.75}, "iterations": 5}, clock=eng.clock)
    _assert_stopped_at(eng, rep, 4, "performance.test_accuracy")
    assert set(rep.performance) == {"test_accuracy"}
    assert (rep.bytes_up, rep.bytes_down, rep.duration_s) == (40, 20, 2.0)


def test_successive_updates_accumulate_and_empty_update_is_refused() -> None:
    eng = ReplayEngine(_acc([0.5, 0.6, 0.7, 0.8, 0.9, 0.95]))

    def on_event(ev, proc: TrainingProcess) -> None:
        if proc.n == 1:
            proc.update({"performance": {"accuracy": 0.85}})
            proc.update(requirements={"performance": {"accuracy": 0.99}, "stop_when_met": False})
            with pytest.raises(Exception, match="unknown metric 'test_f1'"):
                proc.update(requirements={"performance": {"f1": 0.1}})
            with pytest.raises(Exception, match="no termination criterion"):
                proc.update({"iterations": None, "performance": None})

    rep = train(eng, {"iterations": 6}, on_event=on_event, clock=eng.clock)
    _assert_stopped_at(eng, rep, 5, "performance.test_accuracy")
    assert rep.requirements_met is False  # the requirement update took effect too
