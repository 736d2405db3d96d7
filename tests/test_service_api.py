"""The ProvMnS interface of ``sluice serve``, over a real loopback port and a real SQLite file: creation,
errors with 3GPP bodies, cancel / suspend / resume / priority, notifications, reports and models. Every
response body is checked against the OpenAPI bundle."""

from __future__ import annotations

import json
import time

import pytest

from test_service_support import (
    NOTIFY_SCHEMA,
    Receiver,
    check,
    checked,
    local_job,
    request_body,
)


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture(scope="module")
def srv(service, receiver):
    body = {"id": "S1", "attributes": {
        "notificationRecipientAddress": receiver.url,
        "notificationTypes": ["notifyMOICreation", "notifyMOIAttributeValueChanges", "notifyMOIDeletion"],
        "scope": {"scopeType": "BASE_SUBTREE"}}}
    sub = service.uri("SubNetwork=SN1/NtfSubscriptionControl=S1")
    assert checked(service.http.put(sub, json=body), 201)["attributes"]["notificationRecipientAddress"] == receiver.url
    try:
        yield service
    finally:
        service.http.delete(sub)


def test_put_creates_then_replaces_never_201_twice(srv):
    body = request_body("R1", termination={"iterations": 3},
                        attributes={"aIMLInferenceName": "COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS",
                                    "performanceRequirements": [{"performanceMetric": "accuracy",
                                                                 "performanceScore": 0.2}]})
    resp = srv.http.put(srv.req("R1"), json=body)
    got = checked(resp, 201)
    assert resp.headers["location"] == srv.req("R1")
    assert got["id"] == "R1" and got["attributes"]["requestStatus"] in ("NOT_STARTED", "IN_PROGRESS")
    assert [c["attributes"]["vsDataType"] for c in got["VsDataContainer"]] == ["sluice.Job", "sluice.Termination"]
    body["attributes"]["performanceRequirements"][0]["performanceScore"] = 0.3
    again = checked(srv.http.put(srv.req("R1"), json=body), 200)
    assert again["attributes"]["performanceRequirements"][0]["performanceScore"] == 0.3
    srv.wait_status("R1", ("FINISHED",))
    # the report and the model resolve from the DNs
    proc = srv.process_of("R1")
    report = srv.get(srv.dn(proc["attributes"]["trainingReportRef"]))
    assert report["attributes"]["trainingProcessRef"] == proc["objectInstance"]
    model = srv.get(srv.dn(report["attributes"]["mLModelGeneratedRef"]))
    assert model["attributes"]["mLModelVersion"] == "1"
    blob = srv.http.get(srv.dn(report["attributes"]["mLModelGeneratedRef"]),
                        headers={"Accept": "application/octet-stream"})
    assert blob.status_code == 200 and blob.headers["content-type"] == "application/octet-stream"
    sluice_model = next(c for c in model["VsDataContainer"] if c["id"] == "sluice-model")["attributes"]["vsData"]
    assert len(blob.content) == sluice_model["bytes"] > 1000
    import hashlib

    assert hashlib.sha256(blob.content).hexdigest() == sluice_model["sha256"]


def test_post_lets_the_producer_choose_the_id(srv):
    body = request_body(None, termination={"iterations": 1})
    body["objectClass"] = "MLTrainingRequest"
    resp = srv.http.post(srv.function, json=body)
    got = checked(resp, 201)
    assert resp.headers["location"] == srv.req(got["id"])
    checked(srv.http.get(resp.headers["location"]), 200)


