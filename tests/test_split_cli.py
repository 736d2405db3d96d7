"""``sluice split``: leader and followers as separate processes over loopback gRPC."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sluice.cli import main
from sluice.errors import SluiceError
from sluice.runs import read_metrics
from sluice.vfl import SplitConfig
from sluice.vfl.runner import run_leader


def test_split_run_end_to_end(tmp_path):
    out = tmp_path / "run"
    rc = main(["split", "run", "--out", str(out), "--set", "train.steps=6", "--set", "train.eval_every=3",
               "--set", "transport.timeout_s=20"])
    assert rc == 0
    for name in ("config.toml", "metrics.jsonl", "summary.json", "follower-1.log", "loss.png"):
        assert (out / name).is_file(), name
    recs = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs] == list(range(6))
    for r in recs:
        assert r["bytes_up"] > 0 and r["bytes_down"] > 0 and r["step_time_s"] > 0
        assert set(r["idle_s"]) == {"leader", "follower-1"}
    assert {r["step"] for r in recs if "test_auc" in r} == {2, 5}
    s = json.loads((out / "summary.json").read_text())
    assert s["topology"] == "6" and s["dataset"] == "breast_cancer" and s["steps"] == 6
    assert s["total_bytes_up"] == sum(r["bytes_up"] for r in recs)
    # what crossed the wire = steps + setup + the goodbye: counted by the link, independently
    link = s["link_bytes"]["follower-1"]
    assert link["bytes_received"] >= s["total_bytes_up"] + s["setup_bytes_up"]
    assert link["bytes_sent"] >= s["total_bytes_down"] + s["setup_bytes_down"]
    assert 0.5 < s["final_test_accuracy"] <= 1.0
    log = (out / "follower-1.log").read_text()
    assert "trained 6 steps" in log


def test_split_run_config_errors_exit_2(capsys, tmp_path):
    assert main(["split", "run", "--out", str(tmp_path / "x"), "--set", "pipeline.groups=0"]) == 2
    assert "pipeline.groups" in capsys.readouterr().err
    assert main(["split", "run", "--set", "topology=5", "--set", "followers=2"]) == 2
    assert "U-shape" in capsys.readouterr().err
    assert main(["split", "party", "--role", "leader"]) == 2
    assert "--connect" in capsys.readouterr().err


def _spawn_follower(tmp_path: Path, timeout_s: float = 20.0) -> tuple[subprocess.Popen, str]:
    cfg = tmp_path / "party.toml"
    cfg.write_text(f"[transport]\ntimeout_s = {timeout_s}\n")
    ready = tmp_path / "addr"
    cmd = [sys.executable, "-m", "sluice", "split", "party", "--role", "follower", "--listen", "127.0.0.1:0",
           "--ready-file", str(ready), "--accept-timeout", "30", "--parent-pid", str(os.getpid()), str(cfg)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    end = time.monotonic() + 60
    while not ready.exists():
        assert p.poll() is None, p.stdout.read()
        assert time.monotonic() < end, "follower did not start"
        time.sleep(0.05)
    return p, ready.read_text()


def _leader_cfg(timeout_s: float) -> SplitConfig:
    return SplitConfig.model_validate({
        "train": {"steps": 400, "eval_every": 0},
        "pipeline": {"groups": 2},
        "transport": {"timeout_s": timeout_s, "connect_timeout_s": 10},
    })


@pytest.mark.parametrize("sig,timeout_s,limit", [(signal.SIGKILL, 30.0, 8.0), (signal.SIGSTOP, 1.5, 8.0)])
def test_dead_or_stalled_follower_process_gives_a_clear_error(tmp_path, sig, timeout_s, limit):
    p, addr = _spawn_follower(tmp_path)
    hit = {}

    def on_record(rec):
        if rec["step"] == 5 and not hit:
            hit["t"] = time.perf_counter()
            os.kill(p.pid, sig)

    try:
        with pytest.raises(SluiceError) as info:
            run_leader(_leader_cfg(timeout_s), [addr], on_record)
        waited = time.perf_counter() - hit["t"]
        assert waited < limit
        msg = str(info.value)
        if sig == signal.SIGSTOP:
            assert "stalled or died" in msg and waited >= timeout_s * 0.9
        else:
            assert "failed" in msg or "closed" in msg
    finally:
        p.kill()
        p.wait(10)


def test_follower_reports_a_vanished_leader(tmp_path):
    """The follower side of 'never a hang': its leader disappears right after the proposal."""
    import threading

    from sluice.transport.grpc_link import connect
    from sluice.transport.wire import ControlMsg, decode, encode_control
    from sluice.vfl.runner import serve_follower
    from sluice.vfl.task import build_task, proposal_for

    cfg = SplitConfig.model_validate({"train": {"steps": 50}, "pipeline": {"groups": 2},
                                      "transport": {"timeout_s": 20}})
    ready = tmp_path / "addr"
    out: dict = {}

    def follower() -> None:
        try:
            serve_follower(cfg, "127.0.0.1:0", "follower-1", str(ready), accept_timeout=20)
        except SluiceError as exc:
            out["error"] = exc
            out["t"] = time.perf_counter()

    th = threading.Thread(target=follower, daemon=True)
    th.start()
    end = time.monotonic() + 20
    while not ready.exists() and time.monotonic() < end:
        time.sleep(0.02)
    link = connect(ready.read_text(), 10)
    link.send(encode_control("propose", proposal_for(build_task(cfg), 0, 2, tls=False)))
    accept = {"name": "follower-1", "params": 1200, "secure": False}
    assert decode(link.recv(20)) == ControlMsg("accept", accept)
    t0 = time.perf_counter()
    link.abort()  # the leader process is gone
    th.join(10)
    assert not th.is_alive()
    assert "failed" in str(out["error"]) or "closed" in str(out["error"])
    assert out["t"] - t0 < 5
