"""Every 3GPP rendering of the control plane, as pure functions from Sluice objects to JSON-ready dicts.

Names follow TS 28.105 (AI/ML management) and TS 28.104 (``MDAType``): ``MLModel`` identity
(``mLModelId``, ``mLModelVersion``, ``mDAType``), ``performanceRequirements`` and ``ModelPerformance``
(``performanceMetric``, ``performanceScore``), ``ProcessMonitor`` (``status``, ``progressPercentage``,
``progressStateInfo``, ``resultStateInfo``), ``RequestStatus`` and ``MLTrainingReport``. Sluice fields
without a standard attribute travel in a ``VsDataContainer`` (``vsDataType``, ``vsDataFormatVersion``,
``vsData``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sluice.control.params import ModelIdentity, ProcessState, Requirements
from sluice.control.report import TrainingReport
from sluice.metrics import OPERATIONAL_METRICS

VS_DATA_FORMAT_VERSION = "1"


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


def training_report(report: TrainingReport) -> dict[str, Any]:
    """An ``MLTrainingReport``: metrics named ``train*`` are training performance, the others validation
    performance, except those about the run rather than the model (:data:`~sluice.metrics.OPERATIONAL_METRICS`:
    participants, dropped...), which go with every other report field into the ``VsDataContainer``."""
    perf = model_performance({k: v for k, v in report.performance.items() if k not in OPERATIONAL_METRICS})
    ext = report.to_json()
    for k in ("performance", "model"):
        ext.pop(k, None)
    ext["run_metrics"] = {k: v for k, v in report.performance.items() if k in OPERATIONAL_METRICS}
    return {
        "mLModelGeneratedRef": report.model_path,
        "modelPerformanceTraining": [p for p in perf if p["performanceMetric"].startswith("train")],
        "modelPerformanceValidation": [p for p in perf if not p["performanceMetric"].startswith("train")],
        "mLModel": model_identity(report.model),
        "progressStatus": process_monitor(report.status, report.progress_percent, report.cause.value),
        "vsDataContainer": vs_data_container("sluice.TrainingReport", ext),
    }
