"""The training process: drives any :class:`sluice.engine.Engine` under termination parameters.

Loop, one engine iteration at a time::

    apply parameter updates → honour cancel/suspend → event = engine.iterate()
    → anomaly? (DIVERGED; INADEQUATE_TRAINING_DATA → wait for data, resume)
    → monitor.observe(event, time, resources) → stop now, or go on

The monitor is asked after *every* iteration and the loop ends at once when it answers, so no iteration
runs after a criterion holds. Only the engine protocol is used; optional engine capabilities are
duck-typed: ``num_samples``, ``num_layers``, ``probe(k) -> seconds per iteration``
(without changing the model), ``set_trainable_layers(l)``, ``limit_samples(n)``, ``check_data(data)``
(a :class:`DataError` refuses the data; the process records why and goes on waiting) and ``evaluate()``
(metrics of the untrained model: the initial losses the divergence check compares with).
An engine that hands training on to other producers offers ``delegate(termination, requirements, model)``:
it is called before training and after every parameter update with what is in force.

The parameters are checked against the metrics the engine declares when the process is built and on
every :meth:`TrainingProcess.update` (:func:`sluice.control.monitor.check_criteria`).

Causes (``TrainingReport.cause``; the state in brackets):

* ``CRITERION_MET`` (FINISHED): a result was reached — a performance target, the training error
  threshold or every performance requirement — or the parameters name no result at all and a budget
  (iterations, training time, a resource, a plateau) ended training: then the budget *is* the request;
* ``BUDGET_EXHAUSTED`` (FINISHED, not ``ok``): a budget ended training while a result target of the
  termination parameters was set and not reached; the model so far is saved and the report estimates
  what reaching the target would still take;
* ``PERFORMANCE_NOT_MET`` (FAILED): training ended with a performance requirement not met (R2);
* ``DIVERGED`` (FAILED): a non-finite metric, a divergence bound passed or a loss blown up (no model);
* ``ENGINE_FAILURE`` (FAILED): the engine raised an error during training; the detail holds it and the
  model so far is saved when there is one;
* ``CANCELLED``, ``INADEQUATE_TRAINING_DATA``, ``INSUFFICIENT_TRAINING_SAMPLES``, ``INSUFFICIENT_COMPUTE``.

Training time is active time: time spent suspended or waiting for data is not counted.

Checkpoints: with ``checkpoint_every = k`` the process calls ``on_checkpoint(process)`` after every k-th
iteration that training goes on from (never after the one that ends it); the callback takes the engine's
``checkpoint()`` and the process's :meth:`TrainingProcess.checkpoint`. A new process over a new engine
restores both (``engine.restore(...)``, :meth:`TrainingProcess.restore`) before :meth:`TrainingProcess.run`
and goes on from that iteration as the first one would have: same iteration count, active training time,
criteria state (streaks, plateau bests, loss references) and estimates, no second preflight.
An event whose ``anomaly`` is ``INADEQUATE_TRAINING_DATA`` did not train and is not counted as an
iteration.

The clients' parts an event lists (``IterationEvent.clients``) add up into the report's ``clients``
(:class:`sluice.control.clients.ClientTally`), checkpointed with the rest.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sluice.control import inbox as _inbox
from sluice.control.clients import ClientTally
from sluice.control.eta import Estimate, Estimator
from sluice.control.feasibility import Feasibility, check_compute, preflight
from sluice.control.monitor import Anomaly, Firing, Monitor, Observation
from sluice.control.params import (
    Cause,
    ModelIdentity,
    ProcessState,
    Requirements,
    Termination,
    parse_requirements,
    parse_termination,
    spec_of,
)
from sluice.control.report import TrainingReport, json_ready
from sluice.control.resources import ResourceSampler
from sluice.engine import Engine, IterationEvent
from sluice.errors import ConfigError, DataError
from sluice.metrics import MetricSpec

INADEQUATE = Cause.INADEQUATE_TRAINING_DATA.value
_STATE = {Cause.CRITERION_MET: ProcessState.FINISHED, Cause.BUDGET_EXHAUSTED: ProcessState.FINISHED,
          Cause.CANCELLED: ProcessState.CANCELLED}
"""State a process ends in for each cause; every other cause is FAILED."""

EventCallback = Callable[[IterationEvent, "TrainingProcess"], None]
StateCallback = Callable[[ProcessState, "TrainingProcess", "TrainingReport | None"], None]
DataProvider = Callable[[TrainingReport], Any]


def goal_of(
    termination: Termination, requirements: Requirements | None, error_metric: str,
    specs: Mapping[str, MetricSpec] | None = None,
) -> tuple[str, float, str, int] | None:
    """The result training aims at, as ``(metric, target, mode, patience)``: the first performance target
    of the termination parameters, else of the requirements, else the training error threshold. The
    target to reach is the threshold passed by its ``min_delta``; ``mode`` comes from the metric's spec in
    ``specs`` (the engine's declared metrics; default: Sluice's known metrics)."""
    if termination.performance:
        m, c = next(iter(termination.performance.items()))
        mode = spec_of(m, specs).mode
        return m, c.threshold + (c.min_delta if mode == "max" else -c.min_delta), mode, c.patience
    if requirements is not None and requirements.performance:
        m, v = next(iter(requirements.performance.items()))
        return m, v, spec_of(m, specs).mode, 1
    if termination.training_error is not None:
        c = termination.training_error
        return error_metric, c.threshold - c.min_delta, "min", c.patience
    return None


class _EngineFailed(Exception):
    """The engine raised ``error`` during training."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


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
        checkpoint_every: int = 0,
        on_checkpoint: Callable[[TrainingProcess], None] | None = None,
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
        if checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be >= 0 (0: no checkpoints), got {checkpoint_every}")
        self.checkpoint_every, self.on_checkpoint = int(checkpoint_every), on_checkpoint

        self.monitor = Monitor(self.termination, self.requirements, self.model, engine.metrics,
                               counts_bytes=engine.counts_bytes, reporter=type(engine).__name__)
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
        self.data_refused: list[str] = []
        self.clients = ClientTally()  # each client's part, from the events of a federated engine
        self._paused = 0.0
        self._elapsed0 = 0.0
        self.data_taken = 0
        self.resumed_from: int | None = None
        self.report: TrainingReport | None = None
        self.past_iterations: tuple[int, ...] = ()
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
            m = self.monitor
            if not Monitor(t or self.termination, r or self.requirements, self.model, m.specs,
                           counts_bytes=m.counts_bytes, reporter=m.reporter).rules:
                raise ConfigError("the updated parameters leave no termination criterion")
            self._pending = (t, r)
            self._cv.notify_all()

    def use_history(self, iterations: Sequence[int]) -> None:
        """The iterations at which past runs of the same job shape met a target at least as strict as this
        run's (:meth:`sluice.control.history.RunHistory.matching`): the estimate of the remaining iterations
        learns from them (three or more)."""
        self.past_iterations = tuple(int(v) for v in iterations)
        self.estimator.set_past(self.past_iterations)

    def add_data(self, data: Any) -> None:
        """Hand the engine more training data (used when the process is AWAITING_DATA, or at the next
        iteration otherwise)."""
        with self._cv:
            self._data.append(data)
            self._cv.notify_all()

    # ----------------------------------------------------------------------------------- status
    def estimate(self) -> Estimate:
        """Progress and remaining iterations/time now (100 % once the process ended with its request met, or
        from the iteration whose criterion ends it so: the last event's record says what the report says)."""
        if self.report is not None:
            reached = self.report.cause == Cause.CRITERION_MET
        else:
            reached = isinstance(self.decision, Firing) and self._cause_of(self.decision)[0] == Cause.CRITERION_MET
        return self.estimator.estimate(self.n, self.elapsed_s, reached=reached)

    def estimate_record(self) -> dict[str, Any]:
        """The estimate as a ``metrics.jsonl`` line carries it: ``remaining_iterations`` with
        ``remaining_iterations_low`` / ``_high`` (the 80 % interval), ``reach_probability`` and
        ``progress_percent``; ``remaining_reason`` says why when there is no estimate."""
        e = self.estimate()
        out = {"remaining_iterations": e.remaining_iterations, "remaining_iterations_low": e.remaining_low,
               "remaining_iterations_high": e.remaining_high, "reach_probability": e.reach_probability,
               "remaining_s": e.remaining_s, "remaining_s_low": e.remaining_s_low,
               "remaining_s_high": e.remaining_s_high, "progress_percent": e.progress_percent}
        return out if e.remaining_iterations is not None else {**out, "remaining_reason": e.note}

    def progress_status(self) -> dict[str, Any]:
        """Live status: the TS 28.105 ``ProcessMonitor`` fields (``status``, ``progressPercentage``,
        ``progressStateInfo``, ``resultStateInfo``) plus iterations done, active training time, the latest
        metrics, progress, the current estimates of what remains and the ids of the clients of a federated
        engine taking part (``participating_clients``: sampled at least once, and uploaded the last time)
        (JSON-ready)."""
        e = self.estimate()
        return json_ready({
            "status": self.state.value,
            "progressPercentage": None if e.progress_percent is None else int(e.progress_percent),
            "progressStateInfo": {"RUNNING": "TRAINING"}.get(self.state.value, self.state.value),
            "resultStateInfo": self.report.cause.value if self.report else (
                INADEQUATE if self.state == ProcessState.AWAITING_DATA else ""),
            "iterations": self.n,
            "elapsed_s": self.elapsed_s,
            "metrics": dict(self.latest),
            "progress_percent": e.progress_percent,
            "estimated_remaining_iterations": e.remaining_iterations,
            "estimated_remaining_iterations_low": e.remaining_low,
            "estimated_remaining_iterations_high": e.remaining_high,
            "reach_probability": e.reach_probability,
            "estimated_remaining_s": e.remaining_s,
            "estimated_remaining_s_low": e.remaining_s_low,
            "estimated_remaining_s_high": e.remaining_s_high,
            "estimate_note": e.note,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "data_refused": list(self.data_refused),
            "participating_clients": self.clients.participating(),
        })

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
        specs = self.monitor.specs
        goal = goal_of(t, r, self.monitor.error_metric, specs)
        times = [x for x in (t.training_time_s, r.max_training_time_s if r else None) if x]
        est = Estimator(
            metric=goal[0] if goal else None, target=goal[1] if goal else None,
            mode=goal[2] if goal else "max", patience=goal[3] if goal else 1, iteration_budget=t.iterations,
            time_budget_s=min(times) if times else None,
            bounds=(specs[goal[0]].low, specs[goal[0]].high) if goal else (None, None),
            past=getattr(self, "past_iterations", ()),
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
            self.data_taken += len(data)
        for d in data:
            self._give_data(d, "add_data")
        if pending is None:
            return
        t, r = pending
        if r is not None:
            self.requirements = r
        if t is not None:
            self.termination = t
        self.monitor.update(self.termination, self.requirements)
        self.estimator = self._make_estimator()
        self._delegate()

    def _delegate(self) -> None:
        """Hand the parameters in force to an engine that passes them on (a chain of producers)."""
        delegate = getattr(self.engine, "delegate", None)
        if delegate is not None:
            delegate(self.termination, self.requirements, self.model)

    def _wait_while_suspended(self) -> None:
        with self._cv:
            if not self._suspend or self._cancel:
                return
        self._engine_call(self.engine.suspend)
        self._set_state(ProcessState.SUSPENDED)
        t0 = self.clock()
        with self._cv:
            while self._suspend and not self._cancel:
                self._cv.wait(0.5)
        self._paused += self.clock() - t0
        self._engine_call(self.engine.resume)
        self._set_state(ProcessState.RUNNING)

    def _engine_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the engine; an error it raises becomes :class:`_EngineFailed`."""
        try:
            return fn(*args)
        except Exception as exc:
            raise _EngineFailed(exc) from exc

    def _give_data(self, data: Any, source: str) -> bool:
        """Hand ``data`` to the engine after its ``check_data``; a :class:`DataError` refuses it: the reason
        is recorded in :attr:`data_refused` and False returned."""
        check = getattr(self.engine, "check_data", None)
        try:
            if check is not None:
                check(data)
            self.engine.add_data(data)
        except DataError as exc:
            self.data_refused.append(f"{source}: {exc}")
            return False
        except Exception as exc:
            raise _EngineFailed(exc) from exc
        return True

    def _take_data(self, interim: TrainingReport, asked: bool) -> bool | None:
        """Hand the engine the next data on offer: True = taken, False = refused, None = none on offer."""
        with self._cv:
            data = self._data.pop(0) if self._data else None
            self.data_taken += data is not None
        if data is not None:
            return self._give_data(data, "add_data")
        f = _inbox.oldest(self.inbox) if self.inbox is not None else None
        if f is not None:
            try:
                got = _inbox.load_arrays(f)
                got = self.inbox_adapter(got) if self.inbox_adapter else got
            except DataError as exc:
                self.data_refused.append(f"inbox {f.name}: {exc}")
                _inbox.settle(f, str(exc))
                return False
            taken = self._give_data(got, f"inbox {f.name}")
            _inbox.settle(f, None if taken else self.data_refused[-1])
            return taken
        if self.data_provider is not None and not asked:
            data = self.data_provider(interim)
            if data is not None:
                return self._give_data(data, "data provider")
        return None

    def _await_data(self, event: IterationEvent) -> bool:
        """AWAITING_DATA: wait for :meth:`add_data`, the inbox or the data provider; True = data came.
        Data the engine refuses is recorded and the wait goes on."""
        interim = self._report(Cause.INADEQUATE_TRAINING_DATA, event.detail or "the engine needs more data",
                               ProcessState.AWAITING_DATA)
        self._engine_call(self.engine.suspend)
        self._set_state(ProcessState.AWAITING_DATA, interim)
        t0 = self.clock()
        deadline = time.monotonic() + self.termination.data_wait_s
        asked = False
        taken = False
        while True:
            got = self._take_data(interim, asked)
            asked = True
            if got is not None:
                taken = got
                if taken:
                    break
                continue
            if self._cancel:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with self._cv:
                self._cv.wait(min(0.2, left))
        self._paused += self.clock() - t0
        if not taken:
            return False
        self._engine_call(self.engine.resume)
        self.awaited += 1
        self._set_state(ProcessState.RUNNING)
        return True

    def _preflight(self) -> Feasibility:
        can_wait = self.termination.data_wait_s > 0 or self.data_provider is not None
        return preflight(self.engine, self.requirements, self._expected_iterations(), self.probe_iterations,
                         wait_for_data=can_wait)

    def _expected_iterations(self) -> int | None:
        if self.expected_iterations is not None:
            return self.expected_iterations
        if goal_of(self.termination, self.requirements, self.monitor.error_metric, self.monitor.specs) is None:
            return self.termination.iterations
        return None

    def _report(self, cause: Cause, detail: str, state: ProcessState, firing: Firing | None = None,
                model_path: str | None = None) -> TrainingReport:
        e = self.estimator.estimate(self.n, self.elapsed_s, reached=cause == Cause.CRITERION_MET)
        return TrainingReport(
            cause=cause, status=state, criterion=firing, detail=detail, model=self.model,
            performance=dict(self.latest), termination=self.termination, requirements=self.requirements,
            requirements_met=self._requirements_met(),
            duration_s=self.elapsed_s, iterations=self.n, progress_percent=e.progress_percent,
            estimated_remaining_s=e.remaining_s, estimated_remaining_iterations=e.remaining_iterations,
            estimated_remaining_iterations_low=e.remaining_low, estimated_remaining_iterations_high=e.remaining_high,
            reach_probability=e.reach_probability, estimated_remaining_s_low=e.remaining_s_low,
            estimated_remaining_s_high=e.remaining_s_high, estimate_note=e.note, model_path=model_path,
            bytes_up=self.bytes_up, bytes_down=self.bytes_down,
            resources_peak=dict(self.peak), awaited_data=self.awaited, data_refused=list(self.data_refused),
            clients=self.clients.reports(), data=self._data_report(), notes=self.notes(),
        )

    def notes(self) -> list[str]:
        """The engine's ``notes()`` (an engine may have none)."""
        fn = getattr(self.engine, "notes", None)
        return list(fn()) if callable(fn) else []

    def _data_report(self) -> dict[str, Any]:
        """The engine's ``data_report()`` (an engine may have none)."""
        fn = getattr(self.engine, "data_report", None)
        return dict(fn()) if callable(fn) else {}

    def _requirements_met(self) -> bool | None:
        return self.requirements.met_by(self.latest, self.monitor.specs) if self.requirements else None

    def _cause_of(self, d: Firing) -> tuple[Cause, str]:
        """The cause when rule ``d`` ended training (see the module docstring)."""
        r = self.requirements
        if r is not None and self._requirements_met() is False:
            unmet = ", ".join(f"{k} {self.latest.get(k, float('nan')):.4g} (needs {v:g})"
                              for k, v in r.performance.items())
            return Cause.PERFORMANCE_NOT_MET, f"{d.rule} ended training; performance requirement not met: {unmet}"
        if d.success or not self.termination.defines_result():
            seen = "; ".join(f"{h.metric} {h.observed:.6g} against {h.threshold:g}" for h in d.hits
                             if h.metric and h.observed is not None and h.threshold is not None)
            return Cause.CRITERION_MET, f"{d.rule} met at iteration {self.n}" + (f" ({seen})" if seen else "")
        goal = goal_of(self.termination, None, self.monitor.error_metric, self.monitor.specs)
        where = ""
        if goal is not None:
            got = self.latest.get(goal[0])
            where = f": {goal[0]} is {'n/a' if got is None else f'{got:.4g}'}, the target {goal[1]:g}"
        return Cause.BUDGET_EXHAUSTED, (f"{d.rule} ended training at iteration {self.n} before the result "
                                        f"was reached{where}")

    def _finish(self, cause: Cause, detail: str, firing: Firing | None = None) -> TrainingReport:
        model_path = None
        if self.save_path and self.n > 0 and cause not in (
            Cause.DIVERGED, Cause.INSUFFICIENT_COMPUTE, Cause.INSUFFICIENT_TRAINING_SAMPLES
        ):
            try:
                model_path = str(self.engine.save(self.save_path))
            except Exception as exc:
                if cause != Cause.ENGINE_FAILURE:
                    raise
                detail += f"; the model so far could not be saved: {type(exc).__name__}: {exc}"
        outcome = getattr(self.engine, "outcome", None)  # optional: how the engine's parts ended
        told = outcome() if callable(outcome) else ""
        if told and told not in detail:
            detail += f"; {told}"
        state = _STATE.get(cause, ProcessState.FAILED)
        self.report = self._report(cause, detail, state, firing, model_path)
        self._set_state(state, self.report)
        return self.report

    # ----------------------------------------------------------------------------------- checkpoint
    def checkpoint(self) -> dict[str, Any]:
        """The process's own state after the last iteration as plain dicts and lists (``json.dumps`` keeps
        its floats exact, NaN and infinities included): iterations done, active training time, the latest
        metrics and their history, byte and resource counts, data taken (``data_taken``: items given by
        :meth:`add_data`) and refused, and the criteria state (:meth:`sluice.control.monitor.Monitor.state`)."""
        return {
            "n": self.n, "elapsed_s": self.elapsed_s, "latest": dict(self.latest),
            "history": [[n, dict(m), dt] for n, m, dt in self.history], "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down, "peak": dict(self.peak), "awaited": self.awaited,
            "data_refused": list(self.data_refused), "data_taken": self.data_taken, "monitor": self.monitor.state(),
            "clients": self.clients.state(),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Go on from :meth:`checkpoint` (before :meth:`run`, with the engine restored from the checkpoint
        taken with it). The termination parameters and requirements are this process's own: criteria they
        share with the checkpointed ones keep their state."""
        if self.state != ProcessState.NOT_STARTED:
            raise ConfigError(f"a checkpoint is restored before the process runs (state {self.state.value})")
        try:
            self.n = int(state["n"])
            self._elapsed0 = self.elapsed_s = float(state["elapsed_s"])
            self.latest = {str(k): float(v) for k, v in state["latest"].items()}
            self.history = [(int(n), {str(k): float(v) for k, v in m.items()}, float(dt))
                            for n, m, dt in state["history"]]
            self.bytes_up, self.bytes_down = int(state["bytes_up"]), int(state["bytes_down"])
            self.peak = {str(k): float(v) for k, v in state["peak"].items()}
            self.awaited, self.data_taken = int(state["awaited"]), int(state["data_taken"])
            self.data_refused = [str(x) for x in state["data_refused"]]
            self.monitor.load_state(state["monitor"])
            self.clients.load_state(state.get("clients", []))  # none in a checkpoint made before it was kept
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"not a training process checkpoint: {type(exc).__name__}: {exc}") from None
        self.estimator = self._make_estimator()
        self.resumed_from = self.n

    # ----------------------------------------------------------------------------------- run
    def run(self) -> TrainingReport:
        """Train until a criterion fires, an anomaly occurs, the engine fails or the process is cancelled;
        return the report. Errors before training (engine start, preflight) are raised; an error the engine
        raises during training ends the process with cause ``ENGINE_FAILURE``."""
        if self.state != ProcessState.NOT_STARTED:
            raise ConfigError(f"this training process already ran (state {self.state.value})")
        self._delegate()
        self.engine.start()
        try:
            return self._run()
        finally:
            try:
                self.engine.stop()
            except Exception:
                if self.report is None or self.report.cause != Cause.ENGINE_FAILURE:
                    raise

    def _run(self) -> TrainingReport:
        if self.resumed_from is None:  # a resumed process passed its preflight before the checkpoint
            verdict = self._preflight()
            if not verdict.feasible:
                assert verdict.cause is not None
                return self._finish(verdict.cause, verdict.detail)
        self._set_state(ProcessState.RUNNING)
        try:
            return self._train()
        except _EngineFailed as exc:
            err = exc.error
            return self._finish(Cause.ENGINE_FAILURE, f"the engine failed at iteration {self.n + 1}: "
                                f"{type(err).__name__}: {err}")

    def _train(self) -> TrainingReport:
        evaluate = getattr(self.engine, "evaluate", None)
        if evaluate is not None and self.resumed_from is None:  # the untrained model's losses: what
            self.monitor.set_reference(self._engine_call(evaluate))  # divergence_factor compares with
        t_start = self.clock() - self._elapsed0
        self._paused = 0.0
        probe_pending = (
            self.requirements is not None and self.requirements.max_training_time_s is not None
            and not hasattr(self.engine, "probe") and self.n <= self.probe_iterations
        )
        while True:
            self._apply_pending()
            self._wait_while_suspended()
            if self._cancel:
                return self._finish(Cause.CANCELLED, f"cancelled after {self.n} iterations")
            t0 = self.clock()
            event = self._engine_call(self.engine.iterate)
            dt = self.clock() - t0
            self.bytes_up += int(event.bytes_up)
            self.bytes_down += int(event.bytes_down)
            if event.anomaly == INADEQUATE:
                self.elapsed_s = self.clock() - t_start - self._paused
                if self._await_data(event):
                    continue
                return self._no_data(event)
            self._count(event, dt, t_start)
            if self.on_event is not None:
                self.on_event(event, self)
            d = self.decision
            if isinstance(d, Anomaly):
                return self._finish(d.cause, d.detail)
            if isinstance(d, Firing):
                cause, why = self._cause_of(d)
                return self._finish(cause, why, d)
            if probe_pending and self.n >= self.probe_iterations:
                probe_pending = False
                assert self.requirements is not None
                v = check_compute(self.requirements, self.elapsed_s / self.n, self._expected_iterations())
                if not v.feasible:
                    assert v.cause is not None
                    return self._finish(v.cause, v.detail + f" (measured over the first {self.n} iterations)")
            if self.on_checkpoint is not None and self.checkpoint_every and self.n % self.checkpoint_every == 0:
                self.on_checkpoint(self)

    def _no_data(self, event: IterationEvent) -> TrainingReport:
        """The end of a run whose engine found its data inadequate and got none while it waited."""
        if self._cancel:
            return self._finish(Cause.CANCELLED, f"cancelled while awaiting data after {self.n} iterations")
        return self._finish(Cause.INADEQUATE_TRAINING_DATA, event.detail or "inadequate training data")

    def _count(self, event: IterationEvent, dt: float, t_start: float) -> None:
        """Take iteration ``n + 1``'s event: its metrics, clients, estimate, the resources and peaks, the
        elapsed time, and the decision (an anomaly the engine reports, else the monitor's)."""
        self.n += 1
        metrics = {k: float(v) for k, v in event.metrics.items()}
        self.latest.update(metrics)
        self.history.append((self.n, metrics, dt))
        self.clients.add(self.n, event.clients)
        self.estimator.add(self.n, metrics, dt)
        self.resources = dict(self.sampler.sample()) if self.sampler is not None else {}
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
            self.decision = self.monitor.observe(Observation(self.n, metrics, self.elapsed_s, self.resources))


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
