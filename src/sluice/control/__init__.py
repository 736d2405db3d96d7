"""Training control: requirements, termination parameters, monitoring, negotiation and reports.

Control drives any engine that speaks :mod:`sluice.engine` and never imports engine internals::

    from sluice.control import Termination, train
    report = train(engine, {"iterations": 100, "performance": {"accuracy": 0.9}})
    report.cause, report.fired, report.estimated_remaining_iterations
"""

from sluice.control.consumer import Consumer, train_many
from sluice.control.eta import Estimate, Estimator, PowerLaw, fit_power_law
from sluice.control.feasibility import Feasibility
from sluice.control.monitor import Anomaly, Firing, Hit, Monitor, Observation
from sluice.control.negotiation import Agreement, Proposal, negotiate
from sluice.control.params import (
    MDA_TYPE,
    Cause,
    CriteriaGroup,
    Criterion,
    ModelIdentity,
    ModelType,
    Plateau,
    ProcessState,
    Requirements,
    Resources,
    Termination,
    known_metrics,
    metric_mode,
    parse_model,
    parse_requirements,
    parse_termination,
    register_metric,
)
from sluice.control.process import TrainingProcess, train
from sluice.control.producer import Producer, ProducerPolicy, RequestResponse, RunHistory, TrainingRequest
from sluice.control.replay import ReplayEngine
from sluice.control.report import TrainingReport
from sluice.control.resources import ResourceSampler

__all__ = [
    "MDA_TYPE",
    "Agreement",
    "Anomaly",
    "Cause",
    "Consumer",
    "CriteriaGroup",
    "Criterion",
    "Estimate",
    "Estimator",
    "Feasibility",
    "Firing",
    "Hit",
    "ModelIdentity",
    "ModelType",
    "Monitor",
    "Observation",
    "Plateau",
    "PowerLaw",
    "ProcessState",
    "Producer",
    "ProducerPolicy",
    "Proposal",
    "ReplayEngine",
    "RequestResponse",
    "Requirements",
    "ResourceSampler",
    "Resources",
    "RunHistory",
    "Termination",
    "TrainingProcess",
    "TrainingReport",
    "TrainingRequest",
    "fit_power_law",
    "known_metrics",
    "metric_mode",
    "negotiate",
    "parse_model",
    "parse_requirements",
    "parse_termination",
    "register_metric",
    "train",
    "train_many",
]
