"""Requirements, termination parameters and model identity: validation and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.config import Section, load_config
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


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"iterations": -3}, "iterations"),
        ({"iterations": 0}, "iterations"),
        ({"training_time_s": -1}, "training_time_s"),
        ({"training_error": -0.1}, "training_error threshold must be ≥ 0"),
        ({"performance": {"acuracy": 0.9}}, "unknown metric 'acuracy'"),
        ({"performance": {"accuracy": 1.5}}, "must be in [0.0, 1.0]"),
        ({"performance": {"accuracy": 0.9, "test_accuracy": 0.8}}, "given twice"),
        ({"performance": {"accuracy": {"threshold": 0.9, "patience": 0}}}, "patience"),
        ({"performance": {"accuracy": {"threshold": 0.9, "min_delta": -1}}}, "min_delta"),
        ({"performance": {"accuracy": {"threshold": 0.9, "warmup": -2}}}, "warmup"),
        ({"performance": {"accuracy": {"min_delta": 0.1}}}, "threshold"),
        ({"performance": {"accuracy": float("nan")}}, "finite"),
        ({"resources": {"cpu_percent": 120}}, "cpu_percent threshold must be in (0, 100]"),
        ({"resources": {"network_bytes": -5}}, "network_bytes threshold must be > 0"),
        ({"resources": {"gpu": 5}}, "unknown key"),
        ({"plateau": {"nonsense": {}}}, "unknown metric"),
        ({"error_metric": "test_accuracy", "training_error": 0.1}, "must be a metric to minimise"),
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
        ({"performance": {"f2": 0.5}}, "unknown metric 'f2'"),
        ({"performance": {"test_loss": -1.0}}, "must be in [0.0, inf]"),
    ],
)
def test_invalid_requirements(data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_requirements(data)
    assert needle in str(exc.value)


def test_empty_termination_is_refused_when_training() -> None:
    assert not parse_termination({}).has_criteria()
    with pytest.raises(ConfigError, match="no termination criterion"):
        TrainingProcess(ReplayEngine([{"x": 1.0}]), {})
    # requirements alone can define when to stop
    TrainingProcess(ReplayEngine([{"x": 1.0}]), {}, {"performance": {"accuracy": 0.9}})


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
        load_config(p, ["termination.performance.acc=0.9"], model=_Cfg)
