"""The management service trains HFL jobs on a Flower federation: ``sluice serve`` with ``[federations.edge]``,
a real SuperLink and three SuperNodes with TLS on 127.0.0.1, requests over REST.

A job on the federation gives the simulator's accuracy, Sluice bytes and model, with the process's
``participatingFLClientRefList`` and the report's ``fLReportPerClient`` filled from the nodes; an unreachable
SuperLink refuses the request before training, naming the federation; a SuperLink lost mid-run ends the process
with ``ENGINE_FAILURE``. Killed nodes, commands and a restarted service: tests/test_service_federation_faults.py.
Every process started here is stopped in a finalizer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sluice.runtimes.flower.deploy import LocalDeployment
from sluice.runtimes.jobs import load_job
from test_service_support import (
    Server,
    checked,
    free_port,
    request_body,
    start_server,
    stop_server,
)

pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.timeout(900)]

SETS = ["data.num_clients=3", "train.participation=1.0", "model.hidden=[32]", "train.local_epochs=1"]
JOB = {"engine": "hfl", "federation": "edge", "seed": 0, "data": {"num_clients": 3},
       "train": {"participation": 1.0, "local_epochs": 1}, "model": {"hidden": [32]}}
TF = "SubNetwork=SN1,MLTrainingFunction=TF1"


def _config(tmp: Path, dep: LocalDeployment, round_timeout_s: float) -> Path:
    """The service's configuration: federation ``edge`` is ``dep``, ``gone`` a SuperLink nobody runs."""
    path = tmp / "service.toml"
    path.write_text(f"""
[federations.edge]
superlink = "{dep.address}"
root_certificates = "{dep.certs.ca}"
nodes = 3
round_timeout_s = {round_timeout_s}
link_timeout_s = 15

[federations.gone]
superlink = "127.0.0.1:{free_port()}"
insecure = true
""", encoding="utf-8")
    return path


@contextlib.contextmanager
def service_on_a_federation(tmp: Path, *extra: str, round_timeout_s: float = 180
                            ) -> Iterator[tuple[LocalDeployment, Server]]:
    """A 3-node TLS deployment and a service whose federation ``edge`` it is; both stopped at the end. A round
    waits ``round_timeout_s`` for the nodes: on a loaded machine a round of three ClientApp processes has taken
    about 60 s, and a live node that misses the deadline drops out of the process's participants."""
    dep = LocalDeployment(tmp / "dep", nodes=3, tls=True)
    srv = None
    try:
        dep.start()
        srv = start_server(tmp, extra=(str(_config(tmp, dep, round_timeout_s)), *extra))
        yield dep, srv
    finally:
        if srv is not None:
            stop_server(srv)
        dep.stop()


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory):
    with service_on_a_federation(tmp_path_factory.mktemp("federation")) as both:
        yield both


def create(srv: Server, rid: str, rounds: int, **job: Any) -> None:
    body = request_body(rid, {**JOB, **job}, termination={"iterations": rounds})
    checked(srv.http.put(srv.req(rid), json=body), 201)


def report_of(srv: Server, proc: dict[str, Any]) -> dict[str, Any]:
    return srv.get(srv.dn(proc["attributes"]["trainingReportRef"]))


def dns(*clients: int) -> list[str]:
    return [f"{TF}-client-{c}" for c in clients]


