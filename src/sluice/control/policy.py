"""How a producer decides termination parameters (T2 b/c): its :class:`ProducerPolicy` and :func:`propose`.

From the requirements, the model type and the producer's past runs (:mod:`sluice.control.history`):

* performance targets = the requirement's performance thresholds;
* training error threshold = the policy's value for the model type (T4 metrics), when it has one;
* iterations = ``⌈margin · N_past⌉`` where ``N_past`` is the most iterations a past run of the same job
  shape needed to reach a target at least as strict as this request's goal (the reason names those runs),
  else the policy default;
* training time = the requirement's maximum training time;
* a plateau guard on the goal metric (``plateau_patience`` checks without improvement).

The in-memory producer (:class:`sluice.roles.Producer`) and the management service both decide this way.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field

from sluice.control._outcome import goal_of
from sluice.control.history import RunHistory, target_of
from sluice.control.monitor import effective_error_metric
from sluice.control.params import (
    ModelIdentity,
    Requirements,
    Section,
    Termination,
    normalise_model_type,
    resolve_metric,
)


class ProducerPolicy(Section):
    """How a producer decides parameters and when it retrains."""

    default_iterations: int = Field(100, ge=1)
    iteration_margin: float = Field(1.5, ge=1.0)
    plateau_patience: int | None = Field(20, ge=1, description="None: no plateau guard")
    plateau_min_delta: float = Field(0.0, ge=0)
    error_thresholds: dict[str, float] = Field(
        default_factory=lambda: {"COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS": 0.8,
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


class Proposal(BaseModel):
    """Termination parameters a producer proposes, with the reason for each choice."""

    model: ModelIdentity
    termination: Termination
    rationale: list[str] = Field(default_factory=list)


def propose(policy: ProducerPolicy, history: RunHistory, model: ModelIdentity,
            requirements: Requirements | None = None, shape: str | None = None) -> Proposal:
    """The termination parameters ``policy`` gives ``model`` under ``requirements`` with ``history``, with the
    reason for each. ``shape``: the :func:`~sluice.control.history.job_shape` of the request's job (None: runs
    of the same model id count)."""
    p, r = policy, requirements
    why: list[str] = []
    data: dict[str, Any] = {}
    if r is not None and r.performance:
        data["performance"] = {k: {"threshold": v} for k, v in r.performance.items()}
        why.append("performance targets = the requirement's thresholds")
    if model.type in p.error_thresholds:
        data["training_error"] = {"threshold": p.error_thresholds[model.type]}
        why.append(f"training error ≤ {p.error_thresholds[model.type]:g}: policy for type {model.type}")
    past = history.evidence(model, target_of(Termination.model_validate(data), r, model), shape)
    if past.iterations is not None:
        data["iterations"] = max(1, math.ceil(p.iteration_margin * past.iterations))
        why.append(f"iterations = {p.iteration_margin:g} × {past.text}")
    else:
        data["iterations"] = p.default_iterations
        why.append(f"iterations = default {p.default_iterations} ({past.text})")
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
