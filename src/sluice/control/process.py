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
from collections.abc import Mapping, Sequence
from typing import Any

from sluice.control._intake import DataIntake, EngineFailed, engine_call
from sluice.control._outcome import cause_of, estimator_for, expected_iterations, goal_of
from sluice.control._process_state import (
    INADEQUATE,
    checkpoint_of,
    engine_notes,
    estimate_line,
    report_of,
    restore_into,
    status_of,
)
from sluice.control.clients import ClientTally
from sluice.control.eta import Estimate
from sluice.control.feasibility import check_compute, preflight
from sluice.control.monitor import Anomaly, Firing, Monitor, Observation
from sluice.control.params import (
    Cause,
    ModelIdentity,
    ProcessState,
    Requirements,
    Termination,
    parse_requirements,
    parse_termination,
)
from sluice.control.process_options import ProcessHooks, ProcessOptions, sampler_for, split_keywords
from sluice.control.report import TrainingReport
from sluice.engine import Engine, IterationEvent
from sluice.errors import ConfigError

__all__ = ["ProcessHooks", "ProcessOptions", "TrainingProcess", "goal_of", "make_process", "train"]

_STATE = {Cause.CRITERION_MET: ProcessState.FINISHED, Cause.BUDGET_EXHAUSTED: ProcessState.FINISHED,
          Cause.CANCELLED: ProcessState.CANCELLED}
"""State a process ends in for each cause; every other cause is FAILED."""


def _measures_compute(requirements: Requirements | None, engine: Engine) -> bool:
    """Whether the compute requirement is checked on the first iterations trained: the requirements bound the
    training time and the engine has no ``probe`` that the preflight could measure it with."""
    return requirements is not None and requirements.max_training_time_s is not None and not hasattr(engine, "probe")


