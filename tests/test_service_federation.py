"""The management service trains HFL jobs on a Flower federation: ``sluice serve`` with ``[federations.edge]``,
a real SuperLink and three SuperNodes with TLS on 127.0.0.1, requests over REST.

A job on the federation gives the simulator's accuracy, Sluice bytes and model, with the process's
``participatingFLClientRefList`` and the report's ``fLReportPerClient`` filled from the nodes; a node killed
mid-run leaves the list (notified) and comes back once its restarted node answers; an unreachable SuperLink
refuses the request before training, naming the federation; a SuperLink lost mid-run ends the process with
``ENGINE_FAILURE``. Every process started here is stopped in a finalizer.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sluice.flower.deploy import LocalDeployment
from sluice.jobs import load_job
from test_service_support import (
    Receiver,
    Server,
    checked,
    free_port,
    request_body,
    start_server,
    stop_server,
)

pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.timeout(600)]

SETS = ["data.num_clients=3", "train.participation=1.0", "model.hidden=[32]", "train.local_epochs=1"]
JOB = {"engine": "hfl", "federation": "edge", "seed": 0, "data": {"num_clients": 3},
       "train": {"participation": 1.0, "local_epochs": 1}, "model": {"hidden": [32]}}
TF = "SubNetwork=SN1,MLTrainingFunction=TF1"


def _config(tmp: Path, dep: LocalDeployment) -> Path:
    path = tmp / "service.toml"
    path.write_text(f"""
[federations.edge]
superlink = "{dep.address}"
root_certificates = "{dep.certs.ca}"
nodes = 3
round_timeout_s = 60
link_timeout_s = 15

