"""The producer side: decides or proposes parameters, judges feasibility, trains, retrains on triggers.

A :class:`Producer` owns an engine factory (one engine per model id, kept so that retraining continues
from the trained state), a :class:`ProducerPolicy` and a :class:`RunHistory` of past runs.

Deciding parameters (T2 b/c) from requirements, model type and history:

* performance targets = the requirement's performance thresholds;
* training error threshold = the policy's value for the model type (T4 metrics), when it has one;
* iterations = ``⌈margin · N_past⌉`` where ``N_past`` is the most iterations a past successful run of the
  same model (else the same type) needed, else the policy default;
* training time = the requirement's maximum training time;
* a plateau guard on the goal metric (``plateau_patience`` checks without improvement).

Triggers (T7): a consumer request (:meth:`Producer.request`), consumer feedback below a threshold
(:meth:`Producer.feedback`) and updated training data (:meth:`Producer.data_updated`); each answer says
whether the request was accepted.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from sluice.control.feasibility import Feasibility, check_compute, check_data, check_layers
from sluice.control.monitor import effective_error_metric
from sluice.control.negotiation import Agreement, DecidedBy, Proposal, Review, negotiate
from sluice.control.params import (
    Cause,
    ModelIdentity,
    ProcessState,
    Requirements,
    Section,
    Termination,
    metric_mode,
    normalise_model_type,
    resolve_metric,
)
from sluice.control.process import TrainingProcess, goal_of
from sluice.control.report import TrainingReport
from sluice.engine import Engine
from sluice.errors import NegotiationError, SluiceError

EngineFactory = Callable[[ModelIdentity, Requirements | None], Engine]
Trigger = Literal["CONSUMER_REQUEST", "CONSUMER_FEEDBACK", "DATA_UPDATED"]


class ProducerPolicy(Section):
    """How a producer decides parameters and when it retrains."""

    default_iterations: int = Field(100, ge=1)
    iteration_margin: float = Field(1.5, ge=1.0)
    plateau_patience: int | None = Field(20, ge=1, description="None: no plateau guard")
    plateau_min_delta: float = Field(0.0, ge=0)
    error_thresholds: dict[str, float] = Field(
        default_factory=lambda: {"COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS": 0.05,
                                 "MDA_ASSISTED_ENERGY_SAVING_ENERGY_SAVING_ANALYSIS": 0.1},
        description="training error threshold per model type",
    )
    supported_types: list[str] | None = Field(None, description="model types served (None: all)")
    retrain_below: dict[str, float] = Field(
        default_factory=lambda: {"test_precision": 0.8},
        description="retrain when the consumer reports a metric in use below this",
    )

    def model_post_init(self, _: Any) -> None:
        self.error_thresholds = {normalise_model_type(k): v for k, v in self.error_thresholds.items()}
        if self.supported_types is not None:
            self.supported_types = [normalise_model_type(t) for t in self.supported_types]
        self.retrain_below = {resolve_metric(k): v for k, v in self.retrain_below.items()}


class RunRecord(BaseModel):
    """One past training run, as the producer remembers it."""

    model_id: str
    model_type: str | None
    version: str
    cause: Cause
    fired: str | None
    iterations: int
    duration_s: float
    performance: dict[str, float]
    trigger: str = "CONSUMER_REQUEST"


class RunHistory:
    """Past runs, in memory and optionally appended to a JSON-lines file."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.records: list[RunRecord] = []
        if self.path is not None and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    self.records.append(RunRecord.model_validate_json(line))

    def add(self, record: RunRecord) -> None:
        self.records.append(record)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(record.model_dump_json() + "\n")

    def iterations_needed(self, model: ModelIdentity) -> tuple[int | None, str]:
        """Most iterations a successful past run of this model (else of its type) needed."""
        ok = [r for r in self.records if r.cause == Cause.CRITERION_MET and r.fired
              and not r.fired.endswith("iterations")]
        same = [r for r in ok if r.model_id == model.id]
        src = "this model"
        if not same and model.type:
            same = [r for r in ok if r.model_type == model.type]
            src = f"type {model.type}"
        if not same:
            return None, ""
        return max(r.iterations for r in same), f"{len(same)} past run(s) of {src}"


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

    @property
    def request_status(self) -> str:
        """TS 28.105 ``RequestStatus`` of the request."""
        if not self.accepted:
            return "CANCELLED"
        if self.report is None:
            return "NOT_STARTED"
        return "CANCELLED" if self.report.status == ProcessState.CANCELLED else "FINISHED"


