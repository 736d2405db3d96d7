"""The management service on a Flower federation when things go wrong: a node killed mid-run leaves the process's
``participatingFLClientRefList`` (notified) and comes back once its restarted node answers; a process suspended
and resumed, and one whose service is killed (SIGKILL, its workers with it) and restarted, goes on from its
last checkpoint in a new Flower run and ends as asked. Every process started here is stopped in a finalizer.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from test_service_federation import create, dns, report_of, service_on_a_federation, status_of
from test_service_restart import kill_all
from test_service_support import Receiver, checked, start_server, stop_server

pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.timeout(900)]


def _train_messages(dep: Any, node: int) -> int:
    return (dep.logs / f"node-{node}.log").read_text(encoding="utf-8", errors="replace").count(
        "Receiving: train message")


def _iterations(srv: Any, rid: str, n: int) -> dict[str, Any]:
    return srv.wait_for(srv.proc_uri(srv.process_of(rid)["id"]), lambda p: status_of(p).get("iterations", 0) >= n,
                        300)


def test_a_killed_node_leaves_the_federation_and_its_restart_rejoins(tmp_path) -> None:
    # the killed node's round lasts the whole round timeout
    with service_on_a_federation(tmp_path, round_timeout_s=60) as (dep, srv):
        rec = Receiver()
        try:
            sub = srv.uri("SubNetwork=SN1/NtfSubscriptionControl=FED")
            checked(srv.http.put(sub, json={"id": "FED", "attributes": {"notificationRecipientAddress": rec.url}}), 201)
            before = _train_messages(dep, 0)
            create(srv, "R2", 4)
            end = time.monotonic() + 300
            _iterations(srv, "R2", 1)
            dep.kill_node(2)  # it answers no later message: it drops out of the round it is sent one in
            while _train_messages(dep, 0) < before + 2:  # round 2's messages are out (terminal 2's to the dead node)
                assert time.monotonic() < end, srv.log_text()
                time.sleep(0.1)
            dep.start_node(2)  # an empty node for terminal 2: found before round 3, resynchronised
            srv.wait_status("R2", ("FINISHED", "FAILED", "CANCELLED"), timeout=400)
            proc = srv.process_of("R2")
            assert proc["attributes"]["progressStatus"]["status"] == "FINISHED", proc
            assert proc["attributes"]["participatingFLClientRefList"] == dns(0, 1, 2)  # back once it answered
            rec.wait(lambda n: n["notificationType"] == "notifyMOIAttributeValueChanges" and proc["id"] in n["href"]
                     and any(ch.get("participatingFLClientRefList") == dns(0, 1)
                             for ch in n["attributeListValueChanges"][:1]))
            report = report_of(srv, proc)
            vs = next(v["attributes"]["vsData"] for v in report["VsDataContainer"] if v["id"] == "sluice-report")
            two = next(c for c in vs["clients"] if c["id"] == 2)
            assert two["dropped"] == 1 and two["resynced"] == 1 and two["rounds"] == 3 and two["active"]
            assert [p["clientRef"] for p in report["attributes"]["fLReportPerClient"]] == dns(0, 1, 2)
        finally:
            rec.close()


# two Flower runs and two service starts: about 110 s idle, and over 600 s seen on a loaded machine
@pytest.mark.timeout(1200)
def test_suspended_resumed_and_restarted_service_the_run_goes_on_to_its_end(tmp_path) -> None:
    with service_on_a_federation(tmp_path, "--set", "checkpoint_every=1") as (_, srv):
        create(srv, "R6", 4)
        pid = srv.process_of("R6")["id"]
        _iterations(srv, "R6", 1)
        srv.patch(srv.proc_uri(pid), {"attributes": {"suspendProcess": True}})
        srv.wait_for(srv.proc_uri(pid), lambda p: p["attributes"]["progressStatus"]["status"] == "SUSPENDED", 300)
        srv.patch(srv.proc_uri(pid), {"attributes": {"suspendProcess": False}})
        seen = _iterations(srv, "R6", 2)
        assert status_of(seen)["iterations"] < 4
        kill_all(srv)  # the service and its worker; the ServerApp, cut off, cancels after its round
        srv2 = start_server(tmp_path, port=srv.port, db=srv.db,
                            extra=(str(tmp_path / "service.toml"), "--set", "checkpoint_every=1"))
        try:
            srv2.wait_status("R6", ("FINISHED", "FAILED", "CANCELLED"), timeout=400)
            proc = srv2.process_of("R6")
            assert proc["attributes"]["progressStatus"]["status"] == "FINISHED", proc
            report = report_of(srv2, proc)
            vs = next(v["attributes"]["vsData"] for v in report["VsDataContainer"] if v["id"] == "sluice-report")
            assert vs["iterations"] == 4 and vs["cause"] == "CRITERION_MET", vs
            assert all(c["resynced"] >= 1 for c in vs["clients"])  # the new run's nodes got the model densely
        finally:
            stop_server(srv2)
