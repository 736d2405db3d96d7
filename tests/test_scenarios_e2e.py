"""Network-analytics scenarios end to end: [data] configuration, model type, the engines' type-specific
metrics, ``sluice data describe`` and the three examples run through the CLI."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import numpy as np
import pytest

from sluice.cli import main
from sluice.control.monitor import check_criteria
from sluice.control.params import parse_termination
from sluice.errors import ConfigError, DataError, TaskError
from sluice.runtimes.jobs import job_from_dict

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SMALL = {  # sizes that generate in well under a second
    "coverage": {"ues_per_cell": 12},
    "energy": {"cells": 6, "sites": 3, "days": 2},
    "kpi_anomaly": {"cells": 4, "days": 2},
}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Generated scenarios go to a cache of this test session (split followers inherit it)."""
    monkeypatch.setenv("SLUICE_CACHE", str(tmp_path_factory.getbasetemp() / "scenario-cache"))


def _job(kind: str, dataset: str, **sections: dict) -> object:
    return job_from_dict(kind, {"data": {"dataset": dataset, "scenario": dict(SMALL[dataset])}, **sections})


# ----------------------------------------------------------------------------------------- configuration
def test_scenario_parameters_are_checked_by_the_scenario_section() -> None:
    with pytest.raises(ConfigError, match=r"data\.scenario.*ues_per_celll: unknown key"):
        job_from_dict("hfl", {"data": {"dataset": "coverage", "scenario": {"ues_per_celll": 3}}})
    with pytest.raises(ConfigError, match=r"data\.scenario.*cells"):
        job_from_dict("local", {"data": {"dataset": "energy", "scenario": {"cells": 0}}})
    with pytest.raises(ConfigError, match="dataset 'digits' takes none"):
        job_from_dict("hfl", {"data": {"dataset": "digits", "scenario": {"cells": 3}}})
    job = _job("hfl", "energy")
    assert job.config.data.scenario["cells"] == 6 and job.config.data.scenario["days"] == 2  # defaults filled


@pytest.mark.parametrize(("dataset", "mda"), [
    ("coverage", "COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS"),
    ("energy", "MDA_ASSISTED_ENERGY_SAVING_ENERGY_SAVING_ANALYSIS"),
    ("kpi_anomaly", "VS_KPI_ANOMALY_ANALYSIS"),
])
def test_the_job_takes_the_scenarios_model_type(dataset: str, mda: str) -> None:
    for kind in ("hfl", "local", "split"):
        assert _job(kind, dataset).model.type == mda
    same = job_from_dict("hfl", {"data": {"dataset": dataset}, "model": {"type": mda, "id": "m"}})
    assert same.model.type == mda and same.model.id == "m"
    other = "fault_prediction"
    with pytest.raises(ConfigError, match=rf"model\.type: .* is not what scenario '{dataset}' trains \({mda}\)"):
        job_from_dict("local", {"data": {"dataset": dataset}, "model": {"type": other}})


def test_num_clients_must_match_the_parties() -> None:
    engine = _job("hfl", "energy", data={"dataset": "energy", "scenario": SMALL["energy"], "num_clients": 4}).build()
    with pytest.raises(ConfigError, match=r"num_clients = 4, but scenario energy as configured has 6 parties"):
        engine.start()
    engine = _job("hfl", "energy", data={"dataset": "energy", "scenario": SMALL["energy"], "num_clients": 6}).build()
    engine.start()
    assert len(engine.data.clients) == 6


# ------------------------------------------------------------------------------------------------ engines
def test_hfl_regression_reports_the_type_specific_errors_and_accepts_criteria_on_them() -> None:
    job = _job("hfl", "coverage", train={"rounds": 3, "participation": 1.0})
    engine = job.build()
    specs = engine.metrics
    for name in ("coverage_error", "coverage_error_rsrp", "coverage_ratio_error", "rsrp_error",
                 "problem_ratio_error", "test_mse"):
        assert name in specs
    assert "test_accuracy" not in specs
    term = parse_termination({"training_error": 0.1, "performance": {"rsrp_error": 5.0}})
    check_criteria(term, None, job.model, specs)  # coverage_error is the model type's training error
    with pytest.raises(ConfigError, match="unknown metric 'test_accuracy'"):
        check_criteria(parse_termination({"performance": {"accuracy": 0.9}}), None, job.model, specs)
    first = engine.iterate().metrics
    for _ in range(2):
        last = engine.iterate().metrics
    assert last["coverage_error"] > 0 and 0 <= last["coverage_ratio_error"] <= 1 and math.isfinite(last["rsrp_error"])
    assert last["train_loss"] < first["train_loss"]
    assert last["coverage_error"] == pytest.approx(
        np.mean([last[f"coverage_error_{s}"] for s in ("rsrp", "rsrq", "sinr")]))


