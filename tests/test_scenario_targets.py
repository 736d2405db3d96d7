"""The examples' targets on the scenarios' type-specific metrics ask for a model that learned something.

Per scenario, the target of its example (read from the TOML) is not met by predicting the mean (the most
common class for classification), nor by a linear model on the same features (least squares, logistic
regression), and is met by exact predictions. That Sluice's trained model meets it is what running the
examples checks (tests/test_scenarios_e2e.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sluice.control.monitor import effective_error_metric
from sluice.data.scenarios import get_spec, load_scenario
from sluice.data.scenarios.base import ScenarioData
from sluice.metrics import KNOWN, MetricSpec
from sluice.runtimes.jobs import load_job

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CASES = {  # scenario: (engine kind, example)
    "coverage": ("hfl", "coverage_hfl.toml"),
    "energy": ("local", "energy_local.toml"),
    "kpi_anomaly": ("split", "kpi_split.toml"),
}


def _target(kind: str, example: str) -> tuple[str, float]:
    """``(metric, threshold)`` of the example's one result criterion."""
    job = load_job(kind, EXAMPLES / example)
    term = job.termination
    assert term is not None
    if term.training_error is not None:
        return effective_error_metric(term, job.model), term.training_error.threshold
    ((name, criterion),) = term.performance.items()
    return name, criterion.threshold


def _spec(scenario: str, metric: str) -> MetricSpec:
    own = {s.name: s for s in get_spec(scenario).metric_specs}
    return own.get(metric) or KNOWN[metric]


def _meets(spec: MetricSpec, value: float, threshold: float) -> bool:
    return value >= threshold if spec.higher_is_better else value <= threshold


def _predictions(d: ScenarioData) -> dict[str, np.ndarray]:
    """Predictions for the test rows, in natural units: mean (or most common class), linear, exact."""
    from sklearn.linear_model import LinearRegression, LogisticRegression

    train, test = ~d.test, d.test
    X = d.X.astype(np.float64)
    sd = X[train].std(0)
    Xs = (X - X[train].mean(0)) / np.where(sd > 0, sd, 1.0)
    if d.task == "regression":
        mean = np.tile(d.y[train].mean(0), (int(test.sum()), 1))
        linear = LinearRegression().fit(Xs[train], d.y[train]).predict(Xs[test])
    else:
        mean = np.full(int(test.sum()), np.bincount(d.y[train]).argmax())
        linear = LogisticRegression(max_iter=2000).fit(Xs[train], d.y[train]).predict_proba(Xs[test])
    return {"mean": mean, "linear": linear, "exact": d.y[test]}


@pytest.mark.parametrize("scenario", sorted(CASES))
def test_the_example_target_is_not_met_by_the_mean_or_a_linear_model(scenario: str) -> None:
    kind, example = CASES[scenario]
    metric, threshold = _target(kind, example)
    raw = load_job(kind, EXAMPLES / example).dump()
    d = load_scenario(scenario, raw["data"].get("scenario", {}), raw["seed"], cache=False)
    fn = get_spec(scenario).metrics(d, np.flatnonzero(d.test))[metric]
    spec = _spec(scenario, metric)
    scores = {name: fn(pred, d.y[d.test]) for name, pred in _predictions(d).items()}
    assert not _meets(spec, scores["mean"], threshold), (metric, threshold, scores)
    assert not _meets(spec, scores["linear"], threshold), (metric, threshold, scores)
    assert _meets(spec, scores["exact"], threshold), (metric, threshold, scores)
    # the metric ranks them: exact best, the linear model between it and the mean
    order = [scores[k] for k in ("exact", "linear", "mean")]
    assert order == sorted(order, reverse=spec.higher_is_better), scores