[federations.gone]
superlink = "127.0.0.1:{free_port()}"
insecure = true
""", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("federation")
    dep = LocalDeployment(tmp / "dep", nodes=3, tls=True)
    srv = None
    try:
        dep.start()
        srv = start_server(tmp, extra=(str(_config(tmp, dep)),))
        yield dep, srv
    finally:
        if srv is not None:
            stop_server(srv)
        dep.stop()


def _create(srv: Server, rid: str, rounds: int, **job: Any) -> None:
    body = request_body(rid, {**JOB, **job}, termination={"iterations": rounds})
    checked(srv.http.put(srv.req(rid), json=body), 201)


def _report(srv: Server, proc: dict[str, Any]) -> dict[str, Any]:
    return srv.get(srv.dn(proc["attributes"]["trainingReportRef"]))


def _dns(*clients: int) -> list[str]:
    return [f"{TF}-client-{c}" for c in clients]


def test_a_job_on_the_federation_gives_the_simulators_numbers(federation) -> None:
    import io

    import torch

    from sluice.hfl import HFLEngine

    dep, srv = federation
    _create(srv, "R1", 3)
    srv.wait_status("R1", ("FINISHED", "FAILED", "CANCELLED"), timeout=400)
    proc = srv.process_of("R1")
    assert proc["attributes"]["progressStatus"]["status"] == "FINISHED", proc
    assert proc["attributes"]["participatingFLClientRefList"] == _dns(0, 1, 2)
    report = _report(srv, proc)
    per = report["attributes"]["fLReportPerClient"]
    assert [p["clientRef"] for p in per] == _dns(0, 1, 2)

    sim = HFLEngine(load_job("hfl", None, [*SETS, "seed=0"]).config)
    events = [sim.iterate() for _ in range(3)]
    sizes = sim.data.sizes
    for c, p in enumerate(per):
        assert p["numberOfDataSamplesUsed"] == sizes[c]
        window = p["trainingTimeDuration"]
        assert window["startTime"] <= window["endTime"]
        assert {m["performanceMetric"] for m in p["modelPerformanceOnClient"]} == {"train_loss"}
    st = _status(srv.get(srv.proc_uri(proc["id"])))
    assert st["bytes_up"] == sum(e.bytes_up for e in events) and st["bytes_down"] == sum(e.bytes_down for e in events)
    assert st["metrics"]["test_accuracy"] == events[-1].metrics["test_accuracy"]
    model = srv.dn(report["attributes"]["mLModelGeneratedRef"])
    raw = srv.http.get(model, headers={"Accept": "application/octet-stream"})
    assert raw.status_code == 200
    saved = torch.load(io.BytesIO(raw.content))["params"].numpy()
    assert np.array_equal(saved, sim.params)  # the simulator's model, bit for bit


def _status(proc: dict[str, Any]) -> dict[str, Any]:
    return next(v["attributes"]["vsData"] for v in proc["VsDataContainer"] if v["id"] == "sluice-status")


def _train_messages(dep: LocalDeployment, node: int) -> int:
    return (dep.logs / f"node-{node}.log").read_text(encoding="utf-8", errors="replace").count(
        "Receiving: train message")


def test_a_killed_node_leaves_the_federation_and_its_restart_rejoins(federation) -> None:
    dep, srv = federation
    rec = Receiver()
    try:
        sub = srv.uri("SubNetwork=SN1/NtfSubscriptionControl=FED")
        checked(srv.http.put(sub, json={"id": "FED", "attributes": {"notificationRecipientAddress": rec.url}}), 201)
        before = _train_messages(dep, 0)
        _create(srv, "R2", 4)
        end = time.monotonic() + 300
        srv.wait_for(srv.proc_uri(srv.process_of("R2")["id"]), lambda p: _status(p).get("iterations", 0) >= 1, 300)
        dep.kill_node(2)  # it answers no later message: it drops out of the round it is sent one in
        while _train_messages(dep, 0) < before + 2:  # round 2's messages are out (terminal 2's to the dead node)
            assert time.monotonic() < end, srv.log_text()
            time.sleep(0.1)
        dep.start_node(2)  # an empty node for terminal 2: found before round 3, resynchronised
        srv.wait_status("R2", ("FINISHED", "FAILED", "CANCELLED"), timeout=400)
        proc = srv.process_of("R2")
        assert proc["attributes"]["progressStatus"]["status"] == "FINISHED", proc
        assert proc["attributes"]["participatingFLClientRefList"] == _dns(0, 1, 2)  # back once it answered
        rec.wait(lambda n: n["notificationType"] == "notifyMOIAttributeValueChanges" and proc["id"] in n["href"]
                 and any(ch.get("participatingFLClientRefList") == _dns(0, 1)
                         for ch in n["attributeListValueChanges"][:1]))
        report = _report(srv, proc)
        vs = next(v["attributes"]["vsData"] for v in report["VsDataContainer"] if v["id"] == "sluice-report")
        two = next(c for c in vs["clients"] if c["id"] == 2)
        assert two["dropped"] == 1 and two["resynced"] == 1 and two["rounds"] == 3 and two["active"]
        assert [p["clientRef"] for p in report["attributes"]["fLReportPerClient"]] == _dns(0, 1, 2)
    finally:
        rec.close()


def test_an_unreachable_superlink_refuses_the_request_naming_the_federation(federation) -> None:
    _, srv = federation
    _create(srv, "R3", 2, federation="gone")
    srv.wait_status("R3", ("CANCELLED", "FAILED", "FINISHED"), timeout=120)
    proc = srv.process_of("R3")
    st = _status(srv.get(srv.proc_uri(proc["id"])))
    assert proc["attributes"]["progressStatus"]["status"] == "CANCELLED"
    assert "federation 'gone'" in st["detail"] and "cannot be reached" in st["detail"], st
    for job, why in (({"federation": "nowhere"}, "not one of this producer's federations"),
                     ({"federation": "edge", "engine": "local"}, "only horizontal FL jobs")):
        resp = srv.http.put(srv.req("R4"), json=request_body("R4", {**JOB, **job}, termination={"iterations": 2}))
        assert resp.status_code == 400 and why in resp.text, resp.text


def test_a_superlink_lost_mid_run_ends_the_process_with_engine_failure(federation) -> None:
    dep, srv = federation
    _create(srv, "R5", 50)
    srv.wait_for(srv.proc_uri(srv.process_of("R5")["id"]), lambda p: _status(p).get("iterations", 0) >= 1, 300)
    dep.kill_superlink()
    srv.wait_status("R5", ("FAILED", "FINISHED", "CANCELLED"), timeout=200)
    proc = srv.process_of("R5")
    assert proc["attributes"]["progressStatus"]["status"] == "FAILED"
    assert proc["attributes"]["progressStatus"]["resultStateInfo"] == "ENGINE_FAILURE"
    report = _report(srv, proc)
    vs = next(v["attributes"]["vsData"] for v in report["VsDataContainer"] if v["id"] == "sluice-report")
    assert "federation 'edge'" in vs["detail"] or "SuperLink" in vs["detail"], vs["detail"]
