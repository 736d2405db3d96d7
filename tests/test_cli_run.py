"""``sluice run`` end to end: run directory contents and user errors."""

from __future__ import annotations

import json
import subprocess
import sys
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
