"""Control-plane CLI: ``sluice local``, ``sluice data add``, ``sluice report`` and ``sluice run`` with
``[requirements]`` / ``[termination]``."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np

from sluice.cli import main
from sluice.control import Cause
from sluice.control.inbox import save_arrays
from sluice.control.report import EXIT_CODES

LOCAL = ["--set", "model.hidden=[16]"]


def test_local_run_directory_and_report(tmp_path: Path, capsys) -> None:
    out = tmp_path / "loc"
    assert main(["local", "--out", str(out), *LOCAL, "--set", "train.iterations=30",
                 "--set", "termination.performance.accuracy=0.85"]) == 0
    report = json.loads((out / "report.json").read_text())
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert report["cause"] == "CRITERION_MET" and report["criterion"]["rule"] == "performance.test_accuracy"
    assert len(lines) == report["iterations"] < 30
    assert json.loads(lines[-1])["test_accuracy"] >= 0.85
    assert json.loads((out / "status.json").read_text())["status"] == "FINISHED"
    assert (out / "model.pt").is_file() and report["model_path"] == str(out / "model.pt")
    text = capsys.readouterr().out
    assert "CRITERION_MET" in text and "performance.test_accuracy" in text
    assert main(["report", str(out)]) == 0
    assert "est. remaining" in capsys.readouterr().out
    assert main(["report", str(out), "--json", "--3gpp"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["progressStatus"]["resultStateInfo"] == "CRITERION_MET"


def test_local_requirement_not_met(tmp_path: Path) -> None:
    out = tmp_path / "nm"
    assert main(["local", "--out", str(out), *LOCAL, "--set", "train.iterations=2",
                 "--set", "requirements.performance.accuracy=0.99"]) == EXIT_CODES[Cause.PERFORMANCE_NOT_MET] == 4
    report = json.loads((out / "report.json").read_text())
    assert report["cause"] == "PERFORMANCE_NOT_MET" and report["iterations"] == 2
    assert report["requirements_met"] is False


def test_data_add_resumes_an_awaiting_run(tmp_path: Path, digits_file: Path) -> None:
    out = tmp_path / "wait"
    rc: list[int] = []
    args = ["local", "--out", str(out), *LOCAL, "--set", "train.iterations=3",
            "--set", "data.max_train_samples=40", "--set", "train.min_samples=200",
            "--set", "termination.data_wait_s=60"]
    t = threading.Thread(target=lambda: rc.append(main(args)))
    t.start()
    status = out / "status.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if status.is_file() and json.loads(status.read_text()).get("status") == "AWAITING_DATA":
            break
        time.sleep(0.02)
    assert json.loads(status.read_text())["resultStateInfo"] == "INADEQUATE_TRAINING_DATA"
    assert main(["data", "add", str(out), str(digits_file)]) == 0
    t.join(60)
    assert rc == [0]
    report = json.loads((out / "report.json").read_text())
    assert report["cause"] == "CRITERION_MET" and report["awaited_data"] == 1 and report["iterations"] == 3


def test_local_budget_before_target_exits_non_zero(tmp_path: Path) -> None:
    out = tmp_path / "be"
    rc = main(["local", "--out", str(out), *LOCAL, "--set", "termination.iterations=2",
               "--set", "termination.performance.accuracy=0.999"])
    report = json.loads((out / "report.json").read_text())
    assert rc == 3 and report["cause"] == "BUDGET_EXHAUSTED" and report["status"] == "FINISHED"
    assert report["termination"]["iterations"] == 2
    assert report["termination"]["performance"]["test_accuracy"]["threshold"] == 0.999
    assert (out / "model.pt").is_file()


def test_local_learning_rate_far_too_high_is_diverged(tmp_path: Path) -> None:
    out = tmp_path / "div"
    assert main(["local", "--out", str(out), *LOCAL, "--set", "train.lr=1e6", "--set", "train.iterations=20"]) == 8
    report = json.loads((out / "report.json").read_text())
    assert report["cause"] == "DIVERGED" and report["model_path"] is None
    assert json.loads((out / "status.json").read_text())["status"] == "FAILED"


def test_local_refuses_what_it_cannot_measure(tmp_path: Path, capsys) -> None:
    out = tmp_path / "nb"
    assert main(["local", "--out", str(out), *LOCAL, "--set", "termination.resources.network_bytes=1e6"]) == 2
    assert "sends nothing over a network" in capsys.readouterr().err and not out.exists()
    assert main(["local", "--out", str(out), *LOCAL, "--set", "termination.performance.auc=0.9"]) == 2
    err = capsys.readouterr().err
    assert "unknown metric 'test_auc'" in err and "LocalTrainer reports" in err and not out.exists()


def test_data_add_errors(tmp_path: Path, capsys, digits_file: Path) -> None:
    assert main(["data", "add", str(tmp_path / "nope"), str(digits_file)]) == 2
    assert "run directory not found" in capsys.readouterr().err
    bad = tmp_path / "bad.npz"
    np.savez(bad, X=np.zeros((3, 2)), labels=np.zeros(3))
    assert main(["data", "add", str(tmp_path), str(bad)]) == 2
    assert "X and y" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert "no report.json" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "run directory not found" in capsys.readouterr().err


def test_run_with_termination_and_requirements(tmp_path: Path) -> None:
    out = tmp_path / "hfl"
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        "[data]\nnum_clients = 6\n[model]\nhidden = [16]\n[train]\nrounds = 40\n"
        "[compression]\nup_ratio = 0.1\ndown_ratio = 0.05\n"
        "[termination.performance]\naccuracy = 0.6\n"
        "[requirements]\nperformance = { accuracy = 0.4 }\n", encoding="utf-8")
    assert main(["run", str(cfg), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert report["cause"] == "CRITERION_MET" and report["iterations"] == len(lines) < 40
    assert lines[-1]["test_accuracy"] >= 0.6 > max(r["test_accuracy"] for r in lines[:-1])
    assert report["bytes_up"] == lines[-1]["cum_bytes_up"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == len(lines)


def test_run_iterations_from_termination(tmp_path: Path) -> None:
    out = tmp_path / "it"
    assert main(["run", "--out", str(out), "--set", "data.num_clients=4", "--set", "model.hidden=[8]",
                 "--set", "termination.iterations=3"]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    assert json.loads((out / "report.json").read_text())["criterion"]["rule"] == "iterations"


def test_run_rejects_bad_termination(tmp_path: Path, capsys) -> None:
    assert main(["run", "--out", str(tmp_path / "x"), "--set", "termination.performance.acuracy=0.9"]) == 2
    err = capsys.readouterr().err
    assert "unknown metric 'acuracy'" in err and "Traceback" not in err
    assert main(["run", "--out", str(tmp_path / "y"), "--set", "requirements.min_data_amount=10",
                 "--set", "requirements.max_data_amount=5"]) == 2
    assert "must not exceed" in capsys.readouterr().err


import pytest  # noqa: E402


@pytest.fixture()
def digits_file(tmp_path: Path) -> Path:
    from sluice.data import load_dataset

    ds = load_dataset("digits", seed=0)
    return save_arrays(tmp_path / "more.npz", ds.X_train[40:400], ds.y_train[40:400])