class TrainingProcess:
    """One training run of one engine under termination parameters and requirements.

    Thread-safe controls (call from any thread or from ``on_event``): :meth:`cancel`, :meth:`suspend`,
    :meth:`resume`, :meth:`update`, :meth:`add_data`. Updates take effect at the next iteration.
    ``hooks`` (:class:`ProcessHooks`: none by default) and ``options`` (:class:`ProcessOptions`) are kept as
    the process's attributes (``on_event``, ``on_state``, ``save_path``, ``sampler``, ``clock``...), the
    data sources in :attr:`intake` (:class:`~sluice.control._intake.DataIntake`); :func:`make_process` takes
    their fields as keyword arguments.
    """

    def __init__(
        self,
        engine: Engine,
        termination: Termination | dict[str, Any] | None = None,
        requirements: Requirements | dict[str, Any] | None = None,
        model: ModelIdentity | None = None,
        *,
        hooks: ProcessHooks | None = None,
        options: ProcessOptions | None = None,
    ) -> None:
        if not isinstance(engine, Engine):
            raise ConfigError(f"{type(engine).__name__} does not implement the engine protocol "
                              "(start, iterate, stop, suspend, resume, add_data, save)")
        hooks, options = hooks or ProcessHooks(), options or ProcessOptions()
        self.engine = engine
        self.termination = parse_termination(termination)
        self.requirements = parse_requirements(requirements) if requirements is not None else None
        self.model = model or ModelIdentity()
        self.on_event, self.on_state = hooks.on_event, hooks.on_state
        self.save_path = None if options.save_path is None else str(options.save_path)
        self.expected_iterations = options.expected_iterations
        self.probe_iterations = max(1, options.probe_iterations)
        self.clock = options.clock
        if hooks.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be >= 0 (0: no checkpoints), got {hooks.checkpoint_every}")
        self.checkpoint_every, self.on_checkpoint = int(hooks.checkpoint_every), hooks.on_checkpoint

        self.monitor = Monitor(self.termination, self.requirements, self.model, engine.metrics,
                               counts_bytes=engine.counts_bytes, reporter=type(engine).__name__)
        if not self.monitor.rules:
            raise ConfigError(
                "no termination criterion: give at least one of termination.iterations, training_time_s, "
                "training_error, performance, plateau, resources, all_of, or requirements.performance / "
                "max_training_time_s"
            )
        self.sampler = sampler_for(options.sampler, self.monitor.resources_watched)

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
        self.clients = ClientTally()  # each client's part, from the events of a federated engine
        self._paused = 0.0
        self.resumed_from: int | None = None
        self.report: TrainingReport | None = None
        self.past_iterations: tuple[int, ...] = ()
        self.estimator = estimator_for(self.termination, self.requirements, self.monitor)

        self._cv = threading.Condition()
        self._cancel = False
        self._suspend = False
        self._pending: tuple[Termination | None, Requirements | None] | None = None
        self.intake = DataIntake(engine, self._cv, options.inbox, options.inbox_adapter, options.data_provider)

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
        self.intake.add(data)

    @property
    def data_refused(self) -> list[str]:
        """Why the engine refused each piece of data it was offered (``"<source>: <reason>"``)."""
        return self.intake.refused

    @property
    def data_taken(self) -> int:
        """How many items given by :meth:`add_data` the process has taken (and handed to the engine)."""
        return self.intake.taken

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
        return estimate_line(self.estimate())

    def progress_status(self) -> dict[str, Any]:
        """Live status: the TS 28.105 ``ProcessMonitor`` fields (``status``, ``progressPercentage``,
        ``progressStateInfo``, ``resultStateInfo``) plus iterations done, active training time, the latest
        metrics, progress, the current estimates of what remains and the ids of the clients of a federated
        engine taking part (``participating_clients``: sampled at least once, and uploaded the last time)
        (JSON-ready)."""
        return status_of(self, self.estimate())

    def notes(self) -> list[str]:
        """The engine's ``notes()`` (an engine may have none)."""
        return engine_notes(self.engine)

    # ----------------------------------------------------------------------------------- internals
    def _set_state(self, state: ProcessState, report: TrainingReport | None = None) -> None:
        self.state = state
        if self.on_state is not None:
            self.on_state(state, self, report)

    def _apply_pending(self) -> None:
        with self._cv:
            pending, self._pending = self._pending, None
            data = self.intake.drain()
        for d in data:
            self.intake.give(d, "add_data")
        if pending is None:
            return
        t, r = pending
        if r is not None:
            self.requirements = r
        if t is not None:
            self.termination = t
        self.monitor.update(self.termination, self.requirements)
        self.estimator = estimator_for(self.termination, self.requirements, self.monitor, self.past_iterations,
                                       self.history)
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
        engine_call(self.engine.suspend)
        self._set_state(ProcessState.SUSPENDED)
        t0 = self.clock()
        with self._cv:
            while self._suspend and not self._cancel:
                self._cv.wait(0.5)
        self._paused += self.clock() - t0
        engine_call(self.engine.resume)
        self._set_state(ProcessState.RUNNING)

    def _await_data(self, event: IterationEvent) -> bool:
        """AWAITING_DATA: wait for :meth:`add_data`, the inbox or the data provider; True = data came.
        Data the engine refuses is recorded and the wait goes on."""
        interim = report_of(self, Cause.INADEQUATE_TRAINING_DATA, event.detail or "the engine needs more data",
                            ProcessState.AWAITING_DATA)
        engine_call(self.engine.suspend)
        self._set_state(ProcessState.AWAITING_DATA, interim)
        t0 = self.clock()
        taken = self.intake.wait(interim, self.termination.data_wait_s, lambda: self._cancel)
        self._paused += self.clock() - t0
        if not taken:
            return False
        engine_call(self.engine.resume)
        self.awaited += 1
        self._set_state(ProcessState.RUNNING)
        return True

    def _cause_of(self, d: Firing) -> tuple[Cause, str]:
        """The cause when rule ``d`` ended training (see the module docstring)."""
        return cause_of(d, self.termination, self.requirements, self.latest, self.n, self.monitor)

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
        self.report = report_of(self, cause, detail, state, firing, model_path)
        self._set_state(state, self.report)
        return self.report

    # ----------------------------------------------------------------------------------- checkpoint
    def checkpoint(self) -> dict[str, Any]:
        """The process's own state after the last iteration as plain dicts and lists (``json.dumps`` keeps
        its floats exact, NaN and infinities included): iterations done, active training time, the latest
        metrics and their history, byte and resource counts, data taken (``data_taken``: items given by
        :meth:`add_data`) and refused, and the criteria state (:meth:`sluice.control.monitor.Monitor.state`)."""
        return checkpoint_of(self)

    def restore(self, state: Mapping[str, Any]) -> None:
        """Go on from :meth:`checkpoint` (before :meth:`run`, with the engine restored from the checkpoint
        taken with it). The termination parameters and requirements are this process's own: criteria they
        share with the checkpointed ones keep their state."""
        if self.state != ProcessState.NOT_STARTED:
            raise ConfigError(f"a checkpoint is restored before the process runs (state {self.state.value})")
        restore_into(self, state)
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
            can_wait = self.termination.data_wait_s > 0 or self.intake.provider is not None
            expected = expected_iterations(self.expected_iterations, self.termination, self.requirements, self.monitor)
            verdict = preflight(self.engine, self.requirements, expected, self.probe_iterations, wait_for_data=can_wait)
            if not verdict.feasible:
                assert verdict.cause is not None
                return self._finish(verdict.cause, verdict.detail)
        self._set_state(ProcessState.RUNNING)
        try:
            return self._train()
        except EngineFailed as exc:
            err = exc.error
            return self._finish(Cause.ENGINE_FAILURE, f"the engine failed at iteration {self.n + 1}: "
                                f"{type(err).__name__}: {err}")

    def _train(self) -> TrainingReport:
        evaluate = getattr(self.engine, "evaluate", None)
        if evaluate is not None and self.resumed_from is None:  # the untrained model's losses: what
            self.monitor.set_reference(engine_call(evaluate))  # divergence_factor compares with
        t_start = self.clock() - self.elapsed_s  # the active time a restored checkpoint had
        self._paused = 0.0
        probe_pending = _measures_compute(self.requirements, self.engine) and self.n <= self.probe_iterations
        while True:
            self._apply_pending()
            self._wait_while_suspended()
            if self._cancel:
                return self._finish(Cause.CANCELLED, f"cancelled after {self.n} iterations")
            t0 = self.clock()
            event = engine_call(self.engine.iterate)
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
                expected = expected_iterations(self.expected_iterations, self.termination, self.requirements,
                                               self.monitor)
                v = check_compute(self.requirements, self.elapsed_s / self.n, expected)
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


