"""KPI anomaly scenario: label shares, injected anomalies visible at their labels, features, metrics, seeding."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.data.scenarios import get_spec, load_scenario, scaled_metric_fns
from sluice.data.scenarios.kpi_anomaly import KINDS, KPIS, anomaly_scores
from sluice.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def data():
    return load_scenario("kpi_anomaly", {}, seed=0, cache=False)


@pytest.fixture(scope="module")
def clean():
    return load_scenario("kpi_anomaly", {"anomalies_per_day": 0.0}, seed=0, cache=False)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_label_shares_in_range_and_every_kind_present(seed):
    d = load_scenario("kpi_anomaly", {}, seed=seed, cache=False)
    assert d.task == "classification" and d.target_names == KINDS
    share = np.mean(d.y != 0)
    assert 0.02 <= share <= 0.08, share
    assert set(np.unique(d.y)) == set(range(len(KINDS)))


def test_anomalies_are_where_the_labels_say(data, clean):
    y = data.y
    assert np.all(clean.y == 0)
    got = np.stack([data.info[k] for k in KPIS]).astype(np.float64)
    ref = np.stack([clean.info[k] for k in KPIS]).astype(np.float64)
    # normal steps carry the undisturbed series
    assert np.array_equal(got[:, y == 0], ref[:, y == 0])
    # outage: every KPI is 0 where the clean series is not
    out = y == KINDS.index("outage")
    assert out.any() and np.all(got[:, out] == 0) and np.all(ref[:, out] > 0)
    # spike: exactly one KPI moves, by a factor of 2.5 to 5 in its degrading direction
    spike = y == KINDS.index("spike")
    assert spike.any()
    ratio = got[:, spike] / ref[:, spike]
    moved = ~np.isclose(ratio, 1.0)
    assert np.all(moved.sum(0) == 1)
    r = ratio[moved]
    assert np.all(((r >= 2.5 - 1e-6) & (r <= 5.0 + 1e-6)) | ((r <= 1 / 2.5 + 1e-6) & (r >= 1 / 5.0 - 1e-6)))
    # level shift and drift: one KPI changed at every labelled step
    for kind in ("level_shift", "drift"):
        m = y == KINDS.index(kind)
        assert m.any()
        changed = ~np.isclose(got[:, m], ref[:, m])
        assert np.all(changed.sum(0) == 1), kind


def test_outage_and_spike_stand_out_in_the_features(data):
    col = {n: i for i, n in enumerate(data.feature_names)}
    out = data.y == KINDS.index("outage")
    assert np.all(data.X[out, col["prb_util_z0"]] < -5)
    normal = data.y == 0
    assert np.median(np.abs(data.X[normal, col["prb_util_z0"]])) < 1.5


def test_windows_are_shifted_copies_of_one_series(data):
    W = data.params["window"]
    col = {n: i for i, n in enumerate(data.feature_names)}
    assert len(data.feature_names) == len(KPIS) * W + 3
    cell, step = data.info["cell"], data.info["step"]
    same = (cell[1:] == cell[:-1]) & (step[1:] == step[:-1] + 1)
    for k in KPIS:
        assert np.array_equal(data.X[1:, col[f"{k}_z1"]][same], data.X[:-1, col[f"{k}_z0"]][same])
    assert step.min() == W - 1


def test_parties_vertical_split_and_test_days(data):
    assert data.num_parties == data.params["cells"]
    g0, g1 = data.vertical
    assert sorted(g0 + g1) == sorted(data.feature_names)
    assert "prb_util_z0" in g0 and "hour_sin" in g0 and "cqi_z0" in g1 and "drop_rate_z0" in g1
    steps_per_day = 1440 // data.params["interval_min"]
    day = data.info["step"] // steps_per_day
    for c in range(data.params["cells"]):
        m = data.info["cell"] == c
        flags = {k: set(data.test[m & (day == k)]) for k in np.unique(day[m])}
        assert all(len(f) == 1 for f in flags.values())
        assert sum(True in f for f in flags.values()) == round(0.2 * data.params["days"])


def test_anomaly_scores_by_hand():
    target = np.array([0, 0, 1, 2, 4, 0, 3])
    pred = np.array([0, 2, 1, 0, 4, 0, 1])  # TP 3 (rows 2, 4, 6), FP 1 (row 1), FN 1 (row 3)
    p, r, f = anomaly_scores(pred, target)
    assert (p, r) == (0.75, 0.75) and f == pytest.approx(0.75)
    logits = np.eye(5)[pred] * 3.0 - 1.0
    assert anomaly_scores(logits, target) == (p, r, f)
    assert anomaly_scores(np.zeros(7, int), target) == (0.0, 0.0, 0.0)
    assert anomaly_scores(np.zeros(3, int), np.zeros(3, int)) == (0.0, 0.0, 0.0)
    with pytest.raises(DataError):
        anomaly_scores(np.zeros(3, int), target)


def test_metric_functions_and_specs(data):
    spec = get_spec("kpi_anomaly")
    assert [(s.name, s.higher_is_better, s.low, s.high) for s in spec.metric_specs] == [
        ("anomaly_precision", True, 0.0, 1.0), ("anomaly_recall", True, 0.0, 1.0), ("anomaly_f1", True, 0.0, 1.0)]
    fns = scaled_metric_fns(data, data.test, spec)
    t = data.y[data.test]
    assert {k: f(t, t) for k, f in fns.items()} == {"anomaly_precision": 1.0, "anomaly_recall": 1.0,
                                                    "anomaly_f1": 1.0}
    always = np.ones_like(t)
    assert fns["anomaly_recall"](always, t) == 1.0
    assert fns["anomaly_precision"](always, t) == pytest.approx(np.mean(t != 0))


def test_same_seed_same_data_other_seed_other_data():
    p = {"cells": 4, "days": 7}
    a = load_scenario("kpi_anomaly", p, seed=11, cache=False)
    b = load_scenario("kpi_anomaly", p, seed=11, cache=False)
    c = load_scenario("kpi_anomaly", p, seed=12, cache=False)
    for x, y in ((a.X, b.X), (a.y, b.y), (a.test, b.test)):
        assert np.array_equal(x, y)
    assert not np.array_equal(a.X, c.X)


def test_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_CACHE", str(tmp_path))
    p = {"cells": 5, "days": 7, "window": 4}
    first = load_scenario("kpi_anomaly", p, seed=1)
    assert len(list((tmp_path / "scenarios").glob("kpi_anomaly-*.npz"))) == 1
    again = load_scenario("kpi_anomaly", p, seed=1)
    assert np.array_equal(first.X, again.X) and np.array_equal(first.y, again.y)
    assert again.target_names == KINDS and again.vertical == first.vertical
    assert np.array_equal(first.info["drop_rate"], again.info["drop_rate"])


def test_bad_parameters_are_config_errors():
    for bad in ({"interval_min": 7}, {"kind_weights": {"meteor": 1.0}}, {"spike_minutes": (30, 10)},
                {"window": 400, "days": 2}, {"cells": 0}):
        with pytest.raises(ConfigError):
            load_scenario("kpi_anomaly", bad, cache=False)


def test_describe_writes_stats_and_a_png(data, tmp_path):
    lines, paths = get_spec("kpi_anomaly").describe(data, tmp_path)
    assert lines[0].startswith(f"kpi_anomaly: {len(data.y)} rows")
    assert any("label share" in line and "outage" in line for line in lines)
    assert len(paths) == 1 and paths[0].stat().st_size > 10_000
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