def test_errors_answer_with_3gpp_bodies(srv):
    # id mismatch
    bad = checked(srv.http.put(srv.req("R2"), json=request_body("X", termination={"iterations": 1})), 400)
    assert "id" in bad["badAttributes"]
    # read-only attribute, read-only vsDataType
    body = request_body("R3", termination={"iterations": 1})
    body["attributes"]["requestStatus"] = "FINISHED"
    assert "requestStatus" in checked(srv.http.put(srv.req("R3"), json=body), 400)["badAttributes"]
    body = request_body("R3", termination={"iterations": 1})
    body["VsDataContainer"][0]["attributes"]["vsDataType"] = "mine"
    assert checked(srv.http.put(srv.req("R3"), json=body), 400)["badAttributes"]
    # a job the engine cannot take names the container
    bad = checked(srv.http.put(srv.req("R3"), json=request_body("R3", {"engine": "local", "train": {"lr": -1}},
                                                                 termination={"iterations": 1})), 400)
    assert bad["badAttributes"] == ["VsDataContainer/sluice-job"] and "lr" in bad["reason"]
    assert checked(srv.http.get(srv.req("R3")), 404)["type"] == "IE_NOT_FOUND"
    # unknown DN, malformed LDNs, unknown paths, unknown query parameter
    checked(srv.http.get(srv.req("NOPE")), 404)
    checked(srv.http.get(srv.uri("SubNetwork=")), 400)
    checked(srv.http.get(srv.uri("SubNetwork=SN1%0A/MLTrainingFunction=TF1")), 400)
    checked(srv.http.get(f"{srv.root}/nothing/here"), 404)
    assert checked(srv.http.get(srv.function, params={"bogus": "1"}), 400)["badQueryParams"] == ["bogus"]
    # producer-only classes
    checked(srv.http.put(f"{srv.function}/MLTrainingReport=R1-1", json={"id": "R1-1", "attributes": {}}), 405)
    checked(srv.http.delete(f"{srv.function}/MLTrainingProcess=R1-1"), 405)
    # PATCH media types and read-only refs
    r = srv.http.patch(srv.req("R1"), json={"attributes": {"cancelRequest": True}})
    assert checked(r, 415)["status"] == "415"
    patch = [{"op": "replace", "path": "/attributes/trainingReportRef", "value": "SubNetwork=SN1"}]
    bad = srv.patch(srv.proc_uri("R1-1"), patch, 400, "application/json-patch+json")
    assert bad["badAttributes"] == ["trainingReportRef"]
    bad = srv.patch(srv.req("NOPE"), {"attributes": {"cancelRequest": True}}, 404)
    # a body that is not JSON
    r = srv.http.put(srv.req("R4"), content=b"{nope", headers={"Content-Type": "application/json"})
    checked(r, 400)


def test_cancel_goes_through_cancelling_to_cancelled_with_notifications(srv, receiver):
    checked(srv.http.put(srv.req("C1"), json=request_body("C1", local_job(), termination={"iterations": 500})), 201)
    pid = srv.process_of("C1")["id"]
    srv.wait_for(srv.proc_uri(pid), lambda p: next(c for c in p["VsDataContainer"] if c["id"] == "sluice-status")
                 ["attributes"]["vsData"].get("iterations", 0) >= 2)
    srv.patch(srv.req("C1"), {"attributes": {"cancelRequest": True}})
    srv.wait_status("C1", ("CANCELLED",))
    proc = srv.get(srv.proc_uri(pid))
    assert proc["attributes"]["progressStatus"]["status"] == "CANCELLED"
    changes = receiver.wait(lambda n: n["href"].endswith("MLTrainingRequest=C1") and n["attributeListValueChanges"][0]
                            .get("requestStatus") == "CANCELLED" if "attributeListValueChanges" in n else False)
    check("NotifyMoiAttributeValueChanges", changes[0])
    statuses = [n["attributeListValueChanges"][0].get("requestStatus") for n in
                receiver.of(href_contains="MLTrainingRequest=C1", ntype="notifyMOIAttributeValueChanges")]
    assert [s for s in statuses if s] == ["IN_PROGRESS", "CANCELLING", "CANCELLED"]
    # a finished request cannot be cancelled again: 409 ... but cancelling a cancelled one changes nothing
    srv.patch(srv.req("C1"), {"attributes": {"cancelRequest": True}}, 200)
    srv.wait_status("R1", ("FINISHED",))
    srv.patch(srv.req("R1"), {"attributes": {"cancelRequest": True}}, 409)
    srv.patch(srv.req("R1"), {"attributes": {"suspendRequest": True}}, 409)


