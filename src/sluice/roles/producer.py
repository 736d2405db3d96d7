"""The producer side: decides or proposes parameters, judges feasibility, trains, retrains on triggers.

A :class:`Producer` owns an engine factory (one engine per model id, kept so that retraining continues
from the trained state), a :class:`ProducerPolicy` and a :class:`RunHistory` of past runs.

It decides parameters (T2 b/c) from requirements, model type and history as
:func:`sluice.control.policy.propose` says.

Triggers (T7): a consumer request (:meth:`Producer.start`, or :meth:`Producer.request` to wait for the
report), consumer feedback below a threshold (:meth:`Producer.feedback`) and updated training data
(:meth:`Producer.data_updated`); each answer says whether the request was accepted.

:meth:`Producer.start` negotiates, judges feasibility (:func:`sluice.control.feasibility.preflight`) and
returns a :class:`~sluice.roles.handles.ProcessHandle` at once, training in the background; a refused
request raises :class:`RequestRefused` carrying the answer. Every process is kept in the producer's
:class:`~sluice.roles.handles.ProcessRegistry`. One model trains in one process at a time: its engine
is shared by its runs, so a request for a model in training is refused (new data for it goes to the
running process).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from sluice.control.feasibility import Feasibility, preflight
from sluice.control.history import RunHistory, RunRecord, reached_of, target_of
from sluice.control.monitor import effective_error_metric
from sluice.control.params import (
    ModelIdentity,
    ProcessState,
    Requirements,
    Termination,
    resolve_metric,
    spec_of,
)
from sluice.control.policy import ProducerPolicy, Proposal, propose
from sluice.control.process import goal_of, make_process
from sluice.control.report import TrainingReport
from sluice.engine import Engine
from sluice.errors import NegotiationError, SluiceError
from sluice.roles import threegpp
from sluice.roles.handles import ProcessHandle, ProcessRegistry
from sluice.roles.negotiation import Agreement, DecidedBy, Review, negotiate

EngineFactory = Callable[[ModelIdentity, Requirements | None], Engine]
Trigger = Literal["CONSUMER_REQUEST", "CONSUMER_FEEDBACK", "DATA_UPDATED"]


class TrainingRequest(BaseModel):
    """What a consumer sends (3GPP ``MLTrainingRequest`` plus Sluice's termination parameters)."""

    model: ModelIdentity = Field(default_factory=ModelIdentity)
    requirements: Requirements | None = None
    termination: Termination | None = None
    decided_by: DecidedBy = "consumer"


class RequestResponse(BaseModel):
    """The producer's answer: accepted or not (with the reason), and the report when it trained."""

    producer: str
    accepted: bool
    reason: str = ""
    trigger: Trigger = "CONSUMER_REQUEST"
    agreement: Agreement | None = None
    report: TrainingReport | None = None

    process_id: str | None = None

    @property
    def request_status(self) -> str:
        """TS 28.105 ``RequestStatus`` of the request."""
        return threegpp.request_status(self.accepted, self.report.status if self.report else None)


class RequestRefused(NegotiationError):
    """A request the producer did not accept; :attr:`response` says why (with a report when feasibility
    failed)."""

    def __init__(self, response: RequestResponse) -> None:
        super().__init__(f"{response.producer} refused the request: {response.reason}")
        self.response = response


class Producer:
    """Trains models on request; see the module docstring for how it decides."""

    def __init__(
        self,
        name: str,
        engine_factory: EngineFactory,
        policy: ProducerPolicy | None = None,
        history: RunHistory | None = None,
        save_dir: str | Path | None = None,
        processes: ProcessRegistry | None = None,
    ) -> None:
        self.name = name
        self.engine_factory = engine_factory
        self.policy = policy or ProducerPolicy()
        self.history = history or RunHistory()
        self.save_dir = None if save_dir is None else Path(save_dir)
        self.processes = processes if processes is not None else ProcessRegistry()
        self.engines: dict[str, Engine] = {}
        self.models: dict[str, ModelIdentity] = {}
        self.agreements: dict[str, tuple[Termination, Requirements | None]] = {}
        self._busy: dict[str, ProcessHandle | None] = {}  # model id → its running process (None: reserved)
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ engines
    def engine_for(self, model: ModelIdentity, requirements: Requirements | None = None) -> Engine:
        """The engine that trains ``model`` (created on first use, kept for retraining)."""
        with self._lock:
            eng = self.engines.get(model.id)
            if eng is None:
                eng = self.engine_factory(model, requirements)
                self.engines[model.id] = eng
            return eng

    # ------------------------------------------------------------------ T2: decide / propose
    def propose(self, model: ModelIdentity, requirements: Requirements | None = None,
                shape: str | None = None) -> Proposal:
        """Termination parameters this producer would use, with the reason for each
        (:func:`sluice.control.policy.propose`)."""
        return propose(self.policy, self.history, model, requirements, shape)

    def decide(self, model: ModelIdentity, requirements: Requirements | None = None) -> Termination:
        """The producer decides the parameters itself (T2 b)."""
        return self.propose(model, requirements).termination

    # ------------------------------------------------------------------ R3: feasibility
    def assess(self, model: ModelIdentity, requirements: Requirements | None,
               termination: Termination | None = None, probe_iterations: int = 2,
               wait_for_data: bool | None = None) -> Feasibility:
        """Judge before training whether the requirements can be met here (refuse early if not); the
        model's engine is set up for them (:func:`sluice.control.feasibility.preflight`). Too few samples
        are awaited instead of refused when ``wait_for_data`` (default: the termination parameters wait
        for data, ``data_wait_s > 0``)."""
        if self.policy.supported_types is not None and model.type not in self.policy.supported_types:
            raise NegotiationError(f"{self.name} does not train models of type {model.type}; it serves "
                                   f"{', '.join(self.policy.supported_types)}")
        if requirements is None:
            return Feasibility.ok()
        eng = self.engine_for(model, requirements)
        eng.start()
        if wait_for_data is None:
            wait_for_data = termination is not None and termination.data_wait_s > 0
        return preflight(eng, requirements, self._expected_iterations(model, termination, requirements),
                         probe_iterations, wait_for_data=wait_for_data)

    def _expected_iterations(self, model: ModelIdentity, termination: Termination | None,
                             requirements: Requirements | None) -> int | None:
        """Iterations a past run of the model needed to reach what these parameters aim at, else the
        iteration budget when they aim at no result."""
        target = None if termination is None else target_of(termination, requirements, model)
        expected, _ = self.history.iterations_needed(model, target)
        if expected is None and termination is not None and goal_of(
            termination, requirements, effective_error_metric(termination, model)
        ) is None:
            expected = termination.iterations
        return expected

    # ------------------------------------------------------------------ processes
    def start(self, req: TrainingRequest, review: Review | None = None, **kwargs: Any) -> ProcessHandle:
        """A consumer's training request: negotiate, check feasibility and start training in the background.

        Returns the running process's handle at once (also in :attr:`processes`); raises
        :class:`RequestRefused` when the request is not accepted. Keyword arguments go to
        :func:`~sluice.control.process.make_process` (``on_event``, ``data_provider``...).
        """
        self._reserve(req.model)
        try:
            try:
                agreement = negotiate(self, req.model, req.requirements, mode=req.decided_by,
                                      termination=req.termination, review=review)
                can_wait = agreement.termination.data_wait_s > 0 or kwargs.get("data_provider") is not None
                verdict = self.assess(req.model, req.requirements, agreement.termination, wait_for_data=can_wait)
                if verdict.feasible:
                    return self._launch(req.model, agreement.termination, req.requirements, "CONSUMER_REQUEST",
                                        agreement, **kwargs)
            except RequestRefused:
                raise
            except SluiceError as exc:
                raise RequestRefused(RequestResponse(producer=self.name, accepted=False, reason=str(exc))) from exc
            assert verdict.cause is not None
            report = TrainingReport(cause=verdict.cause, status=ProcessState.FAILED, detail=verdict.detail,
                                    model=req.model)
            raise RequestRefused(RequestResponse(
                producer=self.name, accepted=False, reason=f"{verdict.cause}: {verdict.detail}",
                agreement=agreement, report=report,
            ))
        except BaseException:
            self._release(req.model.id)
            raise

    def process(self, process_id: str) -> ProcessHandle:
        """The process with this id (:class:`~sluice.roles.handles.UnknownProcessError` if none)."""
        return self.processes.get(process_id)

    def answer(self, handle: ProcessHandle, reason: str = "trained") -> RequestResponse:
        """Wait for ``handle`` to end and answer with its report; re-raises the error of a run that raised."""
        report = handle.wait()
        if handle.error is not None:
            raise handle.error
        return RequestResponse(producer=self.name, accepted=True, reason=reason,
                               trigger=handle.trigger,  # type: ignore[arg-type]
                               agreement=handle.agreement, report=report, process_id=handle.id)

    def _reserve(self, model: ModelIdentity) -> None:
        with self._lock:
            if model.id in self._busy:
                h = self._busy[model.id]
                which = f"process {h.id}" if h is not None else "another request"
                raise RequestRefused(RequestResponse(
                    producer=self.name, accepted=False,
                    reason=f"model {model.id!r} is being trained by {which}; wait for it or cancel it",
                ))
            self._busy[model.id] = None

    def _release(self, model_id: str) -> None:
        with self._lock:
            self._busy.pop(model_id, None)

    def _start_reserved(self, model: ModelIdentity, termination: Termination,
                        requirements: Requirements | None, trigger: Trigger, **kwargs: Any) -> ProcessHandle:
        self._reserve(model)
        try:
            return self._launch(model, termination, requirements, trigger, **kwargs)
        except BaseException:
            self._release(model.id)
            raise

    def _launch(self, model: ModelIdentity, termination: Termination, requirements: Requirements | None,
                trigger: Trigger, agreement: Agreement | None = None, **kwargs: Any) -> ProcessHandle:
        """Start a process for ``model`` (reserved by the caller); the run goes into the history."""
        eng = self.engine_for(model, requirements)
        save = None
        if self.save_dir is not None:
            save = self.save_dir / f"{model.id}-v{model.version}.pt"
        kwargs.setdefault("expected_iterations",
                          self.history.iterations_needed(model, target_of(termination, requirements, model))[0])
        proc = make_process(eng, termination, requirements, model, save_path=save, **kwargs)  # checks the metrics
        handle = ProcessHandle(proc, trigger=trigger, agreement=agreement, on_done=self._done)
        with self._lock:
            self._busy[model.id] = handle
            self.processes.add(handle)
        return handle.start()

    def _done(self, handle: ProcessHandle) -> None:
        report = handle.report
        assert report is not None
        model = handle.model
        with self._lock:
            try:
                self.models[model.id] = model
                self.agreements[model.id] = (handle.process.termination, handle.process.requirements)
                self.history.add(RunRecord(
                    model_id=model.id, model_type=model.type, version=model.version, cause=report.cause,
                    fired=report.fired, iterations=report.iterations, duration_s=report.duration_s,
                    performance=report.performance, trigger=handle.trigger, run_id=handle.id,
                    reached=reached_of(report.criterion),
                ))
            finally:
                self._busy.pop(model.id, None)

    # ------------------------------------------------------------------ blocking forms
    def train(
        self,
        model: ModelIdentity,
        termination: Termination,
        requirements: Requirements | None = None,
        *,
        trigger: Trigger = "CONSUMER_REQUEST",
        **kwargs: Any,
    ) -> TrainingReport:
        """Train ``model`` with agreed parameters and wait for the report; the run goes into the history."""
        handle = self._start_reserved(model, termination, requirements, trigger, **kwargs)
        report = self.answer(handle).report
        assert report is not None
        return report

    def request(self, req: TrainingRequest, review: Review | None = None, **kwargs: Any) -> RequestResponse:
        """:meth:`start`, then wait for the report; the answer says whether the request was accepted."""
        try:
            handle = self.start(req, review, **kwargs)
        except RequestRefused as refused:
            return refused.response
        return self.answer(handle)

    # ------------------------------------------------------------------ T7: triggers
    def _retrain(self, model_id: str, trigger: Trigger, why: str, **kwargs: Any) -> RequestResponse:
        model = self.models[model_id].next_version()
        termination, requirements = self.agreements[model_id]
        try:
            handle = self._start_reserved(model, termination, requirements, trigger, **kwargs)
        except RequestRefused as refused:
            return refused.response.model_copy(update={"trigger": trigger})
        return self.answer(handle, why)

    def feedback(self, model_id: str, metric: str, value: float, **kwargs: Any) -> RequestResponse:
        """Consumer feedback on a model in use; retrains (next version) when ``value`` is below the policy
        threshold for ``metric`` (for a metric to minimise: above it)."""
        name = resolve_metric(metric)
        if model_id not in self.models:
            return RequestResponse(producer=self.name, accepted=False, trigger="CONSUMER_FEEDBACK",
                                   reason=f"{self.name} has not trained model {model_id!r}")
        thr = self.policy.retrain_below.get(name)
        if thr is None:
            return RequestResponse(producer=self.name, accepted=False, trigger="CONSUMER_FEEDBACK",
                                   reason=f"no retraining threshold for {name}; the policy has "
                                   f"{sorted(self.policy.retrain_below)}")
        bad = value < thr if spec_of(name).higher_is_better else value > thr
        if not bad:
            return RequestResponse(producer=self.name, accepted=False, trigger="CONSUMER_FEEDBACK",
                                   reason=f"{name} in use {value:g} meets threshold {thr:g}; no retraining")
        why = f"{name} in use {value:g} is worse than {thr:g}: retraining"
        return self._retrain(model_id, "CONSUMER_FEEDBACK", why, **kwargs)

    def data_updated(self, model_id: str, data: Any, **kwargs: Any) -> RequestResponse:
        """New training data for a model: the engine takes it and the model is retrained (next version);
        a model in training gets it in its running process instead."""
        with self._lock:
            running = self._busy.get(model_id)
            known = model_id in self.models
        if running is not None:
            running.add_data(data)
            return RequestResponse(producer=self.name, accepted=True, trigger="DATA_UPDATED",
                                   reason=f"training data handed to running process {running.id}",
                                   process_id=running.id)
        if not known:
            return RequestResponse(producer=self.name, accepted=False, trigger="DATA_UPDATED",
                                   reason=f"{self.name} has not trained model {model_id!r}")
        self.engines[model_id].add_data(data)
        return self._retrain(model_id, "DATA_UPDATED", "training data updated: retraining", **kwargs)
