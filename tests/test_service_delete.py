"""DELETE of an ended request removes its training records (processes and reports) with it and keeps its
models, whose references stay valid: no DN the service shows points at a resource that is gone."""

from __future__ import annotations

from typing import Any

from test_service_support import Receiver, checked, request_body


def _refs(node: Any) -> list[str]:
    """Every DN held by a ``*Ref`` attribute or a ``trainingReportRef`` member anywhere in ``node``."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k.endswith("Ref") or k.endswith("RefList"):
                items = [v] if isinstance(v, str) else v if isinstance(v, list) else []
                out += [x for x in items if isinstance(x, str)]
            else:
                out += _refs(v)
    elif isinstance(node, list):
        for v in node:
            out += _refs(v)
    return out


def test_delete_of_a_finished_request_cascades_to_its_records_and_keeps_its_model(service):
    rec = Receiver()
    sub = service.uri("SubNetwork=SN1/NtfSubscriptionControl=DEL")
    try:
        checked(service.http.put(sub, json={"id": "DEL", "attributes": {"notificationRecipientAddress": rec.url}}),
                201)
        checked(service.http.put(service.req("DX"), json=request_body("DX", termination={"iterations": 1})), 201)
        service.wait_status("DX", ("FINISHED",))
        proc = service.process_of("DX")
        report = service.dn(proc["attributes"]["trainingReportRef"])
        model = service.dn(proc["attributes"]["mLModelRef"])
        assert checked(service.http.delete(service.req("DX")), 204) is None
        for gone in (service.req("DX"), service.proc_uri(proc["id"]), report):
            checked(service.http.get(gone), 404)
        kept = service.get(model)
        blob = service.http.get(model, headers={"Accept": "application/octet-stream"})
        assert blob.status_code == 200 and len(blob.content) > 1000
        for dn in _refs(kept):
            checked(service.http.get(service.dn(dn)), 200)
        # nothing the service shows refers to what is gone
        tree = service.get(service.uri("SubNetwork=SN1"), scopeType="BASE_ALL")
        for dn in _refs(tree):
            assert service.http.get(service.dn(dn)).status_code == 200, f"dangling reference {dn}"
        for href in (service.req("DX"), service.proc_uri(proc["id"]), report):
            rec.wait(lambda n, h=href: n["notificationType"] == "notifyMOIDeletion" and n["href"] == h)
    finally:
        service.http.delete(sub)
        rec.close()
