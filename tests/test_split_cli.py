"""``sluice split``: leader and followers as separate processes over loopback gRPC."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sluice.cli import main
from sluice.errors import SluiceError
from sluice.runs import read_metrics
from sluice.split import SplitConfig, SplitEngine


def test_split_run_end_to_end(tmp_path):
    out = tmp_path / "run"
    rc = main(["split", "run", "--out", str(out), "--set", "train.steps=6", "--set", "train.eval_every=3",
               "--set", "transport.timeout_s=20"])
    assert rc == 0
    for name in ("config.toml", "metrics.jsonl", "steps.jsonl", "summary.json", "report.json", "status.json",
                 "follower-1.log", "loss.png", "model.pt"):
        assert (out / name).is_file(), name
    recs = read_metrics(out / "metrics.jsonl")
    steps = read_metrics(out / "steps.jsonl")
    assert [r["step"] for r in recs] == [r["step"] for r in steps] == list(range(6))
    for r, full in zip(recs, steps, strict=True):
        assert r["bytes_up"] == full["bytes_up"] > 0 and r["bytes_down"] == full["bytes_down"] > 0
        assert r["train_loss"] == full["loss"] and r["seconds"] > 0
        assert set(full["idle_s"]) == {"leader", "follower-1"}
        assert r["idle_leader_s"] == full["idle_s"]["leader"]
    assert {r["step"] for r in recs if "test_auc" in r} == {2, 5}
    s = json.loads((out / "summary.json").read_text())
    assert s["topology"] == "6" and s["task"] == "breast_cancer" and s["steps"] == 6
    assert s["aligned_samples"] == 569 and s["table_rows"] == {"leader": 569, "follower-1": 569}
    assert s["psi"]["follower-1"]["common"] == 569
    assert s["total_bytes_up"] == sum(r["bytes_up"] for r in recs)
    # what crossed the wire = steps + setup + the goodbye: counted by the link, independently
    link = s["link_bytes"]["follower-1"]
    assert link["bytes_received"] >= s["total_bytes_up"] + s["setup_bytes_up"]
    assert link["bytes_sent"] >= s["total_bytes_down"] + s["setup_bytes_down"]
    assert 0.5 < s["final_test_accuracy"] <= 1.0
    report = json.loads((out / "report.json").read_text())
    assert report["cause"] == "CRITERION_MET" and report["iterations"] == 6
    assert report["performance"]["test_auc"] == s["final_test_auc"]
    assert json.loads((out / "status.json").read_text())["status"] == "FINISHED"
    log = (out / "follower-1.log").read_text()
    assert "trained 6 steps" in log


def test_split_run_stops_at_termination_iterations(tmp_path):
    """The control plane's iteration limit replaces the planned 240 steps: exactly 5, with a report."""
    out = tmp_path / "run"
    assert main(["split", "run", "--out", str(out), "--set", "termination.iterations=5",
                 "--set", "model.id=bc-split", "--set", "transport.timeout_s=20"]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(5))
    report = json.loads((out / "report.json").read_text())
    assert report["iterations"] == 5 and report["criterion"]["rule"] == "iterations"
    assert report["model"]["id"] == "bc-split"
    assert "test_accuracy" in report["performance"]  # the last step of the plan is evaluated
    assert "trained 5 steps" in (out / "follower-1.log").read_text()


def test_split_run_target_stops_the_follower_process_early(tmp_path):
    """A target met long before the planned steps: the follower process stops at once and exits cleanly. Its
    log's "trained n steps" says it stopped at the leader's last step, told to by the leader: a follower left
    waiting would end with an error after its 20 s receive timeout, and write no such line."""
    out = tmp_path / "run"
    rc = main(["split", "run", "--out", str(out), "--set", "train.eval_every=2", "--set", "train.steps=2000",
               "--set", "termination.performance.test_accuracy=0.8", "--set", "transport.timeout_s=20"])
    assert rc == 0
    n = len(read_metrics(out / "metrics.jsonl"))
    assert n < 2000 and n % 2 == 0
    assert json.loads((out / "report.json").read_text())["criterion"]["rule"] == "performance.test_accuracy"
    assert f"trained {n} steps" in (out / "follower-1.log").read_text()


def test_split_run_refuses_what_split_training_cannot_report(capsys, tmp_path):
    out = tmp_path / "x"
    assert main(["split", "run", "--out", str(out), "--set", "termination.performance.test_mse=0.1"]) == 2
    assert "test_auc" in capsys.readouterr().err  # the message names what it reports
    assert not out.exists()


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


@pytest.mark.parametrize("sig,stall_timeout_s", [(signal.SIGKILL, None), (signal.SIGSTOP, 3.0)])
def test_dead_or_stalled_follower_process_gives_a_clear_error(tmp_path, sig, stall_timeout_s):
    """A follower process killed, or stopped, at step 5: the leader says so within seconds. For the stall, the
    leader's receive timeout is cut to 3 s only then (a loaded machine may keep a healthy follower's first
    steps, its start and its profiling, waiting longer than that)."""
    p, addr = _spawn_follower(tmp_path)
    hit = {}
    engine = SplitEngine(_leader_cfg(30.0), connect=[addr])
    try:
        with pytest.raises(SluiceError) as info:
            try:
                for _ in range(400):
                    if engine.iterate().iteration == 5:
                        if stall_timeout_s is not None:
                            assert engine.leader is not None
                            engine.leader.timeout_s = stall_timeout_s
                        hit["t"] = time.perf_counter()
                        os.kill(p.pid, sig)
            finally:
                engine.stop()
        waited = time.perf_counter() - hit["t"]
        msg = str(info.value)
        if sig == signal.SIGSTOP:
            assert "stalled or died" in msg and stall_timeout_s * 0.9 <= waited < stall_timeout_s + 12, (waited, msg)
        else:
            assert ("failed" in msg or "closed" in msg) and waited < 12, (waited, msg)
    finally:
        p.kill()
        p.wait(10)


