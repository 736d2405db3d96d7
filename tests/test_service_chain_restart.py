"""A chain survives a restart of its cross-domain service: SIGKILL or SIGTERM of the service (its process alone,
as an operator or a crash would end it) leaves the domain producers' requests training, and the restarted service
follows them to their end; the chain ends as it would have without the restart."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil
import pytest

from test_service_chain import _producer_args, _sub_request
from test_service_support import Server, checked, request_body, start_server, stop_server

pytestmark = pytest.mark.slow

ITERATIONS = 120
"""The producers' budget: long enough that they still train when the chain's service goes (a few iterations
in), short enough for the test (about a tenth of a second an iteration on an idle core)."""
JOB = {"engine": "local", "seed": 0, "train": {"iterations": 5, "batch_size": 8, "lr": 0.05},
       "model": {"hidden": [256, 256]}}


def _iterations(proc: dict) -> int:
    st = next((c["attributes"]["vsData"] for c in proc.get("VsDataContainer", []) if c["id"] == "sluice-status"), {})
    return int(st.get("iterations") or 0)


def _end_service_alone(srv: Server, sig: int) -> None:
    """Send ``sig`` to the service's own process (not its group) and wait until it and every process it had
    started (forkserver, the chain's worker) are gone: the worker ended by itself, as it does when its service
    goes away."""
    below = psutil.Process(srv.proc.pid).children(recursive=True)
    os.kill(srv.proc.pid, sig)
    srv.proc.wait(60)
    srv.http.close()
    t0 = time.monotonic()
    for p in below:
        with contextlib.suppress(psutil.NoSuchProcess):
            while p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                assert time.monotonic() - t0 < 60, f"{p.name()} ({p.pid}) outlived its service by 60 s"
                time.sleep(0.05)


@pytest.mark.parametrize("sig, every", [(signal.SIGKILL, 0), (signal.SIGTERM, 2)],
                         ids=["kill-9-without-checkpoint", "sigterm-from-checkpoint"])
def test_a_chain_survives_a_restart_of_its_service(tmp_path, sig, every):
    started = []
    try:
        east = start_server(tmp_path, name="east6")
        started.append(east)
        west = start_server(tmp_path, name="west6")
        started.append(west)
        args = (*_producer_args({"east": east.port, "west": west.port}, timeout_s=2.0),
                "--set", f"checkpoint_every={every}")
        cross = start_server(tmp_path, name="cross6", extra=args)
        started.append(cross)
        job = {"engine": "chain", "producers": ["east", "west"], "job": JOB, "poll_interval_s": 0.1}
        checked(cross.http.put(cross.req("C6"), json=request_body(
            "C6", job, termination={"iterations": ITERATIONS}, decided_by="consumer")), 201)
        pid = cross.process_of("C6")["id"]
        running = cross.wait_for(cross.proc_uri(pid), lambda p: _iterations(p) > every, timeout=120)
        assert running["attributes"]["progressStatus"]["status"] == "RUNNING"
        subs = {"east": _sub_request(east, "east")["id"], "west": _sub_request(west, "west")["id"]}

        _end_service_alone(cross, sig)
        for name, srv in (("east", east), ("west", west)):  # nothing cancelled them
            attrs = srv.get(srv.req(subs[name]))["attributes"]
            assert attrs["requestStatus"] in ("IN_PROGRESS", "FINISHED") and not attrs["cancelRequest"], (name, attrs)

        cross = start_server(tmp_path, name="cross6", port=cross.port, db=cross.db, extra=args)
        started.append(cross)
        cross.wait_status("C6", ("FINISHED", "CANCELLED"), timeout=300)
        proc = cross.process_of("C6")
        assert proc["id"] == pid  # the same process, resumed, not a new training
        ps = proc["attributes"]["progressStatus"]
        assert (ps["status"], ps["resultStateInfo"]) == ("FINISHED", "CRITERION_MET"), proc
        report = cross.get(cross.dn(proc["attributes"]["trainingReportRef"]))
        rep = next(c["attributes"]["vsData"] for c in report["VsDataContainer"] if c["id"] == "sluice-report")
        assert rep["cause"] == "CRITERION_MET" and rep["iterations"] == ITERATIONS, rep
        for name, srv in (("east", east), ("west", west)):
            assert f"{name} FINISHED CRITERION_MET after {ITERATIONS} iterations" in rep["detail"], rep["detail"]
            assert _sub_request(srv, name)["id"] == subs[name]  # followed, none created anew
            srv.wait_status(subs[name], ("FINISHED",), timeout=30)
            assert _iterations(srv.process_of(subs[name])) == ITERATIONS
    finally:
        for s in started:
            stop_server(s)
