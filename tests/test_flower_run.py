"""``sluice run --runtime flower``: the command starts its own local Flower deployment (real SuperLink and
SuperNode processes on 127.0.0.1 with TLS), runs a job whose termination criterion fires at the first round,
and leaves no Flower process behind; how it waits for the SuperLink to start the run. Apart from
tests/test_flower_deploy.py, whose tests share one deployment: these can run on other pytest-xdist workers at the
same time (see tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

TINY = ["data.num_clients=3", "train.participation=1.0", "model.hidden=[32]", "train.local_epochs=1"]


def _flower_processes_of(home: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("FLWR_HOME") == str(home):
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.mark.flower
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_sluice_run_on_flower_stops_when_a_criterion_fires(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "sluice", "run", "--runtime", "flower", "--out", str(out),
            *[x for kv in [*TINY, "data.num_clients=2", "train.rounds=6", "termination.performance.accuracy=0.01"]
              for x in ("--set", kv)]]
    env = {**os.environ, "COLUMNS": "160"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=420)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        for p in _flower_processes_of(out / "flower" / "flwr-home"):
            p.kill()
    assert proc.returncode == 0, text[-3000:]
    assert "DeprecationWarning" not in text, text[:3000]  # Flower's CLI dependencies' warnings are not shown
    report = json.loads((out / "report.json").read_text())
    assert report["cause"] == "CRITERION_MET" and report["iterations"] == 1
    assert report["criterion"]["rule"].startswith("performance"), report["criterion"]
    assert (out / "flower" / "certs" / "ca.pem").exists()
    counts = json.loads((out / "flower.json").read_text())
    assert counts["rounds"] == 1 and counts["superlink_outbound_bytes"] > counts["sluice_bytes_down"] > 0
    assert counts["flower_status"].startswith("finished")
    assert _flower_processes_of(out / "flower" / "flwr-home") == []  # every process it started is gone


def test_a_status_read_that_fails_keeps_the_status_read_before(monkeypatch, tmp_path: Path) -> None:
    """Waiting for a run to start, a ``flwr ls`` that fails (slower than its timeout on a busy machine) leaves the
    status read before it: the run is reported "pending", not "unknown"."""
    from sluice.runtimes.flower import runner

    reads = iter([{"status": "pending"}])
    monkeypatch.setattr(runner, "run_status", lambda *args, **kw: next(reads, {}))
    status = runner._await_start(tmp_path, 7, runner.FlowerOptions(start_timeout_s=0.3))
    assert status == {"status": "pending"}
