"""Coverage scenario: TR 38.901 formulas at hand-computed points, signal relations, labels, seeding, cache."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.spatial import cKDTree

from sluice.config import validate
from sluice.data.scenarios import get_spec, load_scenario, scaled_metric_fns
from sluice.data.scenarios.base import _save, cache_dir
from sluice.data.scenarios.coverage import (
    CLASSES,
    PRIORITY,
    PROBLEMS,
    CoverageParams,
    antenna_gain_db,
    correlated_fields,
    generate,
    los_probability,
    o2i_loss_db,
    path_loss_db,
    region_ratios,
)
from sluice.errors import ConfigError

SMALL = {"ues_per_cell": 30}


def make(seed: int = 0, **kw):
    return generate(validate(CoverageParams, {**SMALL, **kw}), seed)


# ------------------------------------------------------------------------------------- TR 38.901
# fc = 3.5 GHz, h_UT = 1.5 m, h_E = 1 m. UMa: h_BS = 25 m, d'BP = 4·24·0.5·3.5e9/3e8 = 560 m.
# UMi: h_BS = 10 m, d'BP = 4·9·0.5·3.5e9/3e8 = 210 m. 20 log10(3.5) = 10.8814.
@pytest.mark.parametrize("scenario,d2d,los,expected", [
    # UMa LOS below the breakpoint: 28 + 22 log10(√(100² + 23.5²)) + 20 log10 3.5
    ("UMa", 100.0, True, 83.1382),
    # UMa LOS above: 28 + 40 log10(√(1500² + 23.5²)) + 20 log10 3.5 − 9 log10(560² + 23.5²)
    ("UMa", 1500.0, True, 116.4529),
    # UMa NLOS = max(LOS, 13.54 + 39.08 log10 d3D + 20 log10 3.5) — the NLOS term wins at both points
    ("UMa", 100.0, False, 103.0375),
    ("UMa", 1500.0, False, 148.5451),
    # UMi LOS: 32.4 + 21 log10(√(100² + 8.5²)) + 20 log10 3.5; above: 32.4 + 40 log10 d3D + … − 9.5 log10(210² + 8.5²)
    ("UMi", 100.0, True, 85.3142),
    ("UMi", 500.0, True, 107.1138),
    # UMi NLOS: 35.3 log10 d3D + 22.4 + 21.3 log10 3.5
    ("UMi", 100.0, False, 104.6438),
    ("UMi", 500.0, False, 129.2645),
])
def test_path_loss_hand_points(scenario, d2d, los, expected):
    assert path_loss_db(scenario, np.array([d2d]), 1.5, 3.5, los)[0] == pytest.approx(expected, abs=1e-3)


def test_uma_los_breakpoint_joins_and_steepens():
    pl = path_loss_db("UMa", np.array([559.0, 561.0, 1000.0, 2000.0]), 1.5, 3.5, True)
    # hand values either side of d'BP = 560 m: 99.3329 (22 log10 slope) and 99.3808 (40 log10 slope)
    assert pl[:2] == pytest.approx([99.3329, 99.3808], abs=1e-3)
    assert pl[3] - pl[2] == pytest.approx(40 * math.log10(2000.8 / 1000.3), abs=0.01)  # 40 dB/decade beyond


def test_nlos_never_below_los_and_distance_clipped_to_10m():
    d = np.geomspace(1, 5000, 200)
    for sc in ("UMa", "UMi"):
        assert np.all(path_loss_db(sc, d, 1.5, 3.5, False) >= path_loss_db(sc, d, 1.5, 3.5, True))
        assert path_loss_db(sc, np.array([2.0]), 1.5, 3.5, True)[0] == path_loss_db(sc, np.array([10.0]), 1.5, 3.5,
                                                                                       True)[0]


def test_los_probability_hand_points():
    d = np.array([10.0, 18.0, 100.0])
    # 18/100 + exp(−100/63)(1 − 18/100) = 0.34767; UMi with 36 m: 0.23098
    assert los_probability("UMa", d) == pytest.approx([1.0, 1.0, 0.347671], abs=1e-5)
    assert los_probability("UMi", d) == pytest.approx([1.0, 1.0, 0.230985], abs=1e-5)
    # UMa at h_UT = 22.5 m: × (1 + (9.5/10)^1.5 · 1.25 · 1³ · exp(−100/150)) = 0.55427
    assert los_probability("UMa", np.array([100.0]), 22.5)[0] == pytest.approx(0.554273, abs=1e-5)
    assert los_probability("UMa", np.array([100.0]), 13.0)[0] == pytest.approx(0.347671, abs=1e-5)


def test_antenna_pattern_hand_points():
    # boresight 8 dBi; half beamwidth off in azimuth −12·(32.5/65)² = −3 dB; behind: A_max 30 dB
    g = antenna_gain_db(np.array([0.0, 32.5, 180.0, 0.0]), np.array([12.0, 12.0, 12.0, 44.5]), 12.0)
    assert g == pytest.approx([8.0, 5.0, -22.0, 8.0 - 12 * (32.5 / 65) ** 2], abs=1e-9)


def test_o2i_penetration_hand_points():
    # 3.5 GHz: L_glass 2.7, L_concrete 19, L_IRR 24.05 dB
    low = 5 - 10 * math.log10(0.3 * 10 ** -0.27 + 0.7 * 10 ** -1.9)  # 12.698
    high = 5 - 10 * math.log10(0.7 * 10 ** -2.405 + 0.3 * 10 ** -1.9)  # 26.849
    got = o2i_loss_db(3.5, np.array([0.0, 10.0, 0.0]), np.array([True, True, False]), np.array([0.0, 1.0, 0.0]))
    assert got == pytest.approx([low, low + 5.0 + 4.4, high], abs=1e-9)
    assert low == pytest.approx(12.698, abs=1e-3) and high == pytest.approx(26.849, abs=1e-3)


def test_shadowing_fields_are_spatially_correlated():
    step, d_cor = 10.0, 40.0
    z = correlated_fields(np.random.default_rng(0), 500, (20, 40), step, d_cor).astype(np.float64)
    assert z.std() == pytest.approx(1.0, abs=0.03)
    near = np.mean(z[:, :, :-1] * z[:, :, 1:])  # 10 m apart: exp(−10/40) = 0.78
    across = np.mean(z[:, :-1, :] * z[:, 1:, :])  # the same along y
    diag = np.mean(z[:, :-1, :-1] * z[:, 1:, 1:])  # (10, 10) m: exp(−20/40) = 0.61
    far = np.mean(z[:, :, :-30] * z[:, :, 30:])  # 300 m apart: exp(−300/40) ≈ 0
    assert near == pytest.approx(math.exp(-0.25), abs=0.04)
    assert across == pytest.approx(math.exp(-0.25), abs=0.04)
    assert diag == pytest.approx(math.exp(-0.5), abs=0.05)
    assert abs(far) < 0.06


def test_neighbouring_positions_agree():
    d = make(ues_per_cell=300, indoor_fraction=0.0)  # outdoor only: no per-UE penetration loss
    i = d.info
    pairs = cKDTree(np.stack([i["x_m"], i["y_m"]], 1)).query_pairs(5.0, output_type="ndarray")
    pairs = pairs[i["cell"][pairs[:, 0]] == i["cell"][pairs[:, 1]]]
    assert len(pairs) > 100
    diff = np.abs(i["rsrp_dbm"][pairs[:, 0]] - i["rsrp_dbm"][pairs[:, 1]])
    # independent shadowing (σ ≥ 4 dB) would give a median |ΔRSRP| of at least 0.6745·√2·4 = 3.8 dB
    assert np.median(diff) < 1.0
    assert np.mean(i["los"][pairs[:, 0]] == i["los"][pairs[:, 1]]) > 0.9


# -------------------------------------------------------------------------------------- signals
def test_more_load_means_lower_rsrq_and_sinr():
    light, heavy = make(load_min=0.2, load_max=0.2), make(load_min=0.9, load_max=0.9)
    np.testing.assert_array_equal(light.info["rsrp_dbm"], heavy.info["rsrp_dbm"])
    assert np.all(heavy.info["rsrq_db"] < light.info["rsrq_db"])
    assert np.all(heavy.info["sinr_db"] < light.info["sinr_db"])
    # with every cell at load ρ and no noise RSRQ = −10 log10(12 ρ) would be the ceiling
    assert heavy.info["rsrq_db"].max() <= -10 * math.log10(12 * 0.9) + 1e-6


def test_rsrq_and_sinr_follow_their_definitions():
    d = make(seed=3)
    sinr = 10 ** (d.info["sinr_db"] / 10)
    rsrq = 10 ** (d.info["rsrq_db"] / 10)
    assert np.all(rsrq <= 1 / (12 * 0.3) + 1e-9)  # load ≥ 0.3 ⇒ RSSI/RE ≥ 0.3·RSRP
    assert np.all(np.isfinite(sinr)) and np.all(np.isfinite(rsrq))
    # serving cell is the strongest: no neighbour stronger
    assert np.all(d.info["neighbour_rsrp_dbm"][:, 0] <= d.info["rsrp_dbm"])


# --------------------------------------------------------------------------------------- labels
def test_default_size_has_every_problem_and_valid_ratios():
    d = generate(CoverageParams(), 0)
    flags = d.info["flags"]
    share = flags.mean(0)
    assert np.all(share > 0) and np.all(share < 0.5), dict(zip(PROBLEMS, share, strict=True))
    r = region_ratios(flags, d.info["region"])
    assert r.shape[1] == len(PROBLEMS) and np.all((r >= 0) & (r <= 1))
    p = CoverageParams()
    rsrp = d.info["rsrp_dbm"]
    np.testing.assert_array_equal(flags[:, PROBLEMS.index("weak_coverage")], rsrp < p.weak_rsrp_dbm)
    np.testing.assert_array_equal(flags[:, PROBLEMS.index("coverage_hole")], rsrp < p.hole_rsrp_dbm)
    # the class is the first flagged problem in priority order
    for i, row in enumerate(flags[:300]):
        present = [PROBLEMS.index(n) + 1 for n in PRIORITY if row[PROBLEMS.index(n)]]
        assert d.info["problem"][i] == (present[0] if present else 0)
    assert d.num_parties == 7 and set(np.unique(d.party)) == set(range(7))
    np.testing.assert_array_equal(d.party, d.info["site"])
    assert d.test.mean() == pytest.approx(0.2, abs=1e-3)


def test_vertical_groups_cover_features_once_without_targets():
    for target in ("signals", "problems"):
        d = make(target=target)
        flat = [f for g in d.vertical for f in g]
        assert sorted(flat) == sorted(d.feature_names) and len(flat) == len(set(flat)) and len(d.vertical) == 2
        if target == "signals":
            assert d.task == "regression" and d.y.shape == (len(d.X), 3)
            assert not {"rsrp_dbm", "rsrq_db", "sinr_db"} & set(d.feature_names)
        else:
            assert d.task == "classification" and d.target_names == CLASSES
            assert "rsrp_dbm" in d.vertical[0] and "nbr_rsrp_1_dbm" in d.vertical[1]


def test_same_seed_same_data_other_seed_differs():
    a, b, c = make(seed=5), make(seed=5), make(seed=6)
    for k in ("X", "y", "party", "test"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
    for k in a.info:
        np.testing.assert_array_equal(a.info[k], b.info[k])
    assert not np.array_equal(a.X, c.X) and not np.array_equal(a.y, c.y)


def test_bad_parameters_are_config_errors():
    with pytest.raises(ConfigError, match="hole_rsrp_dbm"):
        validate(CoverageParams, {"hole_rsrp_dbm": -100, "weak_rsrp_dbm": -110})
    with pytest.raises(ConfigError, match="load_min"):
        validate(CoverageParams, {"load_min": 0.9, "load_max": 0.5})
    with pytest.raises(ConfigError):
        validate(CoverageParams, {"cells": 3})


# -------------------------------------------------------------------------------------- metrics
def test_signal_metrics_zero_for_truth_and_grow_with_error():
    d = make(seed=1, ues_per_cell=60)
    spec = get_spec("coverage")
    rows = d.test
    y = d.y[rows].astype(np.float64)
    fns = spec.metrics(d, rows)
    signals = {f"coverage{kind}_error{s}" for kind in ("", "_ratio") for s in ("", "_rsrp", "_rsrq", "_sinr")}
    assert set(fns) == signals | {"rsrp_error", "rsrq_error", "sinr_error", "problem_ratio_error"}
    assert all(f(y, y) == 0.0 for f in fns.values())
    worse = y - np.array([10.0, 0.0, 0.0])
    assert fns["rsrp_error"](worse, y) == pytest.approx(10.0)
    assert fns["rsrq_error"](worse, y) == 0.0
    assert fns["coverage_error_rsrp"](worse, y) == pytest.approx(10.0 / y[:, 0].std())
    assert fns["coverage_error"](worse, y) == pytest.approx(10.0 / y[:, 0].std() / 3)
    assert fns["coverage_ratio_error_rsrp"](worse, y) > 0 and fns["problem_ratio_error"](worse, y) > 0
    assert fns["coverage_error"](np.tile(y.mean(0), (len(y), 1)), y) == pytest.approx(1.0)  # the mean scores 1
    # engines pass standardised outputs: the wrapped functions undo the scaling first
    _, ys = d.scaled()
    wrapped = scaled_metric_fns(d, rows, spec)
    assert wrapped["rsrp_error"](ys[rows], ys[rows]) == pytest.approx(0.0, abs=1e-4)
    declared = {s.name: s for s in spec.metric_specs}
    assert {"rsrp_error", "rsrq_error", "sinr_error", "problem_ratio_error"} <= set(declared)
    assert not declared["problem_ratio_error"].higher_is_better and declared["problem_ratio_error"].high == 1.0


def test_problem_metrics_from_logits_or_ids():
    d = make(seed=2, ues_per_cell=60, target="problems")
    rows = np.flatnonzero(d.test)
    fn = get_spec("coverage").metrics(d, rows)["problem_ratio_error"]
    y = d.y[rows]
    logits = np.eye(len(CLASSES))[y] * 5.0
    assert fn(logits, y) == 0.0 and fn(y, y) == 0.0
    assert fn(np.zeros_like(y), y) > 0  # predicting "none" everywhere misses every problem


# --------------------------------------------------------------------------------- cache, describe
def test_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_CACHE", str(tmp_path))
    a = load_scenario("coverage", SMALL, seed=4)
    files = list(cache_dir().glob("coverage-*.npz"))
    assert cache_dir().parent == tmp_path and len(files) == 1
    b = load_scenario("coverage", SMALL, seed=4)
    np.testing.assert_array_equal(a.X, b.X)
    assert b.feature_names == a.feature_names and b.vertical == a.vertical and b.params == a.params
    np.testing.assert_array_equal(a.info["neighbour_rsrp_dbm"], b.info["neighbour_rsrp_dbm"])
    # the second load reads the file: a changed file is what comes back
    b.X = b.X + 1
    _save(files[0], b)
    np.testing.assert_array_equal(load_scenario("coverage", SMALL, seed=4).X, a.X + 1)
    load_scenario("coverage", {**SMALL, "load_max": 0.8}, seed=4)
    assert len(list(cache_dir().glob("coverage-*.npz"))) == 2


def test_describe_writes_map(tmp_path):
    d = make(seed=0)
    lines, paths = get_spec("coverage").describe(d, tmp_path)
    assert len(paths) == 1 and paths[0].suffix == ".png" and paths[0].stat().st_size > 10_000
    text = "\n".join(lines)
    assert all(p in text for p in PROBLEMS) and "RSRP" in text and "parties (sites) 7" in text
