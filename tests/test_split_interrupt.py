"""Ctrl-C in a terminal during ``sluice split run``: SIGINT reaches the whole foreground process group, the
leader and the follower processes it started. The run ends as cancelled (exit 130, a ``CANCELLED`` report and
the model so far), and no process of the group is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest


def _group(pgid: int) -> list[psutil.Process]:
    """The live processes of process group ``pgid`` (zombies are already gone as far as a user is concerned)."""
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def _steps(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_to_the_process_group_cancels_the_run_with_its_report_and_model(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "sluice", "split", "run", "--out", str(out), "--set", "train.epochs=500",
            "--set", "transport.timeout_s=60"]
    log = tmp_path / "split.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "COLUMNS": "160"})
    pgid = proc.pid
    try:
        end = time.monotonic() + 180
        while _steps(out) < 3:  # trained some steps: the follower processes are up and serving
            assert proc.poll() is None, f"sluice split run ended early ({proc.returncode}):\n{log.read_text()[-4000:]}"
            assert time.monotonic() < end, f"no 3 steps after 180 s:\n{log.read_text()[-4000:]}"
            time.sleep(0.1)
        followers = [p for p in _group(pgid) if p.pid != proc.pid]
        assert followers, "the follower processes are in the run's process group"
        os.killpg(pgid, signal.SIGINT)  # what Ctrl-C in a terminal does
        try:
            rc = proc.wait(120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"sluice split run did not end after SIGINT:\n{log.read_text()[-4000:]}")
        text = log.read_text()
        assert rc == 130, text[-4000:]
        report = json.loads((out / "report.json").read_text())
        assert report["cause"] == "CANCELLED", report
        assert report["iterations"] >= 3
        assert (out / "model.pt").is_file()
        assert "KeyboardInterrupt" not in text and "Traceback" not in text, text[-4000:]
        assert "KeyboardInterrupt" not in (out / "follower-1.log").read_text()
        left = _group(pgid)
        assert not left, [p.cmdline() for p in left]
    finally:
        if proc.poll() is None:
            os.killpg(pgid, signal.SIGKILL)
            proc.wait(10)
        for p in _group(pgid):  # a follower that outlived its leader
            p.kill()
