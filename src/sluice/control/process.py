"""The training process: drives any :class:`sluice.engine.Engine` under termination parameters.

Loop, one engine iteration at a time::

    apply parameter updates → honour cancel/suspend → event = engine.iterate()
    → anomaly? (DIVERGED; INADEQUATE_TRAINING_DATA → wait for data, resume)
    → monitor.observe(event, time, resources) → stop now, or go on

The monitor is asked after *every* iteration and the loop ends at once when it answers, so no iteration
runs after a criterion holds. Only the engine protocol is used; optional engine capabilities are
duck-typed: ``num_samples``, ``num_layers``, ``metric_names``, ``probe(k) -> seconds per iteration``
(without changing the model), ``set_trainable_layers(l)``, ``limit_samples(n)``.

Training time is active time: time spent suspended or waiting for data is not counted.
An event whose ``anomaly`` is ``INADEQUATE_TRAINING_DATA`` did not train and is not counted as an
iteration.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sluice.control import inbox as _inbox
from sluice.control.eta import Estimate, Estimator
from sluice.control.feasibility import Feasibility, check_compute, check_data, check_layers
from sluice.control.monitor import Anomaly, Firing, Monitor, Observation
from sluice.control.params import (
    Cause,
    ModelIdentity,
    ProcessState,
    Requirements,
    Termination,
    metric_mode,
    metric_range,
    parse_requirements,
    parse_termination,
)
from sluice.control.report import TrainingReport
from sluice.control.resources import ResourceSampler
from sluice.engine import Engine, IterationEvent
from sluice.errors import ConfigError

INADEQUATE = Cause.INADEQUATE_TRAINING_DATA.value

EventCallback = Callable[[IterationEvent, "TrainingProcess"], None]
StateCallback = Callable[[ProcessState, "TrainingProcess", "TrainingReport | None"], None]
DataProvider = Callable[[TrainingReport], Any]


def goal_of(
    termination: Termination, requirements: Requirements | None, error_metric: str
) -> tuple[str, float, str, int] | None:
    """The result training aims at, as ``(metric, target, mode, patience)``: the first performance target
    of the termination parameters, else of the requirements, else the training error threshold. The
    target to reach is the threshold passed by its ``min_delta``."""
    if termination.performance:
        m, c = next(iter(termination.performance.items()))
        mode = metric_mode(m)
        return m, c.threshold + (c.min_delta if mode == "max" else -c.min_delta), mode, c.patience
    if requirements is not None and requirements.performance:
        m, v = next(iter(requirements.performance.items()))
        return m, v, metric_mode(m), 1
    if termination.training_error is not None:
        c = termination.training_error
        return error_metric, c.threshold - c.min_delta, "min", c.patience
    return None


class TrainingProcess:
    """One training run of one engine under termination parameters and requirements.

    Thread-safe controls (call from any thread or from ``on_event``): :meth:`cancel`, :meth:`suspend`,
    :meth:`resume`, :meth:`update`, :meth:`add_data`. Updates take effect at the next iteration.
    """

    def __init__(
        self,
        engine: Engine,
        termination: Termination | dict[str, Any] | None = None,
        requirements: Requirements | dict[str, Any] | None = None,
        model: ModelIdentity | None = None,
        *,
        on_event: EventCallback | None = None,
        on_state: StateCallback | None = None,
        save_path: str | Path | None = None,
        sampler: ResourceSampler | None = None,
        data_provider: DataProvider | None = None,
        inbox: str | Path | None = None,
        inbox_adapter: Callable[[dict[str, Any]], Any] | None = None,
        expected_iterations: int | None = None,
        probe_iterations: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not isinstance(engine, Engine):
            raise ConfigError(f"{type(engine).__name__} does not implement the engine protocol "
                              "(start, iterate, stop, suspend, resume, add_data, save)")
        self.engine = engine
        self.termination = parse_termination(termination)
        self.requirements = parse_requirements(requirements) if requirements is not None else None
        self.model = model or ModelIdentity()
        self.on_event, self.on_state = on_event, on_state
        self.save_path = None if save_path is None else str(save_path)
        self.data_provider = data_provider
        self.inbox = None if inbox is None else Path(inbox)
        self.inbox_adapter = inbox_adapter
        self.expected_iterations = expected_iterations
        self.probe_iterations = max(1, probe_iterations)
        self.clock = clock

        self.monitor = Monitor(self.termination, self.requirements, self.model)
        if not self.monitor.rules:
            raise ConfigError(
                "no termination criterion: give at least one of termination.iterations, training_time_s, "
                "training_error, performance, plateau, resources, all_of, or requirements.performance / "
                "max_training_time_s"
            )
        self.sampler = sampler
        if self.sampler is None and self.monitor.resources_watched - {"network_bytes"}:
            self.sampler = ResourceSampler()
        self._check_resources()

        self.state = ProcessState.NOT_STARTED
        self.n = 0
        self.elapsed_s = 0.0
        self.latest: dict[str, float] = {}
        self.history: list[tuple[int, dict[str, float], float]] = []
        self.resources: dict[str, float] = {}
        self.peak: dict[str, float] = {}
        self.bytes_up = self.bytes_down = 0
        self.decision: Firing | Anomaly | None = None
        self.awaited = 0
        self._paused = 0.0
        self.report: TrainingReport | None = None
        self.estimator = self._make_estimator()

        self._cv = threading.Condition()
        self._cancel = False
        self._suspend = False
        self._pending: tuple[Termination | None, Requirements | None] | None = None
        self._data: list[Any] = []

    # ----------------------------------------------------------------------------------- controls
    def cancel(self) -> None:
        """Stop after the current iteration with cause CANCELLED."""
        with self._cv:
            self._cancel = True
            self._cv.notify_all()

    def suspend(self) -> None:
        """Pause after the current iteration until :meth:`resume`."""
        with self._cv:
            self._suspend = True
            self._cv.notify_all()

    def resume(self) -> None:
        with self._cv:
            self._suspend = False
            self._cv.notify_all()

    def update(
        self,
        termination: Termination | dict[str, Any] | None = None,
        requirements: Requirements | dict[str, Any] | None = None,
    ) -> None:
        """New parameters while training runs; a dict is merged into the current ones (JSON merge patch).
        They take effect at the next iteration."""
        with self._cv:
            prev_t, prev_r = self._pending or (None, None)
            base_t = prev_t or self.termination
            t = base_t.merged(termination) if isinstance(termination, dict) else termination
            t = parse_termination(t) if t is not None else prev_t
            r = parse_requirements(requirements) if requirements is not None else prev_r
            if not Monitor(t or self.termination, r or self.requirements, self.model).rules:
                raise ConfigError("the updated parameters leave no termination criterion")
            self._pending = (t, r)
            self._cv.notify_all()

    def add_data(self, data: Any) -> None:
        """Hand the engine more training data (used when the process is AWAITING_DATA, or at the next
        iteration otherwise)."""
        with self._cv:
            self._data.append(data)
            self._cv.notify_all()

    # ----------------------------------------------------------------------------------- status
    def estimate(self) -> Estimate:
        """Progress and remaining iterations/time now."""
        reached = isinstance(self.decision, Firing) and self.decision.success
        return self.estimator.estimate(self.n, self.elapsed_s, reached=reached)

    def progress_status(self) -> dict[str, Any]:
        """TS 28.105 ``ProcessMonitor`` of this process."""
        e = self.estimate()
        return {
            "status": self.state.value,
            "progressPercentage": None if e.progress_percent is None else int(e.progress_percent),
            "progressStateInfo": {"RUNNING": "TRAINING"}.get(self.state.value, self.state.value),
            "resultStateInfo": self.report.cause.value if self.report else "",
        }

    # ----------------------------------------------------------------------------------- internals
    def _check_resources(self) -> None:
        watched = self.monitor.resources_watched - {"network_bytes"}
        if not watched:
            return
        assert self.sampler is not None
        have = set(self.sampler.sample(force=True))
        missing = sorted(watched - have)
        if missing:
            raise ConfigError(f"resource thresholds {missing} cannot be measured here; measurable: "
                              f"{sorted(have | {'network_bytes'})}")

    def _make_estimator(self) -> Estimator:
        t, r = self.termination, self.requirements
        goal = goal_of(t, r, self.monitor.error_metric)
        times = [x for x in (t.training_time_s, r.max_training_time_s if r else None) if x]
        est = Estimator(
            metric=goal[0] if goal else None, target=goal[1] if goal else None,
            mode=goal[2] if goal else "max", patience=goal[3] if goal else 1, iteration_budget=t.iterations,
            time_budget_s=min(times) if times else None,
            bounds=metric_range(goal[0]) if goal else (None, None),
        )
        for n, metrics, secs in getattr(self, "history", []):
            est.add(n, metrics, secs)
        return est

    def _set_state(self, state: ProcessState, report: TrainingReport | None = None) -> None:
        self.state = state
        if self.on_state is not None:
            self.on_state(state, self, report)

    def _apply_pending(self) -> None:
        with self._cv:
            pending, self._pending = self._pending, None
            data, self._data = self._data, []
        for d in data:
            self.engine.add_data(d)
        if pending is None:
            return
        t, r = pending
        if r is not None:
            self.requirements = r
        if t is not None:
            self.termination = t
        self.monitor.update(self.termination, self.requirements)
        self.estimator = self._make_estimator()

    def _wait_while_suspended(self) -> None:
        with self._cv:
            if not self._suspend or self._cancel:
                return
        self.engine.suspend()
        self._set_state(ProcessState.SUSPENDED)
        t0 = self.clock()
        with self._cv:
            while self._suspend and not self._cancel:
                self._cv.wait(0.5)
        self._paused += self.clock() - t0
        self.engine.resume()
        self._set_state(ProcessState.RUNNING)

    def _take_data(self, interim: TrainingReport, asked: bool) -> Any:
        with self._cv:
            if self._data:
                return self._data.pop(0)
        if self.inbox is not None:
            got = _inbox.take(self.inbox)
            if got is not None:
                return self.inbox_adapter(got) if self.inbox_adapter else got
        if self.data_provider is not None and not asked:
            return self.data_provider(interim)
        return None

    def _await_data(self, event: IterationEvent) -> bool:
        """AWAITING_DATA: wait for :meth:`add_data`, the inbox or the data provider; True = data came."""
        interim = self._report(Cause.INADEQUATE_TRAINING_DATA, event.detail or "the engine needs more data",
                               ProcessState.AWAITING_DATA)
        self.engine.suspend()
        self._set_state(ProcessState.AWAITING_DATA, interim)
        t0 = self.clock()
        deadline = time.monotonic() + self.termination.data_wait_s
        asked = False
        data = None
        while True:
            data = self._take_data(interim, asked)
            asked = True
            if data is not None or self._cancel:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with self._cv:
                self._cv.wait(min(0.2, left))
        self._paused += self.clock() - t0
        if data is None:
            return False
        self.engine.add_data(data)
        self.engine.resume()
        self.awaited += 1
        self._set_state(ProcessState.RUNNING)
        return True

    def _preflight(self) -> Feasibility:
        r = self.requirements
        eng = self.engine
        if r is None:
            return Feasibility.ok()
        check_layers(r, getattr(eng, "num_layers", None) if r.layers is not None else None)
        verdict = check_data(r, getattr(eng, "num_samples", None))
        if not verdict.feasible:
            return verdict
        if r.layers is not None:
            if not hasattr(eng, "set_trainable_layers"):
                raise ConfigError(
                    f"{type(eng).__name__} cannot restrict training to the last {r.layers} layers"
                )
            eng.set_trainable_layers(r.layers)
        if verdict.samples_to_use is not None and hasattr(eng, "limit_samples"):
            eng.limit_samples(verdict.samples_to_use)
        if r.max_training_time_s is not None and hasattr(eng, "probe"):
            spi = float(eng.probe(self.probe_iterations))
            return check_compute(r, spi, self._expected_iterations())
        return Feasibility.ok()

    def _expected_iterations(self) -> int | None:
        if self.expected_iterations is not None:
            return self.expected_iterations
        if goal_of(self.termination, self.requirements, self.monitor.error_metric) is None:
            return self.termination.iterations
        return None

    def _validate_metrics(self) -> None:
        names = getattr(self.engine, "metric_names", None)
        if names is None:
            return
        unknown = sorted(self.monitor.metrics_watched - set(names))
        if unknown:
            raise ConfigError(
                f"criteria refer to metrics {unknown} that {type(self.engine).__name__} does not "
                f"report; it reports: {', '.join(sorted(names))}"
            )

    def _report(self, cause: Cause, detail: str, state: ProcessState, firing: Firing | None = None,
                model_path: str | None = None) -> TrainingReport:
        reached = firing is not None and firing.success and cause == Cause.CRITERION_MET
        e = self.estimator.estimate(self.n, self.elapsed_s, reached=reached)
        return TrainingReport(
            cause=cause, status=state, criterion=firing, detail=detail, model=self.model,
            performance=dict(self.latest),
            requirements_met=self.requirements.met_by(self.latest) if self.requirements else None,
            duration_s=self.elapsed_s, iterations=self.n, progress_percent=e.progress_percent,
            estimated_remaining_s=e.remaining_s, estimated_remaining_iterations=e.remaining_iterations,
            estimate_note=e.note, model_path=model_path, bytes_up=self.bytes_up, bytes_down=self.bytes_down,
            resources_peak=dict(self.peak), awaited_data=self.awaited,
        )

    def _finish(self, cause: Cause, detail: str, firing: Firing | None = None) -> TrainingReport:
        model_path = None
        if self.save_path and self.n > 0 and cause not in (
            Cause.DIVERGED, Cause.INSUFFICIENT_COMPUTE, Cause.INSUFFICIENT_TRAINING_SAMPLES
        ):
            model_path = str(self.engine.save(self.save_path))
        state = {Cause.CRITERION_MET: ProcessState.FINISHED, Cause.CANCELLED: ProcessState.CANCELLED}.get(
            cause, ProcessState.FAILED
        )
        self.report = self._report(cause, detail, state, firing, model_path)
        self._set_state(state, self.report)
        return self.report

    # ----------------------------------------------------------------------------------- run
    def run(self) -> TrainingReport:
        """Train until a criterion fires, an anomaly occurs or the process is cancelled; return the report."""
        if self.state != ProcessState.NOT_STARTED:
            raise ConfigError(f"this training process already ran (state {self.state.value})")
        self._validate_metrics()
        self.engine.start()
        try:
            return self._run()
        finally:
            self.engine.stop()

    def _run(self) -> TrainingReport:
        verdict = self._preflight()
        if not verdict.feasible:
            assert verdict.cause is not None
            return self._finish(verdict.cause, verdict.detail)
        self._set_state(ProcessState.RUNNING)
        t_start = self.clock()
        self._paused = 0.0
        probe_pending = (
            self.requirements is not None and self.requirements.max_training_time_s is not None
            and not hasattr(self.engine, "probe")
        )
        while True:
            self._apply_pending()
            self._wait_while_suspended()
            if self._cancel:
                return self._finish(Cause.CANCELLED, f"cancelled after {self.n} iterations")
            t0 = self.clock()
            event = self.engine.iterate()
            dt = self.clock() - t0
            self.bytes_up += int(event.bytes_up)
            self.bytes_down += int(event.bytes_down)
            if event.anomaly == INADEQUATE:
                self.elapsed_s = self.clock() - t_start - self._paused
                if self._await_data(event):
                    continue
                if self._cancel:
                    return self._finish(Cause.CANCELLED, f"cancelled while awaiting data after {self.n} "
                                        "iterations")
                detail = event.detail or "inadequate training data"
                return self._finish(Cause.INADEQUATE_TRAINING_DATA, detail)
            self.n += 1
            metrics = {k: float(v) for k, v in event.metrics.items()}
            self.latest.update(metrics)
            self.history.append((self.n, metrics, dt))
            self.estimator.add(self.n, metrics, dt)
            if self.sampler is not None:
                self.resources = dict(self.sampler.sample())
            else:
                self.resources = {}
            self.resources["network_bytes"] = float(self.bytes_up + self.bytes_down)
            for k, v in self.resources.items():
                if v > self.peak.get(k, 0.0):
                    self.peak[k] = v
            self.elapsed_s = self.clock() - t_start - self._paused
            if event.anomaly:
                known = event.anomaly in Cause._value2member_map_
                cause = Cause(event.anomaly) if known else Cause.DIVERGED
                self.decision = Anomaly(cause, event.detail or event.anomaly, self.n)
            else:
                self.decision = self.monitor.observe(
                    Observation(self.n, metrics, self.elapsed_s, self.resources)
                )
            if self.on_event is not None:
                self.on_event(event, self)
            d = self.decision
            if isinstance(d, Anomaly):
                return self._finish(d.cause, d.detail)
            if isinstance(d, Firing):
                met = self.requirements.met_by(self.latest) if self.requirements else None
                if met is False:
                    unmet = ", ".join(f"{k} {self.latest.get(k, float('nan')):.4g} (needs {v:g})"
                                      for k, v in self.requirements.performance.items())  # type: ignore[union-attr]
                    why = f"{d.rule} ended training; performance requirement not met: {unmet}"
                    return self._finish(Cause.PERFORMANCE_NOT_MET, why, d)
                return self._finish(Cause.CRITERION_MET, f"{d.rule} met at iteration {self.n}", d)
            if probe_pending and self.n >= self.probe_iterations:
                probe_pending = False
                assert self.requirements is not None
                v = check_compute(self.requirements, self.elapsed_s / self.n, self._expected_iterations())
                if not v.feasible:
                    assert v.cause is not None
                    return self._finish(v.cause, v.detail + f" (measured over the first {self.n} iterations)")


def train(
    engine: Engine,
    termination: Termination | dict[str, Any] | None = None,
    requirements: Requirements | dict[str, Any] | None = None,
    model: ModelIdentity | None = None,
    **kwargs: Any,
) -> TrainingReport:
    """Train ``engine`` under ``termination`` and ``requirements``; return the :class:`TrainingReport`.

    Keyword arguments are those of :class:`TrainingProcess` (``on_event``, ``save_path``, ...).
    """
    return TrainingProcess(engine, termination, requirements, model, **kwargs).run()
