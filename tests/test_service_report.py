"""The MLTrainingReport the service writes when a process ends: model performance is about the model only."""

from __future__ import annotations

from pathlib import Path

from sluice.metrics import OPERATIONAL_METRICS
from sluice.service.config import ServiceConfig
from sluice.service.core import TrainingService


def test_the_runs_own_counts_are_not_model_performance(tmp_path: Path) -> None:
    svc = TrainingService(ServiceConfig(database=f"sqlite:///{tmp_path / 'svc.db'}"), "http://127.0.0.1:9")
    try:
        ldn = f"{svc.tf}/MLTrainingProcess=P1"
        report = {"status": "FINISHED", "cause": "CRITERION_MET", "iterations": 3, "model": {"id": "m", "version": "1"},
                  "performance": {"test_accuracy": 0.9, "train_loss": 0.2, "participants": 5, "dropped": 1,
                                  "idle_leader_s": 0.5}}
        with svc.store.write() as tx:
            proc = tx.create(ldn, "MLTrainingProcess", {"progressStatus": {"status": "RUNNING"}}, {},
                             {"phase": "running", "request": f"{svc.tf}/MLTrainingRequest=none", "kind": "hfl",
                              "trigger": "CONSUMER_REQUEST"})
            svc.messages.end_process(tx, proc, report, None, None)
        rep = svc.store.get(f"{svc.tf}/MLTrainingReport=P1")
        assert rep is not None
        shown = {p["performanceMetric"]: p["performanceScore"] for key in (
            "modelPerformanceTraining", "modelPerformanceValidation") for p in rep.attributes[key]}
        assert shown == {"test_accuracy": 0.9, "train_loss": 0.2}
        assert not OPERATIONAL_METRICS & set(shown)
        vs = rep.vs_data["sluice-report"]
        assert vs["run_metrics"] == {"participants": 5, "dropped": 1, "idle_leader_s": 0.5}
        assert vs["performance"] == report["performance"]  # the engine's report, as it came
        assert svc.store.get(ldn).internal["phase"] == "ended"
    finally:
        svc.db.dispose()
