"""Tasks over the wire: a request names a built-in task or one the operator registered in the service
configuration ([tasks] name = "package.module:function"); an import path in a request, an unknown name or
arguments that do not fit the task are refused with 400."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from test_service_support import checked, request_body, running_server

VERTICAL = Path(__file__).resolve().parents[1] / "examples" / "vertical"

FACTORY = '''
from sluice.tasks.builtin import tabular


def tiny(*, width: int = 8, seed: int = 0):
    task = tabular("digits", hidden=[width], seed=seed)
    task.name = "tiny"
    return task
'''


def vs(resource: dict, cid: str) -> dict:
    return next(c for c in resource.get("VsDataContainer", []) if c["id"] == cid)["attributes"]["vsData"]


def job(task: dict) -> dict:
    return {"engine": "local", "seed": 0, "train": {"iterations": 2, "batch_size": 64, "lr": 0.1}, "task": task}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """A service whose operator registered ``tiny`` (a module on the service's PYTHONPATH, not in Sluice)."""
    tmp = tmp_path_factory.mktemp("tasks")
    ops = tmp / "ops"
    ops.mkdir()
    (ops / "sluice_ops_tasks.py").write_text(FACTORY, encoding="utf-8")
    cfg = tmp / "service.toml"
    cfg.write_text('[tasks]\ntiny = "sluice_ops_tasks:tiny"\nbroken = "sluice_ops_missing:tiny"\n'
                   'vertical = "task:vertical"\n', encoding="utf-8")
    subprocess.run([sys.executable, str(VERTICAL / "make_tables.py"), "--out", str(tmp / "tables")], check=True,
                   capture_output=True)
    with running_server(tmp, extra=(str(cfg),), env={"PYTHONPATH": f"{ops}:{VERTICAL}"}) as s:
        s.tables = tmp / "tables"
        yield s


def refused(srv, rid: str, task: dict) -> dict:
    body = checked(srv.http.put(srv.req(rid), json=request_body(rid, job(task), termination={"iterations": 2})), 400)
    assert body["badAttributes"] == ["VsDataContainer/sluice-job"], body
    assert srv.http.get(srv.req(rid)).status_code == 404  # nothing was created
    return body


def test_an_import_path_in_a_request_is_refused(srv):
    body = refused(srv, "TF", {"factory": "sluice_ops_tasks:tiny"})
    assert "import path" in body["reason"] and "tiny" in body["reason"] and "digits" in body["reason"]
    # also with a name beside it, and for an import path that is not even registered
    refused(srv, "TF2", {"name": "tiny", "factory": "os:system"})
    refused(srv, "TF3", {"factory": "os:system", "args": {"command": "true"}})


def test_an_unknown_task_name_is_refused(srv):
    body = refused(srv, "TU", {"name": "sluice_ops_tasks:tiny"})
    assert "unknown task" in body["reason"] and "registered on this service: tiny" in body["reason"]
    refused(srv, "TU2", {"name": 3})


def test_arguments_that_do_not_fit_are_refused(srv):
    body = refused(srv, "TA", {"name": "tiny", "args": {"depth": 3}})
    assert "depth" in body["reason"] and "width" in body["reason"]
    assert "hiddn" in refused(srv, "TA2", {"name": "digits", "args": {"hiddn": [8]}})["reason"]
    broken = checked(srv.http.put(srv.req("TB"), json=request_body("TB", job({"name": "broken"}),
                                                                   termination={"iterations": 2})), 503)
    assert "sluice_ops_missing" in broken["reason"]


def test_a_registered_task_trains_to_completion(srv):
    checked(srv.http.put(srv.req("TR"), json=request_body("TR", job({"name": "tiny", "args": {"width": 12}}),
                                                          termination={"iterations": 2})), 201)
    done = srv.wait_status("TR", ("FINISHED", "CANCELLED"))
    assert vs(done, "sluice-job")["task"] == {"name": "tiny", "args": {"width": 12}}  # as the consumer sent it
    proc = srv.process_of("TR")
    assert proc["attributes"]["progressStatus"]["status"] == "FINISHED", proc
    report = srv.get(srv.dn(proc["attributes"]["trainingReportRef"]))
    r = vs(report, "sluice-report")
    assert r["iterations"] == 2 and r["model"]["id"] == "local-tiny-TR"  # the task as named, and the request
    blob = srv.http.get(srv.dn(report["attributes"]["mLModelGeneratedRef"]),
                        headers={"Accept": "application/octet-stream"})
    assert blob.status_code == 200 and len(blob.content) > 1000
    # changing the job to an import path is refused too, and leaves the request as it was
    srv.patch(srv.req("TR"), {"VsDataContainer": [{"id": "sluice-job", "attributes": {"vsData": {
        "task": {"name": None, "factory": "os:system"}}}}]}, 400)
    assert vs(srv.get(srv.req("TR")), "sluice-job")["task"]["name"] == "tiny"


def test_a_builtin_task_works(srv):
    checked(srv.http.put(srv.req("TD"), json=request_body("TD", job({"name": "digits", "args": {"hidden": [8]}}),
                                                          termination={"iterations": 2})), 201)
    srv.wait_status("TD", ("FINISHED", "CANCELLED"))
    proc = srv.process_of("TD")
    assert proc["attributes"]["progressStatus"]["status"] == "FINISHED", proc
    r = vs(srv.get(srv.dn(proc["attributes"]["trainingReportRef"])), "sluice-report")
    assert r["iterations"] == 2 and r["model"]["id"] == "local-digits-TD"


def test_the_registry_is_checked_when_the_service_starts():
    from sluice.errors import ConfigError
    from sluice.service.config import load_service_config

    assert load_service_config(None, ['tasks.mine="pkg.mod:fn"']).tasks == {"mine": "pkg.mod:fn"}
    for bad in ('tasks.digits="pkg.mod:fn"', 'tasks.mine="pkg.mod"', 'tasks.mine="pkg mod:fn"'):
        with pytest.raises(ConfigError, match="tasks"):
            load_service_config(None, [bad])


def test_a_split_request_trains_a_registered_task_on_the_parties_own_tables(srv):
    """Every party of the producer's split training calls the registered function with its own name; the
    report says how many ids the tables share."""
    split = {"engine": "split", "seed": 0, "train": {"epochs": 1, "optimizer": "adam", "lr": 0.01},
             "transport": {"kind": "inproc"}, "task": {"name": "vertical", "args": {"tables": str(srv.tables)}}}
    body = checked(srv.http.put(srv.req("TS"), json=request_body("TS", {**split, "task": {
        "factory": "task:vertical"}}, termination={"iterations": 4})), 400)
    assert "import path" in body["reason"] and "classification" in body["reason"]  # split's own built-ins
    checked(srv.http.put(srv.req("TS"), json=request_body("TS", split, termination={"iterations": 4})), 201)
    srv.wait_status("TS", ("FINISHED", "CANCELLED"))
    proc = srv.process_of("TS")
    assert proc["attributes"]["progressStatus"]["status"] == "FINISHED", proc
    r = vs(srv.get(srv.dn(proc["attributes"]["trainingReportRef"])), "sluice-report")
    assert r["iterations"] == 4 and 0 < r["data"]["aligned_samples"] < r["data"]["table_rows"]["leader"]