class Producer:
    """Trains models on request; see the module docstring for how it decides."""

    def __init__(
        self,
        name: str,
        engine_factory: EngineFactory,
        policy: ProducerPolicy | None = None,
        history: RunHistory | None = None,
        save_dir: str | Path | None = None,
    ) -> None:
        self.name = name
        self.engine_factory = engine_factory
        self.policy = policy or ProducerPolicy()
        self.history = history or RunHistory()
        self.save_dir = None if save_dir is None else Path(save_dir)
        self.engines: dict[str, Engine] = {}
        self.models: dict[str, ModelIdentity] = {}
        self.agreements: dict[str, tuple[Termination, Requirements | None]] = {}
        self._lock = threading.Lock()

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
    def propose(self, model: ModelIdentity, requirements: Requirements | None = None) -> Proposal:
        """Termination parameters this producer would use, with the reason for each."""
        p, r = self.policy, requirements
        why: list[str] = []
        data: dict[str, Any] = {}
        if r is not None and r.performance:
            data["performance"] = {k: {"threshold": v} for k, v in r.performance.items()}
            why.append("performance targets = the requirement's thresholds")
        if model.type in p.error_thresholds:
            data["training_error"] = {"threshold": p.error_thresholds[model.type]}
            why.append(f"training error ≤ {p.error_thresholds[model.type]:g}: policy for type {model.type}")
        past, src = self.history.iterations_needed(model)
        if past is not None:
            data["iterations"] = max(1, math.ceil(p.iteration_margin * past))
            why.append(f"iterations = {p.iteration_margin:g} × {past} needed by {src}")
        else:
            data["iterations"] = p.default_iterations
            why.append(f"iterations = default {p.default_iterations} (no past run of the model or type)")
        if r is not None and r.max_training_time_s is not None:
            data["training_time_s"] = r.max_training_time_s
            why.append("training time = the requirement's maximum training time")
        term = Termination.model_validate(data)
        if p.plateau_patience is not None:
            goal = goal_of(term, r, effective_error_metric(term, model))
            metric = goal[0] if goal else "train_loss"
            term = term.merged({"plateau": {metric: {"patience": p.plateau_patience,
                                                     "min_delta": p.plateau_min_delta}}})
            why.append(f"plateau guard: stop after {p.plateau_patience} checks without {metric} improving")
        return Proposal(model=model, termination=term, rationale=why)

    def decide(self, model: ModelIdentity, requirements: Requirements | None = None) -> Termination:
        """The producer decides the parameters itself (T2 b)."""
        return self.propose(model, requirements).termination

    # ------------------------------------------------------------------ R3: feasibility
    def assess(self, model: ModelIdentity, requirements: Requirements | None,
               termination: Termination | None = None, probe_iterations: int = 2) -> Feasibility:
        """Judge before training whether the requirements can be met here (refuse early if not)."""
        if self.policy.supported_types is not None and model.type not in self.policy.supported_types:
            raise NegotiationError(f"{self.name} does not train models of type {model.type}; it serves "
                                   f"{', '.join(self.policy.supported_types)}")
        if requirements is None:
            return Feasibility.ok()
        eng = self.engine_for(model, requirements)
        eng.start()
        check_layers(requirements, getattr(eng, "num_layers", None) if requirements.layers else None)
        v = check_data(requirements, getattr(eng, "num_samples", None))
        if not v.feasible or requirements.max_training_time_s is None or not hasattr(eng, "probe"):
            return v
        spi = float(eng.probe(probe_iterations))
        expected, _ = self.history.iterations_needed(model)
        if expected is None and termination is not None and goal_of(
            termination, requirements, effective_error_metric(termination, model)
        ) is None:
            expected = termination.iterations
        return check_compute(requirements, spi, expected)

    # ------------------------------------------------------------------ training
    def train(
        self,
        model: ModelIdentity,
        termination: Termination,
        requirements: Requirements | None = None,
        *,
        trigger: Trigger = "CONSUMER_REQUEST",
        **kwargs: Any,
    ) -> TrainingReport:
        """Train ``model`` with agreed parameters; the run goes into the history."""
        eng = self.engine_for(model, requirements)
        save = None
        if self.save_dir is not None:
            save = self.save_dir / f"{model.id}-v{model.version}.pt"
        expected, _ = self.history.iterations_needed(model)
        kwargs.setdefault("expected_iterations", expected)
        report = TrainingProcess(eng, termination, requirements, model, save_path=save, **kwargs).run()
        self.models[model.id] = model
        self.agreements[model.id] = (termination, requirements)
        self.history.add(RunRecord(
            model_id=model.id, model_type=model.type, version=model.version, cause=report.cause,
            fired=report.fired, iterations=report.iterations, duration_s=report.duration_s,
            performance=report.performance, trigger=trigger,
        ))
        return report

    # ------------------------------------------------------------------ T7: triggers
    def request(self, req: TrainingRequest, review: Review | None = None, **kwargs: Any) -> RequestResponse:
        """A consumer's training request: negotiate, check feasibility, train; say whether accepted."""
        try:
            agreement = negotiate(self, req.model, req.requirements, mode=req.decided_by,
                                  termination=req.termination, review=review)
            verdict = self.assess(req.model, req.requirements, agreement.termination)
        except SluiceError as exc:
            return RequestResponse(producer=self.name, accepted=False, reason=str(exc))
        if not verdict.feasible:
            assert verdict.cause is not None
            report = TrainingReport(cause=verdict.cause, status=ProcessState.FAILED, detail=verdict.detail,
                                    model=req.model)
            reason = f"{verdict.cause}: {verdict.detail}"
            return RequestResponse(producer=self.name, accepted=False, reason=reason, agreement=agreement,
                                   report=report)
        report = self.train(req.model, agreement.termination, req.requirements, **kwargs)
        return RequestResponse(producer=self.name, accepted=True, reason="trained", agreement=agreement,
                               report=report)

    def _retrain(self, model_id: str, trigger: Trigger, why: str, **kwargs: Any) -> RequestResponse:
        model = self.models[model_id].next_version()
        termination, requirements = self.agreements[model_id]
        report = self.train(model, termination, requirements, trigger=trigger, **kwargs)
        return RequestResponse(producer=self.name, accepted=True, reason=why, trigger=trigger, report=report)

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
        bad = value < thr if metric_mode(name) == "max" else value > thr
        if not bad:
            return RequestResponse(producer=self.name, accepted=False, trigger="CONSUMER_FEEDBACK",
                                   reason=f"{name} in use {value:g} meets threshold {thr:g}; no retraining")
        why = f"{name} in use {value:g} is worse than {thr:g}: retraining"
        return self._retrain(model_id, "CONSUMER_FEEDBACK", why, **kwargs)

    def data_updated(self, model_id: str, data: Any, **kwargs: Any) -> RequestResponse:
        """New training data for a model: the engine takes it and the model is retrained (next version)."""
        if model_id not in self.models:
            return RequestResponse(producer=self.name, accepted=False, trigger="DATA_UPDATED",
                                   reason=f"{self.name} has not trained model {model_id!r}")
        self.engines[model_id].add_data(data)
        return self._retrain(model_id, "DATA_UPDATED", "training data updated: retraining", **kwargs)
