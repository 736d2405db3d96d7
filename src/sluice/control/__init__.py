"""Training control: requirements, termination parameters, monitoring, negotiation and reports.

Control drives any engine that speaks :mod:`sluice.engine` and never imports engine internals::

    from sluice.control import Termination, train
    report = train(engine, {"iterations": 100, "performance": {"accuracy": 0.9}})
    report.cause, report.fired, report.estimated_remaining_iterations

A producer serves requests in the background: ``Producer.start(request)`` returns a
:class:`ProcessHandle` to query, update, suspend, resume, cancel or wait on, kept in a
:class:`ProcessRegistry` by id. :mod:`sluice.control.threegpp` renders everything in 3GPP terms.
"""

from sluice.control.clients import ClientReport, ClientTally
from sluice.control.consumer import Consumer, train_many
from sluice.control.curves import PowerLaw, fit_power_law
from sluice.control.eta import Estimate, Estimator
from sluice.control.feasibility import Feasibility, preflight
from sluice.control.handles import ProcessHandle, ProcessRegistry, UnknownProcessError
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
    parse_model,
    parse_requirements,
    parse_termination,
)
from sluice.control.process import TrainingProcess, make_process, train
from sluice.control.process_options import ProcessHooks, ProcessOptions
from sluice.control.producer import (
    Producer,
    ProducerPolicy,
    RequestRefused,
    RequestResponse,
    RunHistory,
    TrainingRequest,
)
from sluice.control.replay import ReplayEngine
from sluice.control.report import TrainingReport
from sluice.control.resources import ResourceSampler

__all__ = [
    "MDA_TYPE",
    "Agreement",
    "Anomaly",
    "Cause",
    "ClientReport",
    "ClientTally",
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
    "ProcessHandle",
    "ProcessHooks",
    "ProcessOptions",
    "ProcessRegistry",
    "PowerLaw",
    "ProcessState",
    "Producer",
    "ProducerPolicy",
    "Proposal",
    "ReplayEngine",
    "RequestRefused",
    "RequestResponse",
    "Requirements",
    "ResourceSampler",
    "Resources",
    "RunHistory",
    "Termination",
    "TrainingProcess",
    "TrainingReport",
    "TrainingRequest",
    "UnknownProcessError",
    "fit_power_law",
    "make_process",
    "negotiate",
    "parse_model",
    "parse_requirements",
    "parse_termination",
    "preflight",
    "train",
    "train_many",
]
