"""``sluice run`` end to end: run directory contents and user errors."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from sluice.cli import main

FAST = ["--set", "train.rounds=4", "--set", "data.num_clients=6", "--set", "model.hidden=[16]"]


def test_run_writes_a_complete_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *FAST]) == 0
    resolved = tomllib.loads((out / "config.toml").read_text())
    assert resolved["train"]["rounds"] == 4 and resolved["compression"]["downlink"] == "per-client"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lines] == [1, 2, 3, 4]
    for key in ("train_loss", "test_loss", "test_accuracy", "bytes_up", "bytes_down", "cum_bytes_up",
                "cum_bytes_down"):
        assert key in lines[0], key
    assert lines[-1]["cum_bytes_up"] == sum(r["bytes_up"] for r in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= {"final_accuracy", "best_accuracy", "total_bytes_up", "total_bytes_down", "rounds",
                            "wall_seconds", "num_params"}
    assert summary["total_bytes_down"] == lines[-1]["cum_bytes_down"]
    assert summary["rounds"] == 4 and summary["final_accuracy"] == lines[-1]["test_accuracy"]
    for png in ("accuracy_vs_round.png", "accuracy_vs_mb.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_config_file_and_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('seed = 3\n[data]\ndataset = "breast_cancer"\nnum_clients = 4\n[train]\nrounds = 2\n')
    out = tmp_path / "r"
    assert main(["run", str(cfg), "--out", str(out), "--set", "compression.downlink=\"anchor\""]) == 0
    resolved = tomllib.loads((out / "config.toml").read_text())
    assert resolved["seed"] == 3 and resolved["data"]["dataset"] == "breast_cancer"
    assert resolved["compression"]["downlink"] == "anchor"


def test_bad_value_exits_2_with_a_message_and_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sluice", "run", "--out", str(tmp_path / "x"), "--set", "compression.up=gzip"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "compression.up" in proc.stderr and "'randk'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


def test_missing_config_file_is_a_clear_error(capsys) -> None:
    assert main(["run", "/nonexistent/sluice.toml"]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_budget_before_target_exits_3_with_an_honest_report(tmp_path: Path) -> None:
    out = tmp_path / "be"
    rc = main(["run", "--out", str(out), *FAST, "--set", "termination.iterations=5",
               "--set", "termination.performance.accuracy=0.99", "--set", "model.version=7",
               "--set", "model.id=\"digits-fl\""])
    report = json.loads((out / "report.json").read_text())
    assert rc == 3 and report["cause"] == "BUDGET_EXHAUSTED" and report["status"] == "FINISHED"
    assert report["iterations"] == 5 and report["criterion"]["rule"] == "iterations"
    assert report["termination"]["iterations"] == 5
    assert report["model"]["version"] == "7" and report["model"]["id"] == "digits-fl"
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "FINISHED" and status["resultStateInfo"] == "BUDGET_EXHAUSTED"
    assert status["iterations"] == 5 and status["metrics"]["test_accuracy"] == report["performance"]["test_accuracy"]
    for key in ("progress_percent", "estimated_remaining_iterations", "estimated_remaining_s", "estimate_note",
                "elapsed_s"):
        assert key in status, key
    assert status["estimate_note"]


def test_status_is_rewritten_every_round(tmp_path: Path, monkeypatch) -> None:
    from sluice.runtimes import training

    out = tmp_path / "st"
    seen: list[dict] = []
    write = training.write_status

    def spy(run, proc) -> None:
        write(run, proc)
        seen.append(json.loads((run.path / "status.json").read_text()))

    monkeypatch.setattr(training, "write_status", spy)
    assert main(["run", "--out", str(out), *FAST]) == 0
    running = [s for s in seen if s["status"] == "RUNNING" and s["iterations"] > 0]
    assert [s["iterations"] for s in running] == [1, 2, 3, 4]
    assert running[-1]["progress_percent"] == 100.0 and running[1]["estimated_remaining_iterations"] == 2
    assert all("test_accuracy" in s["metrics"] for s in running)


def test_errors_before_training_leave_no_run_directory(tmp_path: Path, capsys) -> None:
    out = tmp_path / "x"
    assert main(["run", "--out", str(out), *FAST, "--set", "termination.performance.auc=0.9"]) == 2
    err = capsys.readouterr().err
    assert "unknown metric 'test_auc'" in err and "HFLEngine reports" in err and not out.exists()
    assert main(["run", "--out", str(out), *FAST, "--set", "termination.iterations=true"]) == 2
    assert "termination.iterations" in capsys.readouterr().err and not out.exists()


def test_ctrl_c_ends_with_a_cancelled_report(tmp_path: Path) -> None:
    out = tmp_path / "cc"
    sluice = Path(sys.executable).with_name("sluice")
    proc = subprocess.Popen([str(sluice), "run", "--set", "train.rounds=100000", "--set", "data.num_clients=6",
                             "--set", "model.hidden=[16]", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        status = json.loads((out / "status.json").read_text())
        assert status["status"] == "RUNNING" and status["iterations"] >= 1
        assert "estimated_remaining_iterations" in status and status["progress_percent"] is not None
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 130
    report = json.loads((out / "report.json").read_text())
    assert report["cause"] == "CANCELLED" and report["status"] == "CANCELLED" and report["iterations"] >= 2
    assert report["model_path"] == str(out / "model.pt") and (out / "model.pt").is_file()
    assert json.loads((out / "status.json").read_text())["status"] == "CANCELLED"
    assert len((out / "metrics.jsonl").read_text().splitlines()) == report["iterations"]


def test_the_banner_of_a_dense_run_shows_no_ratios(tmp_path: Path, capsys) -> None:
    assert main(["run", "--set", "train.rounds=1", "--set", "compression.up=dense", "--set", "compression.down=dense",
                 "--out", str(tmp_path / "dense")]) == 0
    banner = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("sluice run:"))
    assert "up=dense down=dense" in banner and "0.02" not in banner
