"""Every 3GPP rendering of the control plane, as pure functions from Sluice objects to JSON-ready dicts.

Names follow TS 28.105 (AI/ML management) and TS 28.104 (``MDAType``): ``MLModel`` identity
(``mLModelId``, ``mLModelVersion``, ``mDAType``), ``performanceRequirements`` and ``ModelPerformance``
(``performanceMetric``, ``performanceScore``), ``ProcessMonitor`` (``status``, ``progressPercentage``,
``progressStateInfo``, ``resultStateInfo``), ``RequestStatus`` and ``MLTrainingReport``. Sluice fields
without a standard attribute travel in a ``VsDataContainer`` (``vsDataType``, ``vsDataFormatVersion``,
``vsData``).

Federated clients. TS 28.105 names an FL client by the DN of an ``MLTrainingFunction`` (its
``fLParticipationInfo.candidateFLClientRefList`` lists "MLTrainingFunction DNs capable of acting as FL
clients"); Sluice's clients are terminals of one job, not managed functions of their own, so each gets the DN
of an ``MLTrainingFunction`` beside the server's, named after it (:func:`fl_client_dn`)::

    SubNetwork=SN1,MLTrainingFunction=TF1-client-3      client (terminal) 3 of the job that TF1 serves

The process's ``participatingFLClientRefList`` (:func:`participating_fl_clients`) lists those DNs for every
client that took part (sampled at least once: one that dropped out or rejoined is listed), and the report's
``fLReportPerClient`` (:func:`fl_report_per_client`) gives per client its ``clientRef``,
``numberOfDataSamplesUsed``, ``trainingTimeDuration`` and ``modelPerformanceOnClient``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from sluice.control.clients import ClientReport
from sluice.control.params import ModelIdentity, ProcessState, Requirements
from sluice.control.report import TrainingReport
from sluice.metrics import OPERATIONAL_METRICS

VS_DATA_FORMAT_VERSION = "1"

DEFAULT_TRAINING_FUNCTION = "SubNetwork=SN1,MLTrainingFunction=TF1"
"""The DN of the ``MLTrainingFunction`` serving the training when none is given (the service's default)."""


def model_identity(model: ModelIdentity) -> dict[str, Any]:
    """The ``MLModel`` identity attributes."""
    return {"mLModelId": model.id, "mLModelVersion": model.version, "mDAType": model.type}


def model_performance(metrics: Mapping[str, float]) -> list[dict[str, Any]]:
    """A list of ``ModelPerformance``, one per finite metric."""
    return [{"performanceMetric": k, "performanceScore": v} for k, v in metrics.items() if math.isfinite(v)]


def performance_requirements(requirements: Requirements) -> list[dict[str, Any]]:
    """``performanceRequirements``: the requirement's thresholds as ``ModelPerformance``."""
    return model_performance(requirements.performance)


def process_monitor(state: ProcessState, progress_percent: float | None, result: str = "") -> dict[str, Any]:
    """A ``ProcessMonitor``: ``progressPercentage`` is the whole percent reached (rounded down, so 100 only
    when done); a running process is ``TRAINING``; ``resultStateInfo`` is the cause once there is one."""
    return {
        "status": state.value,
        "progressPercentage": None if progress_percent is None else int(progress_percent),
        "progressStateInfo": "TRAINING" if state == ProcessState.RUNNING else state.value,
        "resultStateInfo": result,
    }


def request_status(accepted: bool, state: ProcessState | None = None) -> str:
    """``RequestStatus`` of a training request from whether it was accepted and the state of the process
    that serves it: refused → ``CANCELLED``; then ``NOT_STARTED``, ``TRAINING_IN_PROGRESS`` (running or
    awaiting data), ``SUSPENDED``, ``CANCELLED``, or ``FINISHED`` once the process ended otherwise."""
    if not accepted:
        return "CANCELLED"
    return _REQUEST_STATUS[state or ProcessState.NOT_STARTED]


_REQUEST_STATUS = {
    ProcessState.NOT_STARTED: "NOT_STARTED",
    ProcessState.RUNNING: "TRAINING_IN_PROGRESS",
    ProcessState.AWAITING_DATA: "TRAINING_IN_PROGRESS",
    ProcessState.SUSPENDED: "SUSPENDED",
    ProcessState.FINISHED: "FINISHED",
    ProcessState.FAILED: "FINISHED",
    ProcessState.CANCELLED: "CANCELLED",
}


def vs_data_container(data_type: str, data: dict[str, Any]) -> dict[str, Any]:
    """A ``VsDataContainer`` holding Sluice's own fields."""
    return {"vsDataType": data_type, "vsDataFormatVersion": VS_DATA_FORMAT_VERSION, "vsData": data}


def fl_client_dn(client: int, training_function: str = DEFAULT_TRAINING_FUNCTION) -> str:
    """The DN of federated client ``client`` of the training that the ``MLTrainingFunction`` of DN
    ``training_function`` (the FL server) serves: the ``MLTrainingFunction`` beside it named
    ``<its id>-client-<client>`` (module docstring).

    >>> fl_client_dn(3, "SubNetwork=SN1,MLTrainingFunction=TF1")
    'SubNetwork=SN1,MLTrainingFunction=TF1-client-3'
    """
    parent, _, rdn = training_function.rpartition(",")
    cls, eq, name = rdn.partition("=")
    if cls.strip() != "MLTrainingFunction" or not eq or not name.strip():
        raise ValueError(f"not the DN of an MLTrainingFunction: {training_function!r}")
    own = f"MLTrainingFunction={name.strip()}-client-{int(client)}"
    return f"{parent},{own}" if parent else own


def _clients_of(clients: TrainingReport | Iterable[ClientReport]) -> list[ClientReport]:
    return list(clients.clients if isinstance(clients, TrainingReport) else clients)


def participating_fl_clients(clients: TrainingReport | Iterable[ClientReport],
                             training_function: str = DEFAULT_TRAINING_FUNCTION) -> list[str]:
    """``participatingFLClientRefList``: the DN (:func:`fl_client_dn`) of every client taking part (a report's
    ``clients`` sampled at least once that uploaded the last time they were sampled: one that dropped out is
    listed again once it answers), in id order."""
    return [fl_client_dn(c.id, training_function) for c in _clients_of(clients) if c.sampled and c.active]


def fl_report_per_client(clients: TrainingReport | Iterable[ClientReport],
                         training_function: str = DEFAULT_TRAINING_FUNCTION) -> list[dict[str, Any]]:
    """``fLReportPerClient``, one ``FLReportPerClient`` per client that took part: ``clientRef`` (its DN),
    ``numberOfDataSamplesUsed`` (the samples it trained on; 0 for one that only dropped out),
    ``trainingTimeDuration`` (a ``TimeWindow``: from when its first local training began to when its last one
    ended, present once it trained; its summed training time is ``training_s`` in the vendor data) and
    ``modelPerformanceOnClient`` (what it reported the last time it trained, as ``ModelPerformance``)."""
    out = []
    for c in _clients_of(clients):
        if not c.sampled:
            continue
        entry: dict[str, Any] = {"clientRef": fl_client_dn(c.id, training_function),
                                 "numberOfDataSamplesUsed": c.samples}
        if c.started_at is not None and c.ended_at is not None:
            entry["trainingTimeDuration"] = {"startTime": c.started_at, "endTime": c.ended_at}
        entry["modelPerformanceOnClient"] = model_performance(c.performance)
        out.append(entry)
    return out


def training_report(report: TrainingReport, training_function: str = DEFAULT_TRAINING_FUNCTION) -> dict[str, Any]:
    """An ``MLTrainingReport``: metrics named ``train*`` are training performance, the others validation
    performance, except those about the run rather than the model (:data:`~sluice.metrics.OPERATIONAL_METRICS`:
    participants, dropped...), which go with every other report field into the ``VsDataContainer``. A
    federated engine's clients give ``fLReportPerClient`` (:func:`fl_report_per_client`, their DNs under
    ``training_function``, the FL server's DN); their whole entries, rounds dropped included, stay in the
    ``VsDataContainer`` (``clients``)."""
    perf = model_performance({k: v for k, v in report.performance.items() if k not in OPERATIONAL_METRICS})
    ext = report.to_json()
    for k in ("performance", "model"):
        ext.pop(k, None)
    ext["run_metrics"] = {k: v for k, v in report.performance.items() if k in OPERATIONAL_METRICS}
    return {
        "mLModelGeneratedRef": report.model_path,
        "modelPerformanceTraining": [p for p in perf if p["performanceMetric"].startswith("train")],
        "modelPerformanceValidation": [p for p in perf if not p["performanceMetric"].startswith("train")],
        **({"fLReportPerClient": fl_report_per_client(report, training_function)} if report.clients else {}),
        "mLModel": model_identity(report.model),
        "progressStatus": process_monitor(report.status, report.progress_percent, report.cause.value),
        "vsDataContainer": vs_data_container("sluice.TrainingReport", ext),
    }
