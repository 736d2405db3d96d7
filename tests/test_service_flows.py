"""Control-plane flows over the wire: negotiation (T2), feasibility refusal (R3), the inadequate-data loop
(T6), retraining triggers (T7), and a service killed with SIGKILL and restarted on the same database."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import psutil
import pytest

from test_service_support import (
    NOTIFY_SCHEMA,
    Receiver,
    check,
    checked,
    request_body,
    start_server,
    stop_server,
)


def vs(resource: dict, cid: str) -> dict:
    return next(c for c in resource.get("VsDataContainer", []) if c["id"] == cid)["attributes"]["vsData"]


@pytest.fixture(scope="module")
def srv(service):
    return service


def test_producer_decides_when_no_parameters_are_sent(srv):
    body = request_body("PD", requirements={"performance": {"accuracy": 0.99}})
    checked(srv.http.put(srv.req("PD"), json=body), 201)
    proc = srv.process_of("PD")
    neg = vs(proc, "sluice-negotiation")
    assert neg["decidedBy"] == "producer" and neg["state"] == "AGREED"
    n = vs(proc, "sluice-termination")["iterations"]
    assert neg["proposal"]["iterations"] == n and f"iterations={n}" in proc["attributes"]["terminationConditions"]
    assert any(why.startswith("iterations = ") for why in neg["rationale"])  # policy default, or past runs
    srv.wait_status("PD", ("FINISHED",))
    report = srv.get(srv.dn(srv.process_of("PD")["attributes"]["trainingReportRef"]))
    assert vs(report, "sluice-report")["cause"] == "PERFORMANCE_NOT_MET"


def test_producer_proposes_and_the_process_waits_for_the_consumer(srv):
    checked(srv.http.put(srv.req("NG"), json=request_body("NG", decided_by="negotiated")), 201)
    proc = srv.process_of("NG")
    assert proc["attributes"]["progressStatus"]["progressStateInfo"] == "AWAITING_AGREEMENT"
    time.sleep(0.8)
    again = srv.get(srv.proc_uri(proc["id"]))
    assert again["attributes"]["progressStatus"]["status"] == "NOT_STARTED"
    assert srv.get(srv.req("NG"))["attributes"]["requestStatus"] == "NOT_STARTED"
    assert vs(again, "sluice-status")["iterations"] == 0
    # suspending before agreement is an illegal state change
    srv.patch(srv.proc_uri(proc["id"]), {"attributes": {"suspendProcess": True}}, 409)
    # the consumer modifies the proposal: training uses the result
    srv.patch(srv.proc_uri(proc["id"]), {"VsDataContainer": [
        {"id": "sluice-termination", "attributes": {"vsData": {"iterations": 2}}}]})
    done = srv.wait_for(srv.proc_uri(proc["id"]), lambda p: p["attributes"]["progressStatus"]["status"] == "FINISHED")
    neg = vs(done, "sluice-negotiation")
    assert neg["state"] == "AGREED" and neg["modified"] is True and neg["proposal"]["iterations"] != 2
    assert vs(srv.get(srv.dn(done["attributes"]["trainingReportRef"])), "sluice-report")["iterations"] == 2
    # answering again is refused: nothing is proposed any more
    srv.patch(srv.proc_uri(proc["id"]), {"VsDataContainer": [
        {"id": "sluice-negotiation", "attributes": {"vsData": {"accept": True}}}]}, 409)


def test_an_accepted_proposal_is_trained_as_proposed(srv):
    checked(srv.http.put(srv.req("NA"), json=request_body("NA", decided_by="negotiated")), 201)
    pid = srv.process_of("NA")["id"]
    proposed = vs(srv.get(srv.proc_uri(pid)), "sluice-negotiation")["proposal"]["iterations"]
    srv.patch(srv.proc_uri(pid), {"VsDataContainer": [
        {"id": "sluice-negotiation", "attributes": {"vsData": {"accept": True}}}]})
    srv.wait_status("NA", ("FINISHED",))
    report = srv.get(srv.dn(srv.get(srv.proc_uri(pid))["attributes"]["trainingReportRef"]))
    assert vs(report, "sluice-report")["iterations"] == proposed


def test_parameters_changed_while_training_take_effect(srv):
    checked(srv.http.put(srv.req("CH"), json=request_body("CH", termination={"iterations": 500})), 201)
    pid = srv.process_of("CH")["id"]
    srv.wait_for(srv.proc_uri(pid), lambda p: vs(p, "sluice-status").get("iterations", 0) >= 1)
    srv.patch(srv.req("CH"), {"VsDataContainer": [{"id": "sluice-termination",
                                                   "attributes": {"vsData": {"iterations": 2}}}]})
    srv.wait_status("CH", ("FINISHED",))
    report = srv.get(srv.dn(srv.get(srv.proc_uri(pid))["attributes"]["trainingReportRef"]))
    r = vs(report, "sluice-report")
    assert r["criterion"]["rule"] == "iterations" and r["iterations"] < 500
    # a termination update the engine cannot report is refused with a 400 naming it
    checked(srv.http.put(srv.req("CX"), json=request_body("CX", termination={"iterations": 500})), 201)
    pid = srv.process_of("CX")["id"]
    srv.wait_for(srv.proc_uri(pid), lambda p: p["attributes"]["progressStatus"]["status"] == "RUNNING")
    bad = srv.patch(srv.proc_uri(pid), {"attributes": {"terminationConditions": "performance.auc=0.9"}}, 400)
    assert "auc" in bad["reason"]
    srv.patch(srv.proc_uri(pid), {"attributes": {"cancelProcess": True}})
    srv.wait_status("CX", ("CANCELLED",))


def test_feasibility_refusal_comes_back_before_training(srv):
    job = {"engine": "local", "data": {"max_train_samples": 50}, "train": {"batch_size": 64}, "model": {"hidden": [16]}}
    checked(srv.http.put(srv.req("F1"), json=request_body("F1", job, termination={"iterations": 3},
                                                           requirements={"min_data_amount": 500})), 201)
    srv.wait_status("F1", ("CANCELLED",))
    proc = srv.process_of("F1")
    assert proc["attributes"]["progressStatus"]["resultStateInfo"] == "INSUFFICIENT_TRAINING_SAMPLES"
    report = vs(srv.get(srv.dn(proc["attributes"]["trainingReportRef"])), "sluice-report")
    assert report["iterations"] == 0 and report["refused"] is True and "500" in report["detail"]


def test_inadequate_data_loop_over_the_wire(srv):
    job = {"engine": "local", "data": {"max_train_samples": 50}, "train": {"batch_size": 64}, "model": {"hidden": [16]}}
    checked(srv.http.put(srv.req("DL"), json=request_body("DL", job, termination={"iterations": 3, "data_wait_s": 60},
                                                           requirements={"min_data_amount": 80})), 201)
    pid = srv.process_of("DL")["id"]
    waiting = srv.wait_for(srv.proc_uri(pid), lambda p: p["attributes"]["progressStatus"]["status"] == "AWAITING_DATA")
    assert waiting["attributes"]["progressStatus"]["resultStateInfo"] == "INADEQUATE_TRAINING_DATA"
    assert srv.get(srv.req("DL"))["attributes"]["requestStatus"] == "IN_PROGRESS"
    rng = np.random.default_rng(0)
    bad = {"X": rng.normal(size=(40, 3)).tolist(), "y": [1] * 40}
    err = srv.patch(srv.proc_uri(pid), {"VsDataContainer": [{"id": "sluice-data", "attributes": {"vsData": bad}}]},
                    400)
    assert "3 features" in err["reason"] and err["badAttributes"] == ["VsDataContainer/sluice-data"]
    malformed = {"X": [[1.0, 2.0], [3.0]], "y": [0, 1]}
    err = srv.patch(srv.proc_uri(pid), {"VsDataContainer": [{"id": "sluice-data",
                                                              "attributes": {"vsData": malformed}}]}, 400)
    assert err["badAttributes"] == ["VsDataContainer/sluice-data/X"]
    time.sleep(0.3)
    assert srv.get(srv.proc_uri(pid))["attributes"]["progressStatus"]["status"] == "AWAITING_DATA"
    good = {"X": rng.uniform(0, 16, size=(40, 64)).tolist(), "y": rng.integers(0, 10, size=40).tolist()}
    srv.patch(srv.proc_uri(pid), {"VsDataContainer": [{"id": "sluice-data", "attributes": {"vsData": good}}]})
    srv.wait_status("DL", ("FINISHED",))
    proc = srv.get(srv.proc_uri(pid))
    assert vs(proc, "sluice-data")["samples"] == 40
    report = srv.get(srv.dn(proc["attributes"]["trainingReportRef"]))
    r = vs(report, "sluice-report")
    assert r["cause"] == "CRITERION_MET" and r["iterations"] == 3 and r["awaited_data"] == 1
    assert report["attributes"]["areNewTrainingDataUsed"] is True


def test_feedback_and_new_data_retrain_the_next_version(srv):
    checked(srv.http.put(srv.req("TR"), json=request_body("TR", termination={"iterations": 2})), 201)
    srv.wait_status("TR", ("FINISHED",))
    first = srv.process_of("TR")
    out = srv.patch(srv.req("TR"), {"VsDataContainer": [
        {"id": "sluice-feedback", "attributes": {"vsData": {"metric": "precision", "value": 0.95}}}]})
    assert vs(out, "sluice-trigger")["accepted"] is False
    out = srv.patch(srv.req("TR"), {"VsDataContainer": [
        {"id": "sluice-feedback", "attributes": {"vsData": {"metric": "precision", "value": 0.4}}}]})
    trig = vs(out, "sluice-trigger")
    assert trig["accepted"] is True and trig["trigger"] == "CONSUMER_FEEDBACK" and trig["model"]["version"] == "2"
    srv.wait_for(srv.req("TR"), lambda r: r["attributes"]["requestStatus"] == "FINISHED"
                 and srv.process_of("TR")["id"] != first["id"])
    second = srv.process_of("TR")
    report = srv.get(srv.dn(second["attributes"]["trainingReportRef"]))
    assert report["attributes"]["lastTrainingRef"] == first["attributes"]["trainingReportRef"]
    model = srv.get(srv.dn(report["attributes"]["mLModelGeneratedRef"]))
    assert model["attributes"]["mLModelVersion"] == "2" and model["attributes"]["mLTrainingType"] == "RE_TRAINING"
    # updated training data: version 3
    rng = np.random.default_rng(1)
    good = {"X": rng.uniform(0, 16, size=(20, 64)).tolist(), "y": rng.integers(0, 10, size=20).tolist()}
    srv.patch(srv.proc_uri(second["id"]), {"VsDataContainer": [{"id": "sluice-data", "attributes": {"vsData": good}}]})
    srv.wait_for(srv.req("TR"), lambda r: r["attributes"]["requestStatus"] == "FINISHED"
                 and srv.process_of("TR")["id"] not in (first["id"], second["id"]))
    third = srv.process_of("TR")
    report = srv.get(srv.dn(third["attributes"]["trainingReportRef"]))
    assert report["attributes"]["areNewTrainingDataUsed"] is True
    assert srv.get(srv.dn(report["attributes"]["mLModelGeneratedRef"]))["attributes"]["mLModelVersion"] == "3"


def test_a_killed_service_restarts_with_everything_it_had(tmp_path):
    rec = Receiver()
    srv = start_server(tmp_path, name="restart")
    try:
        sub = srv.uri("SubNetwork=SN1/NtfSubscriptionControl=K")
        checked(srv.http.put(sub, json={"id": "K", "attributes": {"notificationRecipientAddress": rec.url}}), 201)
        checked(srv.http.put(srv.req("K1"), json=request_body("K1", termination={"iterations": 1})), 201)
        srv.wait_status("K1", ("FINISHED",))
        checked(srv.http.put(srv.req("K2"), json=request_body("K2", termination={"iterations": 5000})), 201)
        srv.wait_for(srv.proc_uri("K2-1"), lambda p: vs(p, "sluice-status").get("iterations", 0) >= 1)
        rec.wait(lambda n: n["href"].endswith("MLTrainingProcess=K2-1")
                 and n["notificationType"] == "notifyMOIAttributeValueChanges")
        before = {u: srv.get(srv.uri(u)) for u in ("SubNetwork=SN1/NtfSubscriptionControl=K",
                                                   "SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingRequest=K1")}
        k1 = srv.process_of("K1")
        workers = [c.pid for c in psutil.Process(srv.proc.pid).children(recursive=True)]
        assert workers
        os.kill(srv.proc.pid, signal.SIGKILL)  # the server alone: its workers must notice and go
        srv.proc.wait(10)
        t0 = time.monotonic()
        while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in workers):
            assert time.monotonic() - t0 < 30, "workers outlived their server"
            time.sleep(0.2)
        ids_before = [n["notificationId"] for n in rec.got]
        srv2 = start_server(tmp_path, name="restart", port=srv.port, db=srv.db)
        try:
            for u, doc in before.items():
                assert srv2.get(srv2.uri(u)) == doc
            assert srv2.get(srv2.req("K2"))["attributes"]["requestStatus"] == "IN_PROGRESS"
            done = vs(srv2.get(srv2.proc_uri("K2-1")), "sluice-status")["iterations"]
            srv2.wait_for(srv2.proc_uri("K2-1"), lambda p: p["attributes"]["progressStatus"]["status"] == "RUNNING"
                          and vs(p, "sluice-status")["iterations"] > done)  # it resumed (tests/test_service_restart)
            srv2.patch(srv2.req("K2"), {"attributes": {"cancelRequest": True}})
            srv2.wait_status("K2", ("CANCELLED",))
            report = srv2.get(srv2.dn(k1["attributes"]["trainingReportRef"]))
            blob = srv2.http.get(srv2.dn(report["attributes"]["mLModelGeneratedRef"]),
                                 headers={"Accept": "application/octet-stream"})
            assert blob.status_code == 200 and len(blob.content) > 1000
            checked(srv2.http.put(srv2.req("K3"), json=request_body("K3", termination={"iterations": 1})), 201)
            srv2.wait_status("K3", ("FINISHED",))
            rec.wait(lambda n: n["href"].endswith("MLTrainingReport=K3-1"))
            after = [n["notificationId"] for n in rec.got][len(ids_before):]
            assert after and min(after) > max(ids_before)
            ids = [n["notificationId"] for n in rec.got]
            assert ids == sorted(ids) and len(set(ids)) == len(ids)
            for n in rec.got:
                check(NOTIFY_SCHEMA[n["notificationType"]], n)
        finally:
            stop_server(srv2)
    finally:
        stop_server(srv)
        rec.close()
