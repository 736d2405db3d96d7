"""3GPP renderings (TS 28.105 / TS 28.104 names), all from sluice.roles.threegpp."""

from __future__ import annotations

import json
import math

import pytest

from sluice.control import Cause, ModelIdentity, ProcessState, Requirements, TrainingReport
from sluice.control.monitor import Firing, Hit
from sluice.roles import threegpp


def test_model_identity_and_performance_requirements() -> None:
    m = ModelIdentity(id="cov-1", version="3", type="coverage_problem_analysis")
    assert threegpp.model_identity(m) == {
        "mLModelId": "cov-1", "mLModelVersion": "3", "mDAType": "COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS",
    }
    assert threegpp.model_identity(ModelIdentity())["mDAType"] is None
    r = Requirements(performance={"accuracy": 0.9, "f1": 0.8})
    assert threegpp.performance_requirements(r) == [
        {"performanceMetric": "test_accuracy", "performanceScore": 0.9},
        {"performanceMetric": "test_f1", "performanceScore": 0.8},
    ]
    assert threegpp.model_performance({"a": 1.0, "b": math.nan, "c": math.inf}) == [
        {"performanceMetric": "a", "performanceScore": 1.0}
    ]


@pytest.mark.parametrize(("state", "percent", "shown", "info"), [
    (ProcessState.RUNNING, 99.7, 99, "TRAINING"),
    (ProcessState.AWAITING_DATA, 12.0, 12, "AWAITING_DATA"),
    (ProcessState.FINISHED, 100.0, 100, "FINISHED"),
    (ProcessState.NOT_STARTED, None, None, "NOT_STARTED"),
])
def test_process_monitor(state: ProcessState, percent: float | None, shown: int | None, info: str) -> None:
    doc = threegpp.process_monitor(state, percent, "X")
    assert doc == {"status": state.value, "progressPercentage": shown, "progressStateInfo": info,
                   "resultStateInfo": "X"}


def test_request_status() -> None:
    assert threegpp.request_status(False, ProcessState.RUNNING) == "CANCELLED"
    expected = {
        None: "NOT_STARTED", ProcessState.NOT_STARTED: "NOT_STARTED", ProcessState.RUNNING: "TRAINING_IN_PROGRESS",
        ProcessState.AWAITING_DATA: "TRAINING_IN_PROGRESS", ProcessState.SUSPENDED: "SUSPENDED",
        ProcessState.FINISHED: "FINISHED", ProcessState.FAILED: "FINISHED", ProcessState.CANCELLED: "CANCELLED",
    }
    assert {s: threegpp.request_status(True, s) for s in expected} == expected


def test_training_report() -> None:
    firing = Firing(rule="performance.test_accuracy", kind="performance", iteration=7,
                    hits=[Hit(name="performance.test_accuracy", kind="performance", observed=0.93, threshold=0.9,
                              iteration=7)])
    rep = TrainingReport(
        cause=Cause.CRITERION_MET, status=ProcessState.FINISHED, criterion=firing,
        model=ModelIdentity(id="m", version="2", type="fault_prediction"),
        performance={"train_loss": 0.2, "test_accuracy": 0.93, "test_loss": math.nan},
        iterations=7, progress_percent=100.0, model_path="/tmp/m.pt",
    )
    doc = threegpp.training_report(rep)
    json.dumps(doc)  # JSON-ready
    assert doc["mLModelGeneratedRef"] == "/tmp/m.pt"
    assert doc["mLModel"] == threegpp.model_identity(rep.model)
    assert doc["modelPerformanceTraining"] == [{"performanceMetric": "train_loss", "performanceScore": 0.2}]
    assert doc["modelPerformanceValidation"] == [{"performanceMetric": "test_accuracy", "performanceScore": 0.93}]
    assert doc["progressStatus"] == threegpp.process_monitor(ProcessState.FINISHED, 100.0, "CRITERION_MET")
    vs = doc["vsDataContainer"]
    assert vs["vsDataType"] == "sluice.TrainingReport" and vs["vsDataFormatVersion"] == "1"
    assert vs["vsData"]["criterion"]["rule"] == "performance.test_accuracy" and vs["vsData"]["iterations"] == 7
    assert "performance" not in vs["vsData"] and "model" not in vs["vsData"]
