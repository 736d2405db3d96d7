"""Per-client reporting of horizontal FL: each round's client parts, the report's ``clients``, their TS 28.105
rendering (``fLReportPerClient``, ``participatingFLClientRefList``) and ``sluice report``'s client table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from sluice.config import load_config
from sluice.control import ClientReport, ProcessHooks, TrainingProcess, TrainingReport
from sluice.hfl import HFLEngine
from sluice.hfl.config import HFLConfig
from sluice.roles import threegpp

BUNDLE = Path(__file__).resolve().parents[1] / "src" / "sluice" / "service" / "openapi" / "bundle.json"


def _engine(*sets: str) -> HFLEngine:
    base = ["data.num_clients=6", "model.hidden=[16]", "train.local_epochs=1", "train.rounds=5"]
    return HFLEngine(load_config(None, [*base, *sets], HFLConfig))


def test_every_client_reports_its_samples_time_and_loss_every_round() -> None:
    engine = _engine("train.participation=1.0")
    events = []
    proc = TrainingProcess(engine, {"iterations": 4}, hooks=ProcessHooks(on_event=lambda e, _: events.append(e)))
    report = proc.run()
    sizes = engine.data.sizes
    for ev in events:
        assert [p.client for p in ev.clients] == list(range(6))
        assert [p.samples for p in ev.clients] == [int(s) for s in sizes]
        assert all(p.seconds > 0 and not p.dropped and not p.resynced for p in ev.clients)
        assert all(set(p.metrics) == {"train_loss"} for p in ev.clients)
        # the round's train loss is the clients' losses weighted by their samples
        total = sum(p.samples for p in ev.clients)
        want = sum(p.metrics["train_loss"] * p.samples for p in ev.clients) / total
        assert ev.metrics["train_loss"] == pytest.approx(want, rel=1e-12)
        assert not any(k.startswith("client") for k in ev.metrics)  # nothing per client in the metrics
    assert [c.id for c in report.clients] == list(range(6))
    for c in report.clients:
        assert (c.rounds, c.dropped, c.resynced, c.first_round, c.last_round) == (4, 0, 0, 1, 4)
        assert c.samples == sizes[c.id]
        assert c.training_s == pytest.approx(sum(e.clients[c.id].seconds for e in events))
        assert c.performance == events[-1].clients[c.id].metrics
        assert c.started_at <= c.ended_at
    assert "clients" not in report.performance and "clients" in report.to_json()
    assert proc.progress_status()["participating_clients"] == list(range(6))


def test_dropouts_are_counted_per_client() -> None:
    engine = _engine("train.participation=0.5", "train.dropout=0.4", "seed=3")
    events = []
    hooks = ProcessHooks(on_event=lambda e, _: events.append(e))
    report = TrainingProcess(engine, {"iterations": 5}, hooks=hooks).run()
    by_id = {c.id: c for c in report.clients}
    assert sum(c.dropped for c in report.clients) == sum(e.metrics["dropped"] for e in events) > 0
    assert sum(c.rounds for c in report.clients) == sum(e.metrics["participants"] for e in events)
    for cid, c in by_id.items():
        parts = [p for e in events for p in e.clients if p.client == cid]
        assert c.sampled == len(parts) and c.dropped == sum(p.dropped for p in parts)
        assert c.samples == (engine.data.sizes[cid] if c.rounds else 0)
        assert c.active == (not parts[-1].dropped)  # out while it has not answered since it dropped
    assert any(not c.active for c in report.clients)
    for e in events:  # three of six sampled a round; a dropped client trained on nothing
        assert len(e.clients) == 3
        assert all(p.samples == 0 and not p.metrics and p.seconds == 0 for p in e.clients if p.dropped)
    assert [c.id for c in report.clients] == sorted({p.client for e in events for p in e.clients})
    dropped_only = [c for c in report.clients if c.rounds == 0]
    assert all(c.performance == {} and c.started_at is None for c in dropped_only)


def test_the_default_run_is_unchanged_by_the_reporting() -> None:
    """The clients' parts are read beside the round; the round's numbers are those of an engine nobody reads."""
    a, b = _engine("train.dropout=0.2"), _engine("train.dropout=0.2")
    for _ in range(3):
        ea, eb = a.iterate(), b.iterate()
        assert ea.metrics == eb.metrics and ea.bytes_up == eb.bytes_up
        assert [(p.client, p.samples, p.dropped, p.metrics) for p in ea.clients] == \
            [(p.client, p.samples, p.dropped, p.metrics) for p in eb.clients]


def test_checkpointed_process_keeps_its_clients() -> None:
    engine = _engine("train.participation=1.0")
    saved = {}

    def keep(proc: TrainingProcess) -> None:
        saved.update(engine=proc.engine.checkpoint(), process=json.loads(json.dumps(proc.checkpoint())))

    TrainingProcess(engine, {"iterations": 4}, hooks=ProcessHooks(checkpoint_every=2, on_checkpoint=keep)).run()
    assert saved["process"]["n"] == 2 and len(saved["process"]["clients"]) == 6
    engine2 = _engine("train.participation=1.0")
    engine2.restore(saved["engine"])
    proc = TrainingProcess(engine2, {"iterations": 4})
    proc.restore(saved["process"])
    report = proc.run()
    assert all(c.rounds == 4 and c.first_round == 1 and c.last_round == 4 for c in report.clients)
    old = dict(saved["process"])
    old.pop("clients")  # a checkpoint made before clients were kept
    proc = TrainingProcess(_engine(), {"iterations": 4})
    proc.restore(old)
    assert proc.clients.reports() == []


def _report() -> TrainingReport:
    from sluice.control import Cause, ProcessState

    clients = [ClientReport(id=0, rounds=3, samples=40, training_s=0.5, first_round=1, last_round=3,
                            started_at="2026-11-27T07:00:00.000Z", ended_at="2026-11-27T07:00:02.500Z",
                            performance={"train_loss": 0.5}),
               ClientReport(id=2, dropped=2, resynced=1, active=False)]
    return TrainingReport(cause=Cause.CRITERION_MET, status=ProcessState.FINISHED, iterations=3, clients=clients,
                          performance={"test_accuracy": 0.9, "participants": 1.0, "dropped": 1.0})


def test_3gpp_per_client_report_and_participating_clients() -> None:
    import jsonschema

    rep = _report()
    tf = "SubNetwork=East,MLTrainingFunction=TF7"
    assert threegpp.fl_client_dn(3, tf) == "SubNetwork=East,MLTrainingFunction=TF7-client-3"
    assert threegpp.fl_client_dn(3) == "SubNetwork=SN1,MLTrainingFunction=TF1-client-3"
    with pytest.raises(ValueError):
        threegpp.fl_client_dn(1, "SubNetwork=SN1")
    # the node that dropped out and has not answered since takes no part now; the report still lists it
    assert threegpp.participating_fl_clients(rep, tf) == [f"{tf}-client-0"]
    assert threegpp.participating_fl_clients(rep.clients, tf) == threegpp.participating_fl_clients(rep, tf)
    doc = threegpp.training_report(rep, tf)
    per = doc["fLReportPerClient"]
    assert per == [
        {"clientRef": f"{tf}-client-0", "numberOfDataSamplesUsed": 40,
         "trainingTimeDuration": {"startTime": "2026-11-27T07:00:00.000Z", "endTime": "2026-11-27T07:00:02.500Z"},
         "modelPerformanceOnClient": [{"performanceMetric": "train_loss", "performanceScore": 0.5}]},
        {"clientRef": f"{tf}-client-2", "numberOfDataSamplesUsed": 0, "modelPerformanceOnClient": []},
    ]
    assert doc["vsDataContainer"]["vsData"]["clients"][1]["dropped"] == 2
    # the shapes of TS 28.105 (the service's OpenAPI bundle): FLReportPerClient and DnListRo
    bundle = json.loads(BUNDLE.read_text(encoding="utf-8"))
    schemas = bundle["components"]["schemas"]
    for name, value in (("FLReportPerClient", per[0]), ("FLReportPerClient", per[1]),
                        ("DnListRo", threegpp.participating_fl_clients(rep, tf))):
        jsonschema.validate(value, {"$ref": f"#/components/schemas/{name}", "components": bundle["components"]},
                            format_checker=jsonschema.FormatChecker())
    assert schemas["MLTrainingProcess-Attr"]["properties"]["participatingFLClientRefList"]["$ref"].endswith("DnListRo")
    for t in per[0]["trainingTimeDuration"].values():
        datetime.fromisoformat(t)
    # a report without clients (a centralised engine) has no fLReportPerClient
    assert "fLReportPerClient" not in threegpp.training_report(rep.model_copy(update={"clients": []}))


def test_sluice_report_shows_the_clients(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(json.dumps(_report().to_json()), encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "sluice", "report", str(tmp_path)], capture_output=True, text=True,
                         check=True, env={**os.environ, "COLUMNS": "160"}).stdout
    assert "Clients" in out and "resynced" in out
    row = next(line for line in out.splitlines() if line.strip("│ ").startswith("2 "))
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[:5] == ["2", "0", "2", "1", "0"]
