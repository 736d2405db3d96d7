"""A service killed with SIGKILL together with its workers, restarted on the same database: everything is
still there, the interrupted process resumes from its last checkpoint and ends as an uninterrupted run would
have, and every notification reaches its subscriber in order and once, but for the one whose POST was in
flight at the kill, which may come again with its notificationId (at least once); SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from typing import Any

import psutil
import pytest
import sqlalchemy as sa

from test_service_support import (
    NOTIFY_SCHEMA,
    Receiver,
    Server,
    check,
    checked,
    request_body,
    start_server,
    stop_server,
)

pytestmark = pytest.mark.slow

EVERY = 5
ITERATIONS = 100
JOB = {"engine": "local", "seed": 0, "train": {"iterations": 5, "batch_size": 32, "lr": 0.05},
       "model": {"hidden": [64]}}


def kill_all(srv: Server) -> list[int]:
    """SIGKILL the server and every process below it at once (no one gets to clean up); wait until gone."""
    tree = [srv.proc.pid] + [c.pid for c in psutil.Process(srv.proc.pid).children(recursive=True)]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(srv.proc.pid, signal.SIGKILL)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    srv.proc.wait(10)
    srv.http.close()
    t0 = time.monotonic()
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in tree[1:]):
        assert time.monotonic() - t0 < 10, "processes survived SIGKILL"
        time.sleep(0.05)
    return tree


def stored(url: str, sql: str, **params: Any) -> list[Any]:
    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            return list(c.execute(sa.text(sql), params))
    finally:
        eng.dispose()


def uninterrupted() -> dict[str, float]:
    """The final metrics of the same job trained in one go, in this process."""
    from sluice.control import TrainingProcess
    from sluice.runtimes.jobs import job_from_dict

    job = job_from_dict("local", {k: v for k, v in JOB.items() if k != "engine"})
    engine = job.build()
    return TrainingProcess(engine, {"iterations": ITERATIONS}, None, job.model).run().performance


def test_restart_after_sigkill_resumes_from_the_checkpoint(tmp_path, db_url):
    rec = Receiver()
    extra = ("--set", f"checkpoint_every={EVERY}")
    srv = start_server(tmp_path, name="kill", database=db_url, extra=extra)
    srv2 = None
    try:
        sub = srv.uri("SubNetwork=SN1/NtfSubscriptionControl=W")
        checked(srv.http.put(sub, json={"id": "W", "attributes": {"notificationRecipientAddress": rec.url}}), 201)
        checked(srv.http.put(srv.req("Q"), json=request_body("Q", JOB, termination={"iterations": 1})), 201)
        srv.wait_status("Q", ("FINISHED",))
        checked(srv.http.put(srv.req("L"), json=request_body("L", JOB, termination={"iterations": ITERATIONS})),
                201)
        proc_ldn = "SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingProcess=L-1"
        t0 = time.monotonic()
        while not stored(db_url, "SELECT iteration FROM checkpoint WHERE process_dn = :p AND iteration >= 10",
                         p=proc_ldn):
            assert time.monotonic() - t0 < 40, f"no checkpoint of iteration >= 10 was stored\n{srv.log_text()}"
            time.sleep(0.02)
        before = {u: srv.get(srv.uri(u)) for u in (
            "SubNetwork=SN1/NtfSubscriptionControl=W", "SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingRequest=Q",
            "SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingRequest=L")}
        kill_all(srv)

        ((ckpt,),) = stored(db_url, "SELECT iteration FROM checkpoint WHERE process_dn = :p", p=proc_ldn)
        ((vs,),) = stored(db_url, "SELECT vs_data FROM moi WHERE dn = :p", p=proc_ldn)  # what it had stored
        vs = vs if isinstance(vs, dict) else json.loads(vs)
        reported = vs["sluice-status"]["iterations"]
        assert ckpt % EVERY == 0 and ckpt <= reported < ITERATIONS
        assert reported - ckpt <= EVERY, "the iterations repeated exceed the checkpoint interval"
        ids_before = {n["notificationId"] for n in rec.got}

        srv2 = start_server(tmp_path, name="kill", port=srv.port, database=db_url, extra=extra)
        for u, doc in before.items():
            if "Request=L" not in u:
                assert srv2.get(srv2.uri(u)) == doc
        assert srv2.get(srv2.req("L"))["attributes"]["requestStatus"] == "IN_PROGRESS"
        done = srv2.wait_status("L", ("FINISHED", "CANCELLED"), timeout=60)
        assert done["attributes"]["requestStatus"] == "FINISHED"
        proc = srv2.get(srv2.uri(proc_ldn))
        assert proc["attributes"]["progressStatus"]["status"] == "FINISHED"
        report = srv2.get(srv2.dn(proc["attributes"]["trainingReportRef"]))
        rep = next(c["attributes"]["vsData"] for c in report["VsDataContainer"] if c["id"] == "sluice-report")
        assert (rep["cause"], rep["iterations"], rep["criterion"]["rule"]) == ("CRITERION_MET", ITERATIONS,
                                                                               "iterations")
        assert rep["performance"] == uninterrupted(), "the resumed run differs from an uninterrupted one"
        assert not stored(db_url, "SELECT process_dn FROM checkpoint"), "an ended process keeps its checkpoint"

        rec.wait(lambda n: n["href"].endswith("MLTrainingReport=L-1"))
        t0 = time.monotonic()
        while stored(db_url, "SELECT id FROM notification WHERE delivered_at IS NULL AND dropped = :f", f=False):
            assert time.monotonic() - t0 < 20, "notifications were not delivered"
            time.sleep(0.05)
        ids = [n["notificationId"] for n in rec.got]
        once = list(dict.fromkeys(ids))
        assert once == sorted(once), "notifications came out of order"
        twice = sorted({i for i in ids if ids.count(i) > 1})
        assert twice in ([], [max(ids_before)]), (  # at least once: only the one in flight at the kill
            f"notifications {twice} came twice; only {max(ids_before)} was in flight when the service died")
        assert {i for (i,) in stored(db_url, "SELECT id FROM notification")} == set(ids), "a notification was lost"
        assert min(set(ids) - ids_before) > max(ids_before)
        pcts = [c[0]["progressStatus"]["progressPercentage"] for n in rec.of(href_contains="MLTrainingProcess=L-1",
                                                                              ntype="notifyMOIAttributeValueChanges")
                for c in [n["attributeListValueChanges"]] if "progressPercentage" in c[0].get("progressStatus", {})]
        assert pcts == sorted(pcts) and pcts[-1] == 100, f"repeated iterations were notified again: {pcts}"
        for n in rec.got:
            check(NOTIFY_SCHEMA[n["notificationType"]], n)
    finally:
        if srv2 is not None:
            stop_server(srv2)
        stop_server(srv, kill=True)
        rec.close()


def test_a_process_waiting_to_resume_is_cancelled_with_its_checkpointed_iterations(tmp_path):
    """After a restart with room for one process, the second interrupted one waits in the queue to resume;
    cancelling it ends it CANCELLED with the iterations of its checkpoint, not 0."""
    extra = ("--set", "checkpoint_every=2")
    srv = start_server(tmp_path, name="wait", extra=extra)
    try:
        for rid in ("W1", "W2"):
            checked(srv.http.put(srv.req(rid), json=request_body(rid, JOB, termination={"iterations": 100_000},
                                                                 decided_by="consumer")), 201)
        for rid in ("W1", "W2"):
            srv.wait_for(srv.proc_uri(f"{rid}-1"), lambda p: next(
                c["attributes"]["vsData"] for c in p["VsDataContainer"] if c["id"] == "sluice-status"
            ).get("iterations", 0) >= 3, timeout=120)
        kill_all(srv)
        srv = start_server(tmp_path, name="wait", port=srv.port, database=srv.database,
                           extra=(*extra, "--set", "max_concurrent=1"))
        t0 = time.monotonic()
        while True:  # one of the two resumes, the other waits in the queue
            queued = [dn.rpartition("=")[2].removesuffix("-1") for dn, internal in stored(
                srv.database, "SELECT dn, internal FROM moi WHERE object_class = 'MLTrainingProcess'")
                if json.loads(internal).get("phase") == "queued"]
            if len(queued) == 1 or time.monotonic() - t0 > 60:
                break
            time.sleep(0.1)
        (waiting,) = queued
        ckpt = stored(srv.database, "SELECT iteration FROM checkpoint WHERE process_dn LIKE :dn",
                      dn=f"%MLTrainingProcess={waiting}-1")[0][0]
        srv.patch(srv.req(waiting), {"attributes": {"cancelRequest": True}})
        srv.wait_status(waiting, ("CANCELLED",))
        proc = srv.get(srv.proc_uri(f"{waiting}-1"))
        report = srv.get(srv.dn(proc["attributes"]["trainingReportRef"]))
        rep = next(c["attributes"]["vsData"] for c in report["VsDataContainer"] if c["id"] == "sluice-report")
        assert ckpt >= 2 and rep["iterations"] == ckpt
        assert f"waiting to resume from the checkpoint of iteration {ckpt}" in rep["detail"]
    finally:
        stop_server(srv)


def test_a_split_process_resumes_with_its_followers_state(tmp_path):
    """A split job with followers in their own processes (gRPC), killed with the service: after the restart
    new follower processes get their state over their links and training goes on from the checkpoint."""
    job = {"engine": "split", "seed": 0, "data": {"dataset": "breast_cancer"},
           "train": {"steps": 100_000, "batch_size": 32, "eval_every": 50}}
    extra = ("--set", "checkpoint_every=10")
    srv = start_server(tmp_path, name="split", extra=extra)
    try:
        checked(srv.http.put(srv.req("S1"), json=request_body("S1", job, termination={"iterations": 100_000},
                                                              decided_by="consumer")), 201)

        def iterations(p: dict[str, Any]) -> int:
            return next(c["attributes"]["vsData"] for c in p["VsDataContainer"]
                        if c["id"] == "sluice-status").get("iterations", 0)

        srv.wait_for(srv.proc_uri("S1-1"), lambda p: iterations(p) >= 25, timeout=180)
        kill_all(srv)
        ((ckpt,),) = stored(srv.database, "SELECT iteration FROM checkpoint")
        srv = start_server(tmp_path, name="split", port=srv.port, database=srv.database, extra=extra)
        # progress is stored at most every progress_interval_s: the store may lag behind the checkpoint
        seen = max(ckpt, iterations(srv.get(srv.proc_uri("S1-1"))))
        srv.wait_for(srv.proc_uri("S1-1"), lambda p: iterations(p) > seen + 5, timeout=180)
        srv.patch(srv.req("S1"), {"attributes": {"cancelRequest": True}})
        srv.wait_status("S1", ("CANCELLED",), timeout=60)
        report = srv.get(srv.dn(srv.get(srv.proc_uri("S1-1"))["attributes"]["trainingReportRef"]))
        rep = next(c["attributes"]["vsData"] for c in report["VsDataContainer"] if c["id"] == "sluice-report")
        # a checkpoint that cannot be restored fails the process; this one was restored and went on
        assert rep["cause"] == "CANCELLED" and 20 <= ckpt <= seen < rep["iterations"]
    finally:
        stop_server(srv)
