"""Training control: requirements, termination parameters, monitoring, negotiation and reports.

Control drives any engine that speaks :mod:`sluice.engine` and never imports engine internals::

    from sluice.control import Termination, train
    report = train(engine, {"iterations": 100, "performance": {"accuracy": 0.9}})
    report.cause, report.fired, report.estimated_remaining_iterations

A producer decides termination parameters by its :class:`ProducerPolicy` (:func:`propose`). The producer and
consumer roles built on this (in memory) and the 3GPP rendering are :mod:`sluice.roles`.
"""

from sluice.control.clients import ClientReport
from sluice.control.curves import fit_power_law
from sluice.control.eta import Estimate, Estimator
from sluice.control.feasibility import Feasibility, preflight
from sluice.control.history import RunHistory
from sluice.control.params import (
    MDA_TYPE,
    Cause,
    ModelIdentity,
    ModelType,
    ProcessState,
    Requirements,
    Termination,
    parse_model,
    parse_requirements,
    parse_termination,
)
from sluice.control.policy import ProducerPolicy, Proposal, propose
from sluice.control.process import TrainingProcess, make_process, train
from sluice.control.process_options import ProcessHooks, ProcessOptions
from sluice.control.replay import ReplayEngine
from sluice.control.report import TrainingReport
from sluice.control.resources import ResourceSampler

__all__ = [
    "MDA_TYPE",
    "Cause",
    "ClientReport",
    "Estimate",
    "Estimator",
    "Feasibility",
    "ModelIdentity",
    "ModelType",
    "ProcessHooks",
    "ProcessOptions",
    "ProcessState",
    "ProducerPolicy",
    "Proposal",
    "ReplayEngine",
    "Requirements",
    "ResourceSampler",
    "RunHistory",
    "Termination",
    "TrainingProcess",
    "TrainingReport",
    "fit_power_law",
    "make_process",
    "parse_model",
    "parse_requirements",
    "parse_termination",
    "preflight",
    "propose",
    "train",
]
