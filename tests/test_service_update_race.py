"""Termination parameters a running process took are recorded even when they ended its run before the PATCH that
sent them returned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sluice.service.config import ServiceConfig
from sluice.service.core import TrainingService


def test_the_termination_that_ended_the_run_is_the_one_recorded(tmp_path: Path) -> None:
    svc = TrainingService(ServiceConfig(database=f"sqlite:///{tmp_path / 'svc.db'}"), "http://127.0.0.1:9")
    try:
        ldn = f"{svc.tf}/MLTrainingProcess=P1"
        with svc.store.write() as tx:
            tx.create(ldn, "MLTrainingProcess",
                      {"progressStatus": {"status": "RUNNING", "progressPercentage": 0}, "priority": 0,
                       "terminationConditions": "iterations=400", "cancelProcess": False, "suspendProcess": False},
                      {}, {"phase": "running", "request": f"{svc.tf}/MLTrainingRequest=none", "kind": "hfl",
                           "trigger": "CONSUMER_REQUEST", "termination": {"iterations": 400}})
        sent: list[dict[str, Any]] = []

        def call(proc_ldn: str, cmd: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
            """The worker takes the update, its run ends on it, and the service sees that end first."""
            sent.append(cmd)
            report = {"status": "FINISHED", "cause": "CRITERION_MET", "iterations": 5,
                      "model": {"id": "m", "version": "1"}, "performance": {}}
            with svc.store.write() as tx:
                svc.messages.end_process(tx, tx.get(proc_ldn), report, None, None)
            return {"ok": True}

        svc.supervisor.call = call  # type: ignore[method-assign]
        out = svc.processes.modify(ldn, {"terminationConditions": "iterations=3"}, {}, merge=True)
        assert sent and sent[0]["termination"]["iterations"] == 3
        assert out.attributes["progressStatus"]["status"] == "FINISHED"
        assert out.attributes["terminationConditions"] == "iterations=3"
        assert out.internal["termination"]["iterations"] == 3
    finally:
        svc.db.dispose()