def test_hfl_added_regression_data_is_standardised_like_the_scenario() -> None:
    engine = _job("hfl", "energy").build()
    engine.start()
    xm, xs, ym, ys = engine.data.task.prepare.__self__.scaling  # the FederatedData the task was built from
    X = np.tile(xm + xs, (2, 1))
    ((c, Xs, ys_), ) = engine.check_data((1, X, np.tile(ym + 2 * ys, (2, 1))))
    assert c == 1 and np.allclose(Xs, 1.0, atol=1e-4) and np.allclose(ys_, 2.0, atol=1e-4)
    with pytest.raises(DataError, match=r"y must have shape \(samples, 2\)"):
        engine.check_data((0, X, np.zeros(2)))


def test_local_on_a_classification_scenario_reports_its_errors() -> None:
    engine = _job("local", "kpi_anomaly", train={"iterations": 2}).build()
    assert {"anomaly_f1", "anomaly_precision", "test_accuracy"} <= set(engine.metrics)
    m = engine.iterate().metrics
    assert 0 <= m["anomaly_f1"] <= 1 and 0 <= m["test_accuracy"] <= 1


def test_split_takes_a_classification_scenario_by_its_vertical_groups() -> None:
    job = _job("split", "kpi_anomaly", transport={"kind": "inproc"}, pipeline={"groups": 1},
               train={"steps": 4, "eval_every": 2, "batch_size": 32})
    engine = job.build()
    data = _scenario_of(job)
    assert _split_columns(job) == [list(data.columns(data.vertical[0])), list(data.columns(data.vertical[1]))]
    assert len(engine.plan.test_ids) == min(int(data.test.sum()), job.config.train.eval_samples)
    try:
        evals = [e.metrics for e in (engine.iterate() for _ in range(4)) if "anomaly_f1" in e.metrics]
    finally:
        engine.stop()
    assert len(evals) == 2 and all(0 <= m["anomaly_recall"] <= 1 for m in evals)
    with pytest.raises(TaskError, match="needs followers = 1, got 2"):
        _job("split", "kpi_anomaly", followers=2, transport={"kind": "inproc"}).build().task  # noqa: B018


def _scenario_of(job):
    from sluice.data.scenarios import load_scenario

    return load_scenario(job.config.data.dataset, dict(job.config.data.scenario), job.config.seed)


def _split_columns(job) -> list[list[int]]:
    """The columns of the leader's table, then of each follower's, as their built-in tasks hold them."""
    from sluice.split.engine import party_task

    cfg = job.config
    parties = ["leader", *(f"follower-{i + 1}" for i in range(cfg.followers))]
    return [[int(c[1:]) for c in party_task(cfg, p).table.columns] for p in parties]


def test_split_trains_a_regression_scenario_and_reports_regression_metrics() -> None:
    job = _job("split", "energy", transport={"kind": "inproc"}, pipeline={"groups": 2},
               train={"steps": 60, "eval_every": 30, "batch_size": 32, "optimizer": "adam", "lr": 0.01})
    engine = job.build()
    task, specs = engine.task, engine.metrics
    assert task.kind == "regression" and list(task.top().modules())[-1].out_features == 2  # one per target
    assert {"train_loss", "test_loss", "test_mse", "test_mae", "test_rmse", "energy_error"} <= set(specs)
    assert not {"train_accuracy", "test_accuracy", "test_f1", "test_auc"} & set(specs)
    with pytest.raises(ConfigError, match="unknown metric 'test_accuracy'"):
        check_criteria(parse_termination({"performance": {"accuracy": 0.9}}), None, job.model, specs)
    try:
        events = [engine.iterate().metrics for _ in range(60)]
    finally:
        engine.stop()
    first, last = events[0], events[-1]
    assert "train_accuracy" not in last and last["train_loss"] < first["train_loss"]
    assert last["test_loss"] == last["test_mse"] and last["test_rmse"] == pytest.approx(math.sqrt(last["test_mse"]))
    assert 0 <= last["energy_error"] < 1
    row = {sid: i for i, sid in enumerate(task.table.ids.tolist())}
    y_train, y_test = (task.table.y[[row[s] for s in ids]] for ids in (engine.plan.train_ids, engine.plan.test_ids))
    mean_mse = float(np.mean((y_test - y_train.mean(axis=0)) ** 2))  # predicting the training mean
    assert last["test_mse"] < 0.2 * mean_mse
    summary = engine.summary()
    assert summary["final_test_mse"] == last["test_mse"] and "final_test_accuracy" not in summary


