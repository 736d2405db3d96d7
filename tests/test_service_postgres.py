"""``sluice serve`` with its store on PostgreSQL (a database of the session's throwaway server): a request
trained to FINISHED with its notifications delivered to a loopback receiver, then the service stopped and
started again on the same database, keeping every resource and going on with larger notification ids."""

from __future__ import annotations

import time

import pytest

from test_service_support import NOTIFY_SCHEMA, Receiver, check, checked, request_body, start_server, stop_server

pytestmark = pytest.mark.postgres

SUB = "SubNetwork=SN1/NtfSubscriptionControl=PG"


def _ids(rec: Receiver) -> list[int]:
    with rec.lock:
        return [n["notificationId"] for n in rec.got]


def _finished(rid: str):
    return lambda n: (n["href"].endswith(f"MLTrainingRequest={rid}")
                      and n.get("attributeListValueChanges", [{}])[0].get("requestStatus") == "FINISHED")


def test_a_service_on_postgresql_trains_notifies_and_restarts_with_everything(tmp_path, new_pg_database):
    url = new_pg_database()
    rec = Receiver()
    srv = start_server(tmp_path, name="pg", database=url)
    srv2 = None
    try:
        checked(srv.http.put(srv.uri(SUB), json={"id": "PG", "attributes": {
            "notificationRecipientAddress": rec.url, "scope": {"scopeType": "BASE_SUBTREE"}}}), 201)
        checked(srv.http.put(srv.req("P1"), json=request_body("P1", termination={"iterations": 2})), 201)
        srv.wait_status("P1", ("FINISHED",))
        rec.wait(_finished("P1"))
        posted = checked(srv.http.post(srv.function, json={**request_body(None, termination={"iterations": 1}),
                                                           "objectClass": "MLTrainingRequest"}), 201)
        srv.wait_status(posted["id"], ("FINISHED",))
        rec.wait(_finished(posted["id"]))
        proc = srv.process_of("P1")
        report = srv.get(srv.dn(proc["attributes"]["trainingReportRef"]))
        model_ldn = report["attributes"]["mLModelGeneratedRef"]
        kept = [SUB, f"SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingRequest={posted['id']}",
                "SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingRequest=P1",
                f"SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingProcess={proc['id']}",
                proc["attributes"]["trainingReportRef"].replace(",", "/"), model_ldn.replace(",", "/")]
        before = {u: srv.get(srv.uri(u)) for u in kept}
        blob = srv.http.get(srv.dn(model_ldn), headers={"Accept": "application/octet-stream"})
        assert blob.status_code == 200 and len(blob.content) > 1000
        stop_server(srv)
        ids_before = _ids(rec)
        assert ids_before and ids_before == sorted(set(ids_before))

        srv2 = start_server(tmp_path, name="pg-again", port=srv.port, database=url)
        assert {u: srv2.get(srv2.uri(u)) for u in kept} == before
        again = srv2.http.get(srv2.dn(model_ldn), headers={"Accept": "application/octet-stream"})
        assert again.status_code == 200 and again.content == blob.content
        checked(srv2.http.put(srv2.req("P2"), json=request_body("P2", termination={"iterations": 1})), 201)
        srv2.wait_status("P2", ("FINISHED",))
        rec.wait(_finished("P2"))
        listed = srv2.get(srv2.function, scopeType="BASE_NTH_LEVEL", scopeLevel=1, filter="MLTrainingRequest")
        assert [r["id"] for r in listed["MLTrainingRequest"]] == ["P1", posted["id"], "P2"]  # creation order
        ids = _ids(rec)
        assert ids == sorted(set(ids)) and min(ids[len(ids_before):]) > max(ids_before)
        with rec.lock:
            for n in rec.got:
                check(NOTIFY_SCHEMA[n["notificationType"]], n)
        # unsubscribing on the restarted service stops delivery
        assert checked(srv2.http.delete(srv2.uri(SUB)), 204) is None
        n_before = len(_ids(rec))
        checked(srv2.http.put(srv2.req("P3"), json=request_body("P3", termination={"iterations": 1})), 201)
        srv2.wait_status("P3", ("FINISHED",))
        time.sleep(0.5)  # the outbox sends within milliseconds of a commit
        assert len(_ids(rec)) == n_before
    finally:
        stop_server(srv)
        if srv2 is not None:
            stop_server(srv2)
        rec.close()