def test_a_job_on_the_federation_gives_the_simulators_numbers(federation) -> None:
    import io

    import torch

    from sluice.hfl import HFLEngine

    dep, srv = federation
    create(srv, "R1", 3)
    srv.wait_status("R1", ("FINISHED", "FAILED", "CANCELLED"), timeout=400)
    proc = srv.process_of("R1")
    assert proc["attributes"]["progressStatus"]["status"] == "FINISHED", proc
    assert proc["attributes"]["participatingFLClientRefList"] == dns(0, 1, 2)
    report = report_of(srv, proc)
    per = report["attributes"]["fLReportPerClient"]
    assert [p["clientRef"] for p in per] == dns(0, 1, 2)

    sim = HFLEngine(load_job("hfl", None, [*SETS, "seed=0"]).config)
    events = [sim.iterate() for _ in range(3)]
    sizes = sim.data.sizes
    for c, p in enumerate(per):
        assert p["numberOfDataSamplesUsed"] == sizes[c]
        window = p["trainingTimeDuration"]
        assert window["startTime"] <= window["endTime"]
        assert {m["performanceMetric"] for m in p["modelPerformanceOnClient"]} == {"train_loss"}
    st = status_of(srv.get(srv.proc_uri(proc["id"])))
    assert st["bytes_up"] == sum(e.bytes_up for e in events) and st["bytes_down"] == sum(e.bytes_down for e in events)
    assert st["metrics"]["test_accuracy"] == events[-1].metrics["test_accuracy"]
    model = srv.dn(report["attributes"]["mLModelGeneratedRef"])
    raw = srv.http.get(model, headers={"Accept": "application/octet-stream"})
    assert raw.status_code == 200
    saved = torch.load(io.BytesIO(raw.content))["params"].numpy()
    assert np.array_equal(saved, sim.params)  # the simulator's model, bit for bit


def status_of(proc: dict[str, Any]) -> dict[str, Any]:
    return next(v["attributes"]["vsData"] for v in proc["VsDataContainer"] if v["id"] == "sluice-status")


def test_an_unreachable_superlink_refuses_the_request_naming_the_federation(federation) -> None:
    _, srv = federation
    create(srv, "R3", 2, federation="gone")
    srv.wait_status("R3", ("CANCELLED", "FAILED", "FINISHED"), timeout=120)
    proc = srv.process_of("R3")
    st = status_of(srv.get(srv.proc_uri(proc["id"])))
    assert proc["attributes"]["progressStatus"]["status"] == "CANCELLED"
    assert "federation 'gone'" in st["detail"] and "cannot be reached" in st["detail"], st
    body = request_body("R7", JOB, termination={"iterations": 2}, requirements={"min_data_amount": 100})
    checked(srv.http.put(srv.req("R7"), json=body), 201)  # the nodes hold the data: refused before training
    srv.wait_status("R7", ("CANCELLED", "FAILED", "FINISHED"), timeout=120)
    st = status_of(srv.get(srv.proc_uri(srv.process_of("R7")["id"])))
    assert st["state"] == "CANCELLED" and "requirements.min_data_amount" in st["detail"], st
    for job, why in (({"federation": "nowhere"}, "not one of this producer's federations"),
                     ({"federation": "edge", "engine": "local"}, "only horizontal FL jobs")):
        resp = srv.http.put(srv.req("R4"), json=request_body("R4", {**JOB, **job}, termination={"iterations": 2}))
        assert resp.status_code == 400 and why in resp.text, resp.text


def test_a_superlink_lost_mid_run_ends_the_process_with_engine_failure(federation) -> None:
    dep, srv = federation
    create(srv, "R5", 50)
    srv.wait_for(srv.proc_uri(srv.process_of("R5")["id"]), lambda p: status_of(p).get("iterations", 0) >= 1, 300)
    moved = request_body("R5", {**JOB, "federation": "gone"}, termination={"iterations": 50})
    resp = srv.http.put(srv.req("R5"), json=moved)  # a training request stays on its federation
    assert resp.status_code == 409 and "federation" in resp.text, resp.text
    dep.kill_superlink()
    srv.wait_status("R5", ("FAILED", "FINISHED", "CANCELLED"), timeout=200)
    proc = srv.process_of("R5")
    assert proc["attributes"]["progressStatus"]["status"] == "FAILED"
    assert proc["attributes"]["progressStatus"]["resultStateInfo"] == "ENGINE_FAILURE"
    report = report_of(srv, proc)
    vs = next(v["attributes"]["vsData"] for v in report["VsDataContainer"] if v["id"] == "sluice-report")
    assert "federation 'edge'" in vs["detail"] or "SuperLink" in vs["detail"], vs["detail"]
