"""Requirements, termination parameters and model identity: validation and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.config import load_config
from sluice.control import (
    MDA_TYPE,
    ModelIdentity,
    ModelType,
    ReplayEngine,
    Requirements,
    Termination,
    TrainingProcess,
    parse_model,
    parse_requirements,
    parse_termination,
)
from sluice.errors import ConfigError
from sluice.schema import Section


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"iterations": -3}, "iterations"),
        ({"iterations": 0}, "iterations"),
        ({"training_time_s": -1}, "training_time_s"),
        ({"training_error": -0.1}, "training_error threshold must be ≥ 0"),
        ({"performance": {"test accuracy": 0.9}}, "metric names are letters, digits and '_'"),
        ({"performance": {"accuracy": 0.9, "test_accuracy": 0.8}}, "given twice"),
        ({"performance": {"accuracy": {"threshold": 0.9, "patience": 0}}}, "patience"),
        ({"performance": {"accuracy": {"threshold": 0.9, "min_delta": -1}}}, "min_delta"),
        ({"performance": {"accuracy": {"threshold": 0.9, "warmup": -2}}}, "warmup"),
        ({"performance": {"accuracy": {"min_delta": 0.1}}}, "threshold"),
        ({"performance": {"accuracy": float("nan")}}, "finite"),
        ({"resources": {"cpu_percent": 120}}, "cpu_percent threshold must be in (0, 100]"),
        ({"resources": {"network_bytes": -5}}, "network_bytes threshold must be > 0"),
        ({"resources": {"gpu": 5}}, "unknown key"),
        ({"plateau": {"no-such": {}}}, "metric names are letters"),
        ({"iterations": True}, "iterations"),
        ({"iterations": 2.5}, "iterations"),
        ({"performance": {"accuracy": True}}, "a criterion is a threshold number or a table, not true"),
        ({"performance": {"accuracy": {"threshold": 0.9, "patience": True}}}, "patience"),
        ({"resources": {"network_bytes": {"threshold": 1e6, "warmup": False}}}, "warmup"),
        ({"training_time_s": True}, "training_time_s"),
        ({"divergence_factor": 1.0}, "divergence_factor: Value error, must be a finite number > 1, or 0"),
        ({"divergence_factor": -3}, "divergence_factor"),
        ({"all_of": [{}]}, "needs at least one criterion"),
        ({"all_of": [{"performance": {}}]}, "needs at least one criterion"),
        ({"divergence": {"train_loss": float("inf")}}, "finite"),
        ({"itterations": 5}, "unknown key"),
    ],
)
def test_invalid_termination(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_termination(data)
    assert needle in str(exc.value)
    assert str(exc.value).startswith("invalid termination parameters")


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"min_data_amount": 500, "max_data_amount": 100}, "min_data_amount (500) must not exceed"),
        ({"data_amount": 50, "min_data_amount": 100}, "below min_data_amount"),
        ({"data_amount": 500, "max_data_amount": 100}, "above max_data_amount"),
        ({"layers": 0}, "layers"),
        ({"max_training_time_s": 0}, "max_training_time_s"),
        ({"data_amount": -1}, "data_amount"),
        ({"performance": {"f-2": 0.5}}, "metric names are letters"),
        ({"performance": {"accuracy": float("nan")}}, "finite"),
        ({"layers": True}, "layers"),
        ({"performance": {"accuracy": True}}, "performance"),
    ],
)
def test_invalid_requirements(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_requirements(data)
    assert needle in str(exc.value)


def test_any_metric_name_parses_and_aliases_become_canonical() -> None:
    t = parse_termination({"performance": {"auc": 0.8, "mean_reward": 3.0}, "plateau": {"bleu": {}}})
    assert set(t.performance) == {"test_auc", "mean_reward"} and set(t.plateau) == {"bleu"}
    assert parse_requirements({"performance": {"test_auc": 0.7}}).performance == {"test_auc": 0.7}


_STREAM = [{"test_accuracy": 0.5, "test_loss": 1.0, "train_loss": 1.0}]


@pytest.mark.parametrize(
    ("termination", "requirements", "needle"),
    [
        ({"performance": {"acuracy": 0.9}}, None, "termination.performance: unknown metric 'acuracy'"),
        ({"performance": {"accuracy": 1.5}}, None, "must be in [0.0, 1.0]"),
        ({"plateau": {"nonsense": {}}}, None, "termination.plateau: unknown metric 'nonsense'"),
        ({"error_metric": "test_accuracy", "training_error": 0.1}, None, "must be a metric to minimise"),
        ({"training_error": 0.1, "error_metric": "energy_error"}, None, "unknown metric 'energy_error'"),
        ({"all_of": [{"iterations": 3, "performance": {"f1": 0.5}}]}, None,
         "termination.all_of[0].performance: unknown metric 'test_f1'"),
        ({"iterations": 3, "divergence": {"test_mse": 5.0}}, None, "termination.divergence: unknown metric"),
        ({"iterations": 3}, {"performance": {"f2": 0.5}}, "requirements.performance: unknown metric 'f2'"),
        ({"iterations": 3}, {"performance": {"test_loss": -1.0}}, "must be in [0.0, inf]"),
    ],
)
def test_criteria_are_checked_against_the_engine(termination, requirements, needle) -> None:
    with pytest.raises(ConfigError) as exc:
        TrainingProcess(ReplayEngine(_STREAM), termination, requirements)
    assert needle in str(exc.value)
    assert "ReplayEngine reports test_accuracy, test_loss, train_loss" in str(exc.value) or "must" in needle


def test_training_error_default_metric_must_be_reported() -> None:
    """For coverage problem analysis the training error is the coverage error: the engine must report it."""
    model = ModelIdentity(type="coverage_problem_analysis")
    with pytest.raises(ConfigError, match="termination.training_error: unknown metric 'coverage_error'"):
        TrainingProcess(ReplayEngine(_STREAM), {"training_error": 0.1}, model=model)


def test_network_bytes_refused_when_the_engine_counts_none() -> None:
    term = {"resources": {"network_bytes": 1e6}}
    TrainingProcess(ReplayEngine(_STREAM), term)
    with pytest.raises(ConfigError, match="network_bytes: ReplayEngine sends nothing over a network"):
        TrainingProcess(ReplayEngine(_STREAM, counts_bytes=False), term)
    with pytest.raises(ConfigError, match=r"all_of\[0\].resources.network_bytes"):
        TrainingProcess(ReplayEngine(_STREAM, counts_bytes=False),
                        {"all_of": [{"iterations": 2, "resources": {"network_bytes": 5.0}}]})


def test_updates_are_checked_against_the_engine() -> None:
    proc = TrainingProcess(ReplayEngine(_STREAM * 3), {"iterations": 3})
    with pytest.raises(ConfigError, match="unknown metric 'test_f1'"):
        proc.update({"performance": {"f1": 0.9}})
    with pytest.raises(ConfigError, match="must be in"):
        proc.update(requirements={"performance": {"accuracy": 2.0}})
    proc.update({"performance": {"accuracy": 0.4}})
    assert proc.run().fired == "performance.test_accuracy"


def test_model_version_and_id_may_be_integers() -> None:
    m = parse_model({"id": 42, "version": 7})
    assert (m.id, m.version) == ("42", "7")
    with pytest.raises(ConfigError, match="version"):
        parse_model({"version": True})


def test_empty_termination_is_refused_when_training() -> None:
    assert not parse_termination({}).has_criteria()
    with pytest.raises(ConfigError, match="no termination criterion"):
        TrainingProcess(ReplayEngine([{"x": 1.0}]), {})
    # requirements alone can define when to stop
    TrainingProcess(ReplayEngine([{"test_accuracy": 1.0}]), {}, {"performance": {"accuracy": 0.9}})


def test_bare_number_and_aliases() -> None:
    t = parse_termination({"performance": {"accuracy": 0.9, "f1": {"threshold": 0.8, "patience": 2}}})
    assert t.performance["test_accuracy"].threshold == 0.9
    assert t.performance["test_f1"].patience == 2
    r = parse_requirements({"performance": {"precision": 0.7}})
    assert r.performance == {"test_precision": 0.7}
    assert r.met_by({"test_precision": 0.71}) is True
    assert r.met_by({"test_precision": 0.69}) is False
    assert r.met_by({}) is False
    assert Requirements().met_by({"a": 1}) is None


def test_merge_patch_updates() -> None:
    t = parse_termination({"iterations": 10, "performance": {"accuracy": 0.9}})
    u = t.merged({"iterations": None, "performance": {"f1": 0.8}})
    assert u.iterations is None
    assert set(u.performance) == {"test_accuracy", "test_f1"}


def test_model_types_map_to_mda_types() -> None:
    assert len(ModelType) == 12 and set(MDA_TYPE) == set(ModelType)
    m = ModelIdentity(id="m", type="coverage_problem_analysis")
    assert m.type == "COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS"
    assert m.model_type == ModelType.COVERAGE_PROBLEM_ANALYSIS
    assert ModelIdentity(type="ENERGY SAVING ANALYSIS").model_type == ModelType.ENERGY_SAVING_ANALYSIS
    assert ModelIdentity(type="SLS_ANALYSIS_SERVICE_EXPERIENCE_ANALYSIS").model_type is None
    assert ModelIdentity(type="kpi_anomaly_analysis").type == "VS_KPI_ANOMALY_ANALYSIS"
    assert ModelIdentity(type="VS_MY_THING").type == "VS_MY_THING"
    with pytest.raises(ConfigError, match="unknown model type 'coverage'"):
        parse_model({"type": "coverage"})
    with pytest.raises(ConfigError, match="mLModelId|id"):
        parse_model({"id": ""})
    assert ModelIdentity(version="3").next_version().version == "4"
    assert ModelIdentity(version="v2").next_version().version == "v2.1"


class _Cfg(Section):
    termination: Termination | None = None
    requirements: Requirements | None = None


def test_toml_sections_and_set_overrides(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text(
        "[termination]\niterations = 40\n[termination.performance]\naccuracy = 0.9\n"
        "[termination.performance.f1]\nthreshold = 0.85\npatience = 2\n"
        "[[termination.all_of]]\nname = 'cheap'\nresources = { network_bytes = 1e6 }\n"
        "performance = { accuracy = 0.8 }\n"
        "[requirements]\nmin_data_amount = 100\nmax_data_amount = 1000\n",
        encoding="utf-8",
    )
    cfg = load_config(p, ["termination.training_time_s=60", "requirements.layers=2"], model=_Cfg)
    assert cfg.termination.iterations == 40 and cfg.termination.training_time_s == 60
    assert cfg.termination.performance["test_f1"].patience == 2
    assert cfg.termination.all_of[0].resources.network_bytes.threshold == 1e6
    assert cfg.requirements.layers == 2
    with pytest.raises(ConfigError, match="termination.performance"):
        load_config(p, ["termination.performance.acc=true"], model=_Cfg)
    with pytest.raises(ConfigError, match="termination.iterations"):
        load_config(p, ["termination.iterations=true"], model=_Cfg)
