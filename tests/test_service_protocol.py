"""TS 28.532 protocol details: the 3GPP patch media types, ``dataNodeSelector``, 405 for PATCH of read-only classes
whatever the body, OPTIONS agreeing with the OpenAPI document, progress start and end times, and a finished
process whose status agrees with its report."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from test_service_support import BASE, checked, request_body


def vs(resource: dict, cid: str) -> dict:
    return next(c for c in resource.get("VsDataContainer", []) if c["id"] == cid)["attributes"]["vsData"]


@pytest.fixture(scope="module")
def srv(service):
    checked(service.http.put(service.req("PR1"), json=request_body("PR1", termination={
        "iterations": 60, "performance": {"accuracy": 0.5}})), 201)
    checked(service.http.put(service.req("PR2"), json=request_body("PR2", termination={"iterations": 100_000})), 201)
    service.wait_status("PR1", ("FINISHED",))
    service.wait_for(service.proc_uri("PR2-1"), lambda p: p["attributes"]["progressStatus"]["status"] == "RUNNING")
    try:
        yield service
    finally:
        service.patch(service.req("PR2"), {"attributes": {"cancelRequest": True}})
        service.wait_status("PR2", ("CANCELLED",))


def test_the_3gpp_patch_media_types_are_taken(srv):
    uri = srv.proc_uri("PR2-1")
    got = srv.patch(uri, {"attributes": {"priority": 3}}, 200, "application/3gpp-merge-patch+json")
    assert got["attributes"]["priority"] == 3
    got = srv.patch(uri, [{"op": "replace", "path": "#/attributes/priority", "value": 4}], 200,
                    "application/3gpp-json-patch+json")
    assert got["attributes"]["priority"] == 4
    got = srv.patch(uri, [{"op": "replace", "path": "/attributes/priority", "value": 5}], 200,
                    "application/3gpp-json-patch+json")
    assert got["attributes"]["priority"] == 5
    # this producer's patchable resources have no children: naming one is a 400, not a silent no-op
    bad = srv.patch(uri, [{"op": "replace", "path": "/MLTrainingReport=X#/attributes/priority", "value": 1}], 400,
                    "application/3gpp-json-patch+json")
    assert "children" in bad["reason"]
    bad = srv.patch(uri, {"MLTrainingReport": [{"id": "X"}]}, 400, "application/3gpp-merge-patch+json")
    assert bad["badAttributes"] == ["MLTrainingReport"]
    srv.patch(uri, {"attributes": {"priority": 1}}, 415, "application/x-patch+json")


def test_json_patch_errors_keep_the_3gpp_body_and_say_json_patch(srv):
    uri = srv.proc_uri("PR2-1")
    bad = srv.patch(uri, [{"op": "replace", "path": "/attributes/priority", "value": "high"}], 400,
                    "application/json-patch+json")
    assert "JSON Patch" in bad["reason"] and "merge patch" not in bad["reason"], bad
    bad = srv.patch(uri, [{"op": "remove", "path": "/attributes/nothing"}], 400, "application/json-patch+json")
    assert bad["badAttributes"] == ["/attributes/nothing"]
    bad = srv.patch(uri, [{"op": "test", "path": "/attributes/priority", "value": -7}], 409,
                    "application/json-patch+json")
    assert bad["status"] == "409"
    srv.patch(uri, [{"op": "replace", "path": "", "value": {}}], 400, "application/json-patch+json")
    srv.patch(uri, [{"op": "frobnicate", "path": "/attributes/priority"}], 400, "application/json-patch+json")


def test_data_node_selector_selects_nodes(srv):
    tree = srv.get(srv.function, dataNodeSelector='MLTrainingProcess[progressStatus/status="FINISHED"]')
    got = {p["id"] for p in tree.get("MLTrainingProcess", [])}
    assert "PR1-1" in got and "PR2-1" not in got and "MLTrainingRequest" not in tree
    err = checked(srv.http.get(srv.function, params={"dataNodeSelector": "Nope"}), 400)
    assert err["badQueryParams"] == ["dataNodeSelector"]


@pytest.mark.parametrize("ctype", ["text/plain", "application/merge-patch+json", None])
def test_patch_of_a_read_only_class_is_405_whatever_the_body(srv, ctype):
    proc = srv.get(srv.proc_uri("PR1-1"))
    for ref in ("trainingReportRef", "mLModelRef"):
        headers = {"Content-Type": ctype} if ctype else {}
        resp = srv.http.patch(srv.dn(proc["attributes"][ref]), content=b"not json at all", headers=headers)
        assert checked(resp, 405)["status"] == "405"
        assert resp.headers["allow"] == "GET"


def test_options_lists_what_the_openapi_document_declares(srv):
    doc = srv.http.get(f"{srv.root}{BASE}/openapi.json").json()
    uris = {"/SubNetwork={sn}/MLTrainingFunction={tf}/MLTrainingRequest={id}": srv.req("PR1"),
            "/SubNetwork={sn}/MLTrainingFunction={tf}/MLTrainingProcess={id}": srv.proc_uri("PR1-1"),
            "/SubNetwork={sn}/MLTrainingFunction={tf}": srv.function,
            "/SubNetwork={sn}/NtfSubscriptionControl={s}": srv.uri("SubNetwork=SN1/NtfSubscriptionControl=Z")}
    for template, uri in uris.items():
        resp = srv.http.options(uri)
        assert resp.status_code == 204, resp.text
        allow = {m.strip() for m in resp.headers["allow"].split(",") if m.strip()}
        assert allow == {m.upper() for m in doc["paths"][template] if m != "parameters"}, template


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_progress_status_carries_start_and_end_times(srv):
    done = srv.get(srv.proc_uri("PR1-1"))["attributes"]["progressStatus"]
    assert _time(done["startTime"]) <= _time(done["endTime"])
    running = srv.get(srv.proc_uri("PR2-1"))["attributes"]["progressStatus"]
    assert "startTime" in running and "endTime" not in running


def test_a_finished_process_status_agrees_with_its_report(srv):
    proc = srv.get(srv.proc_uri("PR1-1"))
    report = vs(srv.get(srv.dn(proc["attributes"]["trainingReportRef"])), "sluice-report")
    status = vs(proc, "sluice-status")
    assert report["cause"] == "CRITERION_MET" and report["iterations"] < 60
    assert status["iterations"] == report["iterations"]
    assert status["metrics"] == report["performance"], json.dumps([status, report])[:2000]
    assert proc["attributes"]["progressStatus"]["progressPercentage"] == 100 == status["progress_percent"]