def test_split_takes_the_coverage_signals_by_their_vertical_groups() -> None:
    job = _job("split", "coverage", transport={"kind": "inproc"}, pipeline={"groups": 2},
               train={"steps": 4, "eval_every": 2, "batch_size": 32},
               data={"dataset": "coverage", "scenario": {**SMALL["coverage"], "target": "signals"}})
    engine = job.build()
    task, data = engine.task, _scenario_of(job)
    assert task.kind == "regression" and list(task.top().modules())[-1].out_features == len(data.target_names) == 3
    assert _split_columns(job) == [list(data.columns(data.vertical[0])), list(data.columns(data.vertical[1]))]
    assert {"test_mse", "coverage_error", "rsrp_error"} <= set(engine.metrics)
    try:
        evals = [e.metrics for e in (engine.iterate() for _ in range(4)) if "test_mse" in e.metrics]
    finally:
        engine.stop()
    assert len(evals) == 2 and all(m["coverage_error"] > 0 and math.isfinite(m["test_mse"]) for m in evals)


# --------------------------------------------------------------------------------------------------- CLI
def test_data_describe_prints_statistics_and_writes_plots(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["data", "describe", "energy", "--set", "cells=6", "--set", "sites=3", "--set", "days=2",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "energy" in out and "model type energy saving" in out
    plots = [Path(line.split("plot: ", 1)[1].strip()) for line in out.splitlines() if line.startswith("plot: ")]
    assert plots and all(p.is_file() and p.stat().st_size > 1000 and p.parent == tmp_path for p in plots)
    assert main(["data", "describe", "energy", "--set", "cellz=6", "--out", str(tmp_path)]) == 2
    assert "cellz: unknown key" in capsys.readouterr().err.replace("\n", " ")


def _report(run: Path) -> dict:
    return json.loads((run / "report.json").read_text())


def test_example_coverage_hfl_stops_on_the_coverage_error(tmp_path: Path) -> None:
    run = tmp_path / "cov"
    assert main(["run", str(EXAMPLES / "coverage_hfl.toml"), "--out", str(run)]) == 0
    rep = _report(run)
    assert rep["cause"] == "CRITERION_MET" and rep["criterion"]["rule"] == "training_error"
    assert rep["model"]["type"] == "COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS"
    hit = rep["criterion"]["hits"][0]
    target = tomllib.loads((EXAMPLES / "coverage_hfl.toml").read_text())["termination"]["training_error"]
    assert hit["observed"] == pytest.approx(rep["performance"]["coverage_error"]) and hit["observed"] <= target
    assert hit["metric"] == "coverage_error" and "(coverage_error " in rep["detail"]
    assert rep["iterations"] < 100 and rep["bytes_up"] > 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["model_type"] == "coverage problem analysis"
    assert summary["final_coverage_error"] == pytest.approx(hit["observed"])
    assert (run / "coverage_error_vs_round.png").is_file() and (run / "coverage_error_vs_mb.png").is_file()


def test_example_energy_local_stops_on_the_energy_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "energy"
    assert main(["local", str(EXAMPLES / "energy_local.toml"), "--out", str(run)]) == 0
    progress = capsys.readouterr().out
    assert " rmse 0." in progress and " acc " not in progress  # a regression task shows its test RMSE
    rep = _report(run)
    assert rep["cause"] == "CRITERION_MET" and rep["criterion"]["rule"] == "training_error"
    assert rep["model"]["type"] == "MDA_ASSISTED_ENERGY_SAVING_ENERGY_SAVING_ANALYSIS"
    hit = rep["criterion"]["hits"][0]
    assert hit["observed"] == pytest.approx(rep["performance"]["energy_error"]) and hit["observed"] <= 0.05
    assert hit["metric"] == "energy_error" and "(energy_error " in rep["detail"]
    assert {"energy_consumption_error", "energy_efficiency_error"} <= set(rep["performance"])
    assert 1 < rep["iterations"] < 60
    assert (run / "energy_error_vs_iteration.png").is_file()


def test_example_kpi_split_stops_on_the_anomaly_f1(tmp_path: Path) -> None:
    run = tmp_path / "kpi"
    assert main(["split", "run", str(EXAMPLES / "kpi_split.toml"), "--out", str(run)]) == 0
    rep = _report(run)
    assert rep["cause"] == "CRITERION_MET" and rep["criterion"]["rule"] == "performance.anomaly_f1"
    assert rep["model"]["type"] == "VS_KPI_ANOMALY_ANALYSIS"
    assert rep["performance"]["anomaly_f1"] >= 0.65 and rep["iterations"] < 3000
    assert (run / "anomaly_f1_vs_step.png").is_file()