def _iterations(proc: dict) -> int:
    return next(c for c in proc["VsDataContainer"] if c["id"] == "sluice-status")["attributes"]["vsData"].get(
        "iterations", 0)


def test_suspend_resume_priority_on_the_process(srv):
    checked(srv.http.put(srv.req("P1"), json=request_body("P1", termination={"iterations": 400})), 201)
    uri = srv.proc_uri("P1-1")
    srv.wait_for(uri, lambda p: _iterations(p) >= 2)
    srv.patch(uri, {"attributes": {"suspendProcess": True}})
    srv.wait_for(uri, lambda p: p["attributes"]["progressStatus"]["status"] == "SUSPENDED")
    assert srv.get(srv.req("P1"))["attributes"]["requestStatus"] == "SUSPENDED"
    n1 = _iterations(srv.get(uri))
    time.sleep(0.6)
    n2 = _iterations(srv.get(uri))
    time.sleep(0.6)
    assert n1 == n2 == _iterations(srv.get(uri))
    srv.patch(uri, [{"op": "replace", "path": "/attributes/suspendProcess", "value": False}], 200,
              "application/json-patch+json")
    srv.wait_for(uri, lambda p: _iterations(p) > n2 + 1)
    assert srv.get(srv.req("P1"))["attributes"]["requestStatus"] == "IN_PROGRESS"
    out = srv.patch(uri, {"attributes": {"priority": 7}})
    assert out["attributes"]["priority"] == 7
    assert srv.get(uri, attributes="priority")["attributes"] == {"priority": 7}
    # new termination conditions take effect at the next iteration
    srv.patch(uri, {"attributes": {"terminationConditions": "iterations=3"}})
    done = srv.wait_for(uri, lambda p: p["attributes"]["progressStatus"]["status"] == "FINISHED")
    assert done["attributes"]["terminationConditions"] == "iterations=3"
    report = srv.get(srv.dn(done["attributes"]["trainingReportRef"]))
    vs = next(c for c in report["VsDataContainer"] if c["id"] == "sluice-report")["attributes"]["vsData"]
    assert vs["criterion"]["rule"] == "iterations" and vs["iterations"] >= n2 + 2


def test_target_reached_reports_the_criterion_in_a_notification(srv, receiver):
    body = request_body("T1", termination={"iterations": 60, "performance": {"accuracy": 0.5}})
    checked(srv.http.put(srv.req("T1"), json=body), 201)
    srv.wait_status("T1", ("FINISHED",))
    made = receiver.wait(lambda n: n["notificationType"] == "notifyMOICreation"
                         and n["href"].endswith("MLTrainingReport=T1-1"))
    check("NotifyMoiCreation", made[0])
    sent = made[0]["attributeList"]["VsDataContainer"][0]["attributes"]["vsData"]
    assert sent["criterion"]["rule"] == "performance.test_accuracy"
    report = srv.get(made[0]["href"])
    vs = next(c for c in report["VsDataContainer"] if c["id"] == "sluice-report")["attributes"]["vsData"]
    assert vs == sent
    assert vs["cause"] == "CRITERION_MET" and vs["criterion"]["rule"] == "performance.test_accuracy"
    assert vs["performance"]["test_accuracy"] >= 0.5 and vs["iterations"] < 60