def make_process(
    engine: Engine,
    termination: Termination | dict[str, Any] | None = None,
    requirements: Requirements | dict[str, Any] | None = None,
    model: ModelIdentity | None = None,
    **kwargs: Any,
) -> TrainingProcess:
    """A :class:`TrainingProcess` whose hooks and options are given as keyword arguments: the fields of
    :class:`ProcessHooks` (``on_event``, ``on_state``, ``on_checkpoint``, ``checkpoint_every``) and of
    :class:`ProcessOptions` (``save_path``, ``sampler``, ``data_provider``, ``inbox``, ``inbox_adapter``,
    ``expected_iterations``, ``probe_iterations``, ``clock``), or ``hooks`` and ``options`` themselves
    (:func:`sluice.control.process_options.split_keywords`); any other keyword is a :class:`TypeError`."""
    hooks, options = split_keywords(kwargs)
    return TrainingProcess(engine, termination, requirements, model, hooks=hooks, options=options)


def train(
    engine: Engine,
    termination: Termination | dict[str, Any] | None = None,
    requirements: Requirements | dict[str, Any] | None = None,
    model: ModelIdentity | None = None,
    **kwargs: Any,
) -> TrainingReport:
    """Train ``engine`` under ``termination`` and ``requirements``; return the :class:`TrainingReport`.

    Keyword arguments are those of :func:`make_process` (``on_event``, ``save_path``, ...).
    """
    return make_process(engine, termination, requirements, model, **kwargs).run()
