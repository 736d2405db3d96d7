"""The identity of a trained model tells jobs apart: the consumer's ``[model] id``, or one derived from the request
when it gives none; versions count per identity, across requests."""

from __future__ import annotations

from test_service_support import checked, local_job, request_body


def _model_of(srv, rid: str) -> dict:
    srv.wait_status(rid, ("FINISHED",))
    return srv.get(srv.dn(srv.process_of(rid)["attributes"]["mLModelRef"]))


def test_requests_without_a_model_id_get_different_identities(service):
    for rid in ("IA", "IB"):
        checked(service.http.put(service.req(rid), json=request_body(rid, termination={"iterations": 1})), 201)
    a, b = (_model_of(service, rid)["attributes"] for rid in ("IA", "IB"))
    assert a["mLModelId"] != b["mLModelId"]
    assert a["mLModelId"].endswith("IA") and b["mLModelId"].endswith("IB")
    assert a["mLModelVersion"] == b["mLModelVersion"] == "1"
    report = service.get(service.dn(service.process_of("IA")["attributes"]["trainingReportRef"]))
    rep = next(c for c in report["VsDataContainer"] if c["id"] == "sluice-report")["attributes"]["vsData"]
    assert rep["model"]["id"] == a["mLModelId"] and rep["model"]["version"] == "1"


def test_the_consumers_model_id_is_kept_and_its_versions_count_across_requests(service):
    job = {**local_job(), "model": {"hidden": [16], "id": "shared-digits"}}
    versions = []
    for rid in ("IC", "ID"):
        checked(service.http.put(service.req(rid), json=request_body(rid, job, termination={"iterations": 1})), 201)
        model = _model_of(service, rid)
        assert model["attributes"]["mLModelId"] == "shared-digits"
        versions.append(model["attributes"]["mLModelVersion"])
    assert versions == ["1", "2"]
    procs = [service.process_of(rid) for rid in ("IC", "ID")]
    assert procs[0]["attributes"]["mLModelRef"] != procs[1]["attributes"]["mLModelRef"]