def test_notifications_are_valid_ordered_and_stop_after_unsubscribe(srv, tmp_path):
    r2 = Receiver()
    try:
        sub = srv.uri("SubNetwork=SN1/NtfSubscriptionControl=S2")
        checked(srv.http.put(sub, json={"id": "S2", "attributes": {
            "notificationRecipientAddress": r2.url, "notificationFilter": "MLTrainingRequest"}}), 201)
        checked(srv.http.put(srv.req("N1"), json=request_body("N1", termination={"iterations": 2})), 201)
        srv.wait_status("N1", ("FINISHED",))
        r2.wait(lambda n: n.get("attributeListValueChanges", [{}])[0].get("requestStatus") == "FINISHED")
        got = [n for n in r2.got if n["href"].endswith("MLTrainingRequest=N1")]
        assert got and all(n["href"].rpartition("/")[2].startswith("MLTrainingRequest=") for n in r2.got)
        ids = [n["notificationId"] for n in got]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        for n in got:
            check(NOTIFY_SCHEMA[n["notificationType"]], n)
            assert n["systemDN"] == "SubNetwork=SN1" and n["subscriptionId"].endswith("NtfSubscriptionControl=S2")
        assert checked(srv.http.delete(sub), 204) is None
        before = len(r2.got)
        checked(srv.http.put(srv.req("N2"), json=request_body("N2", termination={"iterations": 1})), 201)
        srv.wait_status("N2", ("FINISHED",))
        time.sleep(0.5)
        assert len(r2.got) == before
        checked(srv.http.get(sub), 404)
    finally:
        r2.close()


def test_delete_needs_an_ended_request(srv, receiver):
    checked(srv.http.put(srv.req("D1"), json=request_body("D1", termination={"iterations": 1})), 201)
    srv.wait_status("D1", ("FINISHED",))
    assert srv.http.delete(srv.req("D1")).status_code == 204
    checked(srv.http.get(srv.req("D1")), 404)
    receiver.wait(lambda n: n["notificationType"] == "notifyMOIDeletion" and n["href"].endswith("=D1"))


def test_scope_and_fields(srv):
    tree = srv.get(srv.function, scope=json.dumps({"scopeType": "BASE_NTH_LEVEL", "scopeLevel": 1}),
                   fields="attributes/requestStatus,attributes/progressStatus/status")
    assert tree["MLTrainingRequest"] and all(set(r) == {"id", "attributes"} for r in tree["MLTrainingRequest"])
    assert all(set(p["attributes"]["progressStatus"]) == {"status"} for p in tree["MLTrainingProcess"])
    only = srv.get(srv.uri("SubNetwork=SN1"), scopeType="BASE_ALL", filter="MLModel")
    models = only["MLModelRepository"][0]["MLModel"]
    assert models and all(m["objectClass"] == "MLModel" for m in models)
    doc = checked(srv.http.get(f"{srv.root}/ProvMnS/v1920/openapi.json"), 200)
    assert doc["openapi"].startswith("3.") and "/SubNetwork={sn}/MLTrainingFunction={tf}" in doc["paths"]


def test_priority_orders_the_queue(srv):
    for rid in ("B1", "B2"):
        checked(srv.http.put(srv.req(rid), json=request_body(rid, termination={"iterations": 100000})), 201)
    for rid in ("B1", "B2"):
        srv.wait_for(srv.proc_uri(f"{rid}-1"), lambda p: p["attributes"]["progressStatus"]["status"] == "RUNNING")
    for rid in ("LOW", "HIGH"):
        checked(srv.http.put(srv.req(rid), json=request_body(rid, termination={"iterations": 1})), 201)
    srv.patch(srv.proc_uri("HIGH-1"), {"attributes": {"priority": 5}})
    assert srv.get(srv.req("LOW"))["attributes"]["requestStatus"] == "NOT_STARTED"
    srv.patch(srv.req("B1"), {"attributes": {"cancelRequest": True}})
    srv.wait_status("HIGH", ("IN_PROGRESS", "FINISHED"))
    assert srv.get(srv.proc_uri("LOW-1"))["attributes"]["progressStatus"]["status"] == "NOT_STARTED"
    srv.patch(srv.req("B2"), {"attributes": {"cancelRequest": True}})
    for rid in ("LOW", "HIGH"):
        srv.wait_status(rid, ("FINISHED",))
    srv.wait_status("B2", ("CANCELLED",))
