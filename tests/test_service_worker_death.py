"""A worker killed alone (SIGKILL of the worker process, the service running on) does not fail its process: the
process resumes from its last checkpoint, as after a restart of the service; a worker that keeps dying fails it
after ``worker_restarts`` resumed runs."""

from __future__ import annotations

import signal
import time
from typing import Any

import psutil
import pytest
import sqlalchemy as sa

from test_service_support import Server, checked, request_body, running_server

pytestmark = pytest.mark.slow

JOB = {"engine": "local", "seed": 0, "train": {"iterations": 5, "batch_size": 32, "lr": 0.05},
       "model": {"hidden": [32]}}


def status(p: dict[str, Any]) -> dict[str, Any]:
    return next(c["attributes"]["vsData"] for c in p["VsDataContainer"] if c["id"] == "sluice-status")


def checkpoint_of(srv: Server, pid: str) -> int | None:
    eng = sa.create_engine(srv.database)
    try:
        with eng.connect() as c:
            row = c.execute(sa.text("SELECT iteration FROM checkpoint WHERE process_dn LIKE :p"),
                            {"p": f"%MLTrainingProcess={pid}"}).first()
    finally:
        eng.dispose()
    return None if row is None else int(row[0])


def workers(srv: Server) -> list[psutil.Process]:
    """The training workers: the children of the forkserver the service started (not the forkserver itself,
    not a short-lived probe, which exits by itself)."""
    forkservers = [p for p in psutil.Process(srv.proc.pid).children() if "forkserver" in " ".join(p.cmdline())]
    return [c for f in forkservers for c in f.children()]


def kill_worker(srv: Server) -> int:
    t0 = time.monotonic()
    while not (found := workers(srv)):
        assert time.monotonic() - t0 < 30, f"no worker found\n{srv.log_text()}"
        time.sleep(0.05)
    (worker,) = found
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    return worker.pid


def test_a_killed_worker_resumes_from_its_checkpoint(tmp_path):
    extra = ("--set", "checkpoint_every=3", "--set", "max_concurrent=1")
    with running_server(tmp_path, name="wd", extra=extra) as srv:
        checked(srv.http.put(srv.req("WD"), json=request_body("WD", JOB, termination={"iterations": 100_000})), 201)
        uri = srv.proc_uri("WD-1")
        t0 = time.monotonic()
        while (ckpt := checkpoint_of(srv, "WD-1")) is None or ckpt < 6:
            assert time.monotonic() - t0 < 60, f"no checkpoint\n{srv.log_text()}"
            time.sleep(0.05)
        old = kill_worker(srv)
        seen = status(srv.get(uri))["iterations"]
        resumed = srv.wait_for(uri, lambda p: p["attributes"]["progressStatus"]["status"] == "RUNNING"
                               and status(p)["iterations"] > seen + 3, timeout=60)
        assert resumed["attributes"]["progressStatus"]["status"] == "RUNNING"
        assert srv.get(srv.req("WD"))["attributes"]["requestStatus"] == "IN_PROGRESS"
        assert old not in [w.pid for w in workers(srv)]
        srv.patch(srv.req("WD"), {"attributes": {"cancelRequest": True}})
        srv.wait_status("WD", ("CANCELLED",))
        report = srv.get(srv.dn(srv.get(uri)["attributes"]["trainingReportRef"]))
        rep = next(c["attributes"]["vsData"] for c in report["VsDataContainer"] if c["id"] == "sluice-report")
        assert rep["cause"] == "CANCELLED" and rep["iterations"] > seen


def test_a_worker_that_keeps_dying_fails_its_process(tmp_path):
    extra = ("--set", "checkpoint_every=2", "--set", "max_concurrent=1", "--set", "worker_restarts=1")
    with running_server(tmp_path, name="wd2", extra=extra) as srv:
        checked(srv.http.put(srv.req("WK"), json=request_body("WK", JOB, termination={"iterations": 100_000})), 201)
        uri = srv.proc_uri("WK-1")
        for _ in range(2):
            srv.wait_for(uri, lambda p: p["attributes"]["progressStatus"]["status"] == "RUNNING"
                         and p["attributes"]["progressStatus"]["progressStateInfo"] != "RESUMING", timeout=60)
            kill_worker(srv)
        done = srv.wait_for(uri, lambda p: p["attributes"]["progressStatus"]["status"] == "FAILED", timeout=60)
        assert done["attributes"]["progressStatus"]["resultStateInfo"] == "ENGINE_FAILURE"
        assert "after 1 resumed runs" in status(done)["detail"]
