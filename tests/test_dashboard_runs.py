"""``sluice dashboard RUNS_DIR`` in a real browser, on run directories of ``sluice run`` being written.

A short dense FedAvg run and a longer one of Sluice's compression are started at once into one folder; the
page shows both, the longer one's curve gains points while it writes, it ends FINISHED with its cause, the
per-client table comes from its report, and the two runs are compared on one chart (accuracy against bytes).
The run directories' reading is also checked without a browser: a half-written line is taken only once
complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from sluice.dashboard.runs_source import RunsSource
from test_dashboard_service import CHROMIUM, WAIT_MS, needs_chromium, shot
from test_service_support import free_port

RUN_SETS = ["--set", "data.num_clients=5", "--set", "model.hidden=[16]"]


def _start(cmd: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "sluice", *cmd], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@contextlib.contextmanager
def dashboard(runs: Path, tmp: Path) -> Any:
    port = free_port()
    proc = _start(["dashboard", str(runs), "--port", str(port)], tmp, tmp / "dashboard.log")
    root = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            assert proc.poll() is None, (tmp / "dashboard.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(root + "/dashboard/api/info", timeout=5).status_code == 200:
                    break
            assert time.monotonic() - t0 < 60, "sluice dashboard did not answer within 60 s"
            time.sleep(0.1)
        yield root
    finally:
        _stop(proc)


@pytest.mark.slow
@pytest.mark.timeout(600)
@needs_chromium
def test_runs_being_written_are_shown_live_and_compared(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    short = _start(["run", "--out", str(runs / "dense"), *RUN_SETS, "--set", "train.rounds=30", "--set",
                    "compression.up=dense", "--set", "compression.down=dense"], tmp_path, tmp_path / "dense.log")
    long = _start(["run", "--out", str(runs / "sluice"), *RUN_SETS, "--set", "train.rounds=400"], tmp_path,
                  tmp_path / "sluice.log")
    try:
        with dashboard(runs, tmp_path) as root, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(WAIT_MS)
                page.goto(root + "/")
                expect(page.locator("#conn")).to_have_attribute("data-state", "live")
                row = page.locator('#procs tbody tr[data-id="sluice"]')
                expect(row).to_be_visible()
                row.get_by_role("button", name="sluice").click()
                page.wait_for_function("() => +document.querySelector('#c-metrics').dataset.points >= 2")
                first = int(page.locator("#c-metrics").get_attribute("data-points"))
                page.wait_for_function("n => +document.querySelector('#c-metrics').dataset.points > n", arg=first)
                assert long.poll() is None, "the run ended before the page saw it grow"
                expect(page.locator("#d-facts [data-fact=engine] dd")).to_have_text("hfl")
                expect(page.locator("#f-party")).to_be_visible()  # participants and dropped per round
                expect(page.locator('#procs tbody tr[data-id="dense"]')).to_have_attribute("data-status", "FINISHED")
                expect(row).to_have_attribute("data-status", "FINISHED", timeout=300_000)
                expect(page.locator("#d-end")).to_contain_text("CRITERION_MET")
                expect(page.locator("#clients tbody tr[data-client]")).to_have_count(5)
                expect(page.locator("#controls")).to_be_hidden()  # a run directory has no ProvMnS to PATCH
                for rid in ("dense", "sluice"):
                    page.get_by_role("checkbox", name=f"compare {rid}").check()
                expect(page.locator("#cmp-chart")).to_have_attribute("data-series", "2")
                assert int(page.locator("#cmp-chart").get_attribute("data-points")) >= 400
                shot(page, "dashboard-compare.png")
                page.set_viewport_size({"width": 420, "height": 800})  # narrow: nothing wider than the window
                wide = page.evaluate("() => document.documentElement.scrollWidth")
                assert wide <= 420 + 1
            finally:
                browser.close()
        assert short.wait(120) == 0 and long.wait(120) == 0
    finally:
        _stop(short)
        _stop(long)


def test_a_line_being_written_is_read_once_complete(tmp_path: Path) -> None:
    run = tmp_path / "r1"
    run.mkdir()
    events: list[dict[str, Any]] = []
    src = RunsSource(tmp_path, events.append)
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_accuracy": 0.5, "cum_bytes_up": 10,
                                                   "cum_bytes_down": 20, "bytes_up": 10, "remaining_s": 3.0})
                                       + "\n" + '{"round": 2, "te',
                                       encoding="utf-8")
    src._scan()
    view = src.detail("r1", None)
    assert view is not None and view["columns"]["iteration"] == [1]
    assert "bytes_up" not in view["columns"] and "remaining_s" not in view["columns"]
    assert view["columns"]["cum_bytes_down"] == [20]
    with open(run / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('st_accuracy": 0.7, "cum_bytes_up": 30, "cum_bytes_down": 40}\n')
    with src._lock:
        changed, new = src._runs["r1"].refresh()
    assert changed and [p["iteration"] for p in new] == [2] and new[0]["test_accuracy"] == 0.7
    (run / "status.json").write_text(json.dumps({"status": "RUNNING", "iterations": 2, "metrics": {}}),
                                     encoding="utf-8")
    with src._lock:
        changed, new = src._runs["r1"].refresh()
    assert changed and new == [] and src.detail("r1", None)["status"] == "RUNNING"