def test_leader_stopping_early_ends_the_follower_process_cleanly(tmp_path):
    """Termination fires after 7 of the 400 proposed steps: the follower process stops at once, says it
    trained 7 steps and exits 0 (it does not wait for the planned steps or its stall timeout: a follower that
    waited out its 30 s timeout would end with an error, not this line and status 0)."""
    from sluice.control.process import train

    p, addr = _spawn_follower(tmp_path, timeout_s=30.0)
    try:
        engine = SplitEngine(_leader_cfg(30.0), connect=[addr])
        assert engine.default_iterations == 400
        report = train(engine, {"iterations": 7})
        assert report.iterations == 7 and len(engine.records) == 7
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0, out
        assert "trained 7 steps" in out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_party_leader_trains_under_the_control_plane(tmp_path):
    p, addr = _spawn_follower(tmp_path)
    out = tmp_path / "lead"
    try:
        rc = main(["split", "party", "--role", "leader", "--connect", addr, "--out", str(out),
                   "--set", "train.steps=50", "--set", "termination.iterations=4", "--set", "model.version=3"])
        assert rc == 0
        report = json.loads((out / "report.json").read_text())
        assert report["iterations"] == 4 and report["model"]["version"] == "3"
        assert len(read_metrics(out / "steps.jsonl")) == 4
        assert json.loads((out / "summary.json").read_text())["steps"] == 4
        text, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and "trained 4 steps" in text
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    with pytest.raises(SluiceError, match="2 addresses"):
        SplitEngine(SplitConfig(), connect=["127.0.0.1:1", "127.0.0.1:2"])


@pytest.mark.parametrize("fail", [False, True])
def test_engine_ends_the_follower_processes_it_started(tmp_path, fail):
    cfg = SplitConfig.model_validate({"followers": 2, "train": {"steps": 100}, "pipeline": {"groups": 2},
                                      "transport": {"timeout_s": 20}})
    engine = SplitEngine(cfg, run_dir=tmp_path)
    engine.start()
    assert engine._procs is not None
    procs = list(engine._procs.procs)
    assert len(procs) == 2 and all(p.poll() is None for p in procs)
    try:
        engine.iterate()
        if fail:
            assert engine.leader is not None
            engine.leader.run_step = lambda: (_ for _ in ()).throw(RuntimeError("leader broke"))
            with pytest.raises(RuntimeError, match="leader broke"):
                engine.iterate()
    finally:
        engine.stop()
    assert all(p.poll() is not None for p in procs)
    logs = [(tmp_path / f"follower-{i}.log").read_text() for i in (1, 2)]
    codes = [p.returncode for p in procs]
    if fail:
        assert all("leader broke" in log for log in logs), (codes, logs)
    else:
        assert codes == [0, 0] and all("trained 1 steps" in log for log in logs), (codes, logs)


def test_follower_reports_a_vanished_leader(tmp_path):
    """The follower side of 'never a hang': its leader disappears right after the proposal."""
    import threading

    from sluice.split.engine import party_task
    from sluice.split.plan import agree_rows, hello_for, make_plan, proposal_for
    from sluice.split.runner import serve_follower
    from sluice.transport.grpc_link import connect
    from sluice.wire.tensor import ControlMsg, decode, encode_control

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
    link.send(encode_control("hello", hello_for(cfg, "follower-1")))
    assert decode(link.recv(20)) == ControlMsg("ready", {"rows": 569, "params": 1200, "out_shape": [16]})
    table = party_task(cfg, "leader").table
    plan = make_plan(cfg, *agree_rows(cfg, table, np.arange(len(table.ids))))
    link.send(encode_control("propose", proposal_for(plan, 0, 2, tls=False, allow_batch_coupled=False)))
    accept = {"name": "follower-1", "secure": False}
    assert decode(link.recv(20)) == ControlMsg("accept", accept)
    t0 = time.perf_counter()
    link.abort()  # the leader process is gone
    th.join(10)
    assert not th.is_alive()
    assert "failed" in str(out["error"]) or "closed" in str(out["error"])
    assert out["t"] - t0 < 5


def test_a_send_after_the_leader_left_reports_the_leaders_failure(tmp_path):
    """The race behind a follower that logged "the peer closed the stream" instead of the leader's error: the
    leader sends ``error`` and closes the stream while the follower computes; its reader thread takes both,
    and the follower's next send finds the stream ended. The leader's reason is what the follower reports."""
    from sluice.errors import TrainingError
    from sluice.split.party import Worker
    from sluice.transport.grpc_link import GrpcListener, connect
    from sluice.wire.tensor import encode_control

    lis = GrpcListener("127.0.0.1:0")
    try:
        leader = connect(lis.address, 10)
        link = lis.accept(10)
        follower = Worker("follower", {"leader": link}, timeout_s=20, threshold=1 << 20)
        leader.send(encode_control("error", {"message": "RuntimeError: leader broke"}))
        leader.close()
        assert link._done.wait(20), "the follower's end did not see the stream end"
        with pytest.raises(TrainingError, match="leader failed: RuntimeError: leader broke"):
            follower.send_control("leader", "step_done", {"step": 1}, step=1)
    finally:
        lis.close(0.5)
