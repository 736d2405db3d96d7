"""What `sluice report` says: the 3GPP form on its own, model performance without the run's own counts, and a
budget stop's estimate in words (never an overflowing number)."""

from __future__ import annotations

import json
from pathlib import Path

from sluice.cli import main


def test_3gpp_report_alone_lists_model_performance_only(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--set", "train.rounds=3", "--set", "termination.iterations=3"]) == 0
    capsys.readouterr()
    assert main(["report", str(out), "--3gpp"]) == 0  # without --json: the same JSON document
    doc = json.loads(capsys.readouterr().out)
    metrics = {p["performanceMetric"] for key in ("modelPerformanceTraining", "modelPerformanceValidation")
               for p in doc[key]}
    assert "test_accuracy" in metrics and "train_loss" in metrics
    assert not metrics & {"participants", "dropped"}
    run_metrics = doc["vsDataContainer"]["vsData"]["run_metrics"]
    assert run_metrics["participants"] == 5 and run_metrics["dropped"] == 0


def test_budget_stop_reports_what_the_target_would_need(tmp_path: Path, capsys) -> None:
    out = tmp_path / "short"
    rc = main(["run", "--out", str(out), "--set", "train.rounds=40", "--set", "termination.iterations=40",
               "--set", "termination.performance.accuracy.threshold=0.99"])
    assert rc == 3  # BUDGET_EXHAUSTED
    report = json.loads((out / "report.json").read_text())
    assert report["progress_percent"] == 100.0
    note = report["estimate_note"]
    assert "would need more than" not in note and ("expected in" in note or "not expected within" in note)
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert {"remaining_iterations", "remaining_iterations_low", "remaining_iterations_high",
            "reach_probability", "progress_percent"} <= set(last)
    assert last["remaining_iterations"] is not None or last["remaining_reason"]
