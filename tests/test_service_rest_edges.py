"""Edges of the ProvMnS GET and POST as the REST reference and TS 32.158 give them: ``BASE_SUBTREE`` without a
level is the whole subtree, a filter path may start below the root, an unknown attribute in ``fields`` or
``attributes`` is a 400 naming it, and ``POST`` on a resource that takes no children is a 405 with ``Allow``."""

from __future__ import annotations

import json

import pytest

from test_service_support import checked, request_body


@pytest.fixture(scope="module")
def done(service):
    """The session's service with one finished request (E1: its process, report and model)."""
    checked(service.http.put(service.req("E1"), json=request_body("E1", termination={"iterations": 1})), 201)
    service.wait_status("E1", ("FINISHED",))
    proc = service.process_of("E1")
    report = service.get(service.dn(proc["attributes"]["trainingReportRef"]))
    return service, proc, report


def ids(nodes: list[dict]) -> set[str]:
    return {n["id"] for n in nodes}


def test_base_subtree_without_a_level_is_the_base_and_everything_below_it(done):
    srv, proc, report = done
    sn = srv.uri("SubNetwork=SN1")
    model_id = report["attributes"]["mLModelGeneratedRef"].rpartition("=")[2]
    for params in ({"scopeType": "BASE_SUBTREE"}, {"scope": json.dumps({"scopeType": "BASE_SUBTREE"})}):
        whole = srv.get(sn, **params)
        assert whole["id"] == "SN1"
        (tf,) = whole["MLTrainingFunction"]
        assert "E1" in ids(tf["MLTrainingRequest"]) and proc["id"] in ids(tf["MLTrainingProcess"])
        assert report["id"] in ids(tf["MLTrainingReport"])
        assert model_id in ids(whole["MLModelRepository"][0]["MLModel"])
    # with a level: the base and the levels down to it, no deeper
    (tf,) = srv.get(sn, scopeType="BASE_SUBTREE", scopeLevel=1)["MLTrainingFunction"]
    assert "MLTrainingRequest" not in tf and tf["attributes"]
    assert "MLTrainingRequest" not in srv.get(sn, scopeType="BASE_SUBTREE", scopeLevel=0)


def test_a_filter_path_may_start_below_the_root(done):
    srv, _, report = done
    sn = srv.uri("SubNetwork=SN1")
    plain = ids(srv.get(sn, scopeType="BASE_ALL", filter="MLTrainingReport")["MLTrainingFunction"][0][
        "MLTrainingReport"])
    assert report["id"] in plain
    for flt in ("MLTrainingFunction=TF1/MLTrainingReport", "SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingReport",
                "/MLTrainingFunction=TF1/MLTrainingReport", "MLTrainingFunction/MLTrainingReport"):
        tree = srv.get(sn, scopeType="BASE_ALL", filter=flt)
        assert ids(tree["MLTrainingFunction"][0]["MLTrainingReport"]) == plain, flt
    # relative to the function itself, too; another function's reports are none of these
    below = srv.get(srv.function, scopeType="BASE_NTH_LEVEL", scopeLevel=1,
                    filter="MLTrainingFunction=TF1/MLTrainingReport")
    assert ids(below["MLTrainingReport"]) == plain and "MLTrainingRequest" not in below
    other = srv.get(sn, scopeType="BASE_ALL", filter="MLTrainingFunction=TF2/MLTrainingReport")
    assert "MLTrainingFunction" not in other


@pytest.mark.parametrize("param, value, bad", [
    ("fields", "attributes/bogus", "bogus"),
    ("fields", "attributes/requestStatus,attributes/nope/deeper", "nope"),
    ("fields", "bogus", "bogus"),
    ("attributes", "requestStatus,bogus", "bogus"),
])
def test_an_unknown_attribute_in_a_selection_is_a_400_naming_it(done, param, value, bad):
    srv = done[0]
    err = checked(srv.http.get(srv.req("E1"), params={param: value}), 400)
    assert err["badQueryParams"] == [param] and bad in err["reason"], err
    # in a scope, a name no class of this service defines
    err = checked(srv.http.get(srv.function, params={param: value, "scopeType": "BASE_ALL"}), 400)
    assert err["badQueryParams"] == [param] and bad in err["reason"], err


def test_known_attributes_select_as_before(done):
    srv = done[0]
    got = srv.get(srv.req("E1"), fields="attributes/requestStatus")
    assert got == {"id": "E1", "attributes": {"requestStatus": "FINISHED"}}
    assert set(srv.get(srv.req("E1"), attributes="requestStatus,cancelRequest")["attributes"]) == {
        "requestStatus", "cancelRequest"}
    # a scope answers with the attributes of every class below the base
    tree = srv.get(srv.function, scopeType="BASE_NTH_LEVEL", scopeLevel=1, fields="attributes/progressStatus/status")
    assert tree["MLTrainingProcess"] and all(set(p["attributes"]["progressStatus"]) == {"status"}
                                             for p in tree["MLTrainingProcess"])
    assert srv.get(srv.function, fields="attributes/mLModelRepositoryRef")["attributes"]["mLModelRepositoryRef"]


@pytest.mark.parametrize("target, allow", [("model", "GET"), ("report", "GET"), ("repository", "GET"),
                                           ("request", "GET, PUT, PATCH, DELETE")])
def test_post_on_a_resource_that_takes_no_children_is_a_405_with_allow(done, target, allow):
    srv, proc, report = done
    url = {"model": srv.dn(report["attributes"]["mLModelGeneratedRef"]),
           "report": srv.dn(proc["attributes"]["trainingReportRef"]),
           "repository": srv.uri("SubNetwork=SN1/MLModelRepository=MR1"),
           "request": srv.req("E1")}[target]
    checked(srv.http.get(url), 200)
    resp = srv.http.post(url, json={**request_body(None), "objectClass": "MLTrainingRequest"})
    err = checked(resp, 405)
    assert resp.headers["allow"] == allow and err["status"] == "405"
    # a resource that is not there is still a 404
    missing = url.rpartition("=")[0] + "=nope"
    checked(srv.http.post(missing, json={"objectClass": "MLTrainingRequest"}), 404)
