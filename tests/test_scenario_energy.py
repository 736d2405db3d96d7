"""Energy-saving scenario: EARTH power values, energy-saving modes, targets, split, seeding, cache, describe."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.data.scenarios import get_spec, load_scenario, scaled_metric_fns
from sluice.data.scenarios.energy import CELL_TYPES, EARTH, ES_MODES, PROFILES, cell_power
from sluice.errors import ConfigError, DataError

SMALL = {"cells": 12, "sites": 4, "days": 14}


@pytest.fixture(scope="module")
def data():
    return load_scenario("energy", SMALL, seed=3, cache=False)


@pytest.mark.parametrize(("cell_type", "load", "sleeping", "watts"), [
    ("macro", 0.0, False, 6 * 130.0),                     # N_TRX·P0
    ("macro", 0.5, False, 1062.0),                        # 6·(130 + 4.7·20·0.5), Auer et al. 2011
    ("macro", 1.0, False, 6 * (130.0 + 4.7 * 20.0)),      # 1344 W
    ("macro", 0.0, True, 6 * 75.0),                       # N_TRX·P_sleep
    ("rrh", 0.5, False, 6 * (84.0 + 2.8 * 20.0 * 0.5)),   # 672 W
    ("micro", 1.0, False, 2 * (56.0 + 2.6 * 6.3)),
    ("femto", 1.0, False, 2 * (4.8 + 8.0 * 0.05)),
    ("femto", 0.3, True, 2 * 2.9),
])
def test_earth_power_table_values(cell_type, load, sleeping, watts):
    assert float(cell_power(cell_type, load, sleeping=sleeping)) == pytest.approx(watts, rel=1e-12)


def test_earth_power_is_linear_in_load_and_backoff_lowers_it():
    loads = np.linspace(0, 1, 11)
    p = cell_power("macro", loads)
    assert np.allclose(np.diff(p), 6 * 4.7 * 20 * 0.1)
    assert float(cell_power("macro", 1.0, backoff_db=3.0)) < float(cell_power("macro", 1.0))
    with pytest.raises(DataError):
        cell_power("macro", 1.2)
    with pytest.raises(DataError):
        cell_power("tower", 0.5)


def _expected_power(d) -> np.ndarray:
    """Input power of every row re-derived from its features and the EARTH table."""
    X, col = d.X.astype(np.float64), {n: i for i, n in enumerate(d.feature_names)}
    ctype = np.argmax(X[:, [col[f"type_{t}"] for t in CELL_TYPES]], axis=1)
    es = np.argmax(X[:, [col[f"es_{m}"] for m in ES_MODES]], axis=1)
    n_trx = np.array([EARTH[t].n_trx for t in CELL_TYPES], float)[ctype]
    p0 = np.array([EARTH[t].p0_w for t in CELL_TYPES])[ctype]
    dp = np.array([EARTH[t].delta_p for t in CELL_TYPES])[ctype]
    psl = np.array([EARTH[t].p_sleep_w for t in CELL_TYPES])[ctype]
    k = X[:, col["carriers"]]
    p_conf = 10 ** (X[:, col["tx_power_dbm"]] / 10) / 1000
    load = X[:, col["prb_load"]]
    s = d.params["symbol_shutdown_saving"]
    p0_eff = np.where(es == 1, p0 * (1 - s * (1 - load)), p0)
    on = n_trx * (p0_eff + dp * p_conf * load)
    off = n_trx * psl
    return np.select([es == 3, es == 2], [k * off, on + off], k * on)


def test_power_follows_earth_and_the_es_mode_of_each_row(data):
    assert np.allclose(data.info["power_w"], _expected_power(data), rtol=1e-4)
    es = data.info["es_mode"]
    X = data.X
    col = {n: i for i, n in enumerate(data.feature_names)}
    assert np.all(X[es == 3, col["prb_load"]] == 0)
    assert np.all(X[es == 2, col["carriers"]] == 2)
    assert set(np.unique(es)) >= {0, 1, 2}


def test_energy_saving_lowers_power_on_the_same_traffic():
    on = load_scenario("energy", {**SMALL, "es_cell_share": 1.0}, seed=5, cache=False)
    off = load_scenario("energy", {**SMALL, "es_cell_share": 0.0}, seed=5, cache=False)
    assert np.array_equal(on.info["demand"], off.info["demand"])
    assert np.all(off.info["es_mode"] == 0)
    saving = on.info["es_mode"] > 0
    assert saving.mean() > 0.2
    assert np.all(on.info["power_w"][saving] < off.info["power_w"][saving])
    assert np.allclose(on.info["power_w"][~saving], off.info["power_w"][~saving])
    assert on.y[:, 0].sum() < 0.95 * off.y[:, 0].sum()


def test_targets_kwh_and_bits_per_joule_are_consistent(data):
    kwh, ee = data.y[:, 0].astype(np.float64), data.y[:, 1].astype(np.float64)
    assert data.target_names == ("energy_kwh", "energy_efficiency_bit_per_j")
    assert np.allclose(ee, data.info["bits"] / (kwh * 3.6e6), rtol=1e-5)
    # the meter error is small: kWh ≈ W · 1 h / 1000
    assert np.allclose(kwh, data.info["power_w"] / 1000, rtol=0.06)
    sleeping = data.info["es_mode"] == 3
    assert np.all(ee[sleeping] == 0) and np.all(ee[~sleeping & (data.info["bits"] > 0)] > 0)


def test_weekend_factor_scales_demand_as_parameterised():
    params = {**SMALL, "traffic_noise": 0.0, "day_noise": 0.0,
              "weekend_factor": {"business": 0.4, "residential": 1.3, "transport": 0.8}}
    d = load_scenario("energy", params, seed=1, cache=False)
    hour, demand, prof = d.info["hour"], d.info["demand"].astype(np.float64), d.info["profile"]
    monday, saturday = (hour // 24) == 0, (hour // 24) == 5
    for i, name in enumerate(PROFILES):
        for c in np.unique(d.info["cell"][prof == i]):
            m = d.info["cell"] == c
            ratio = demand[m & saturday] / demand[m & monday]
            assert np.allclose(ratio, params["weekend_factor"][name], rtol=1e-5), name


def test_split_holds_out_whole_days_per_cell(data):
    day = data.info["hour"] // 24
    for c in range(SMALL["cells"]):
        m = data.info["cell"] == c
        per_day = np.array([data.test[m & (day == k)].mean() for k in range(SMALL["days"])])
        assert set(per_day) <= {0.0, 1.0}
        assert per_day.sum() == round(0.2 * SMALL["days"])


def test_parties_and_vertical_groups(data):
    assert data.num_parties == SMALL["cells"]
    by_site = load_scenario("energy", {**SMALL, "party_by": "site"}, seed=3, cache=False)
    assert by_site.num_parties == SMALL["sites"]
    groups = data.vertical
    assert sorted(n for g in groups for n in g) == sorted(data.feature_names)
    assert "es_sleep" in groups[0] and "type_macro" in groups[0] and "prb_load" in groups[1]


def test_same_seed_same_data_other_seed_other_data():
    a = load_scenario("energy", SMALL, seed=7, cache=False)
    b = load_scenario("energy", SMALL, seed=7, cache=False)
    c = load_scenario("energy", SMALL, seed=8, cache=False)
    for x, y in ((a.X, b.X), (a.y, b.y), (a.test, b.test), (a.party, b.party)):
        assert np.array_equal(x, y)
    assert not np.array_equal(a.y, c.y)


def test_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_CACHE", str(tmp_path))
    first = load_scenario("energy", SMALL, seed=2)
    files = list((tmp_path / "scenarios").glob("energy-*.npz"))
    assert len(files) == 1
    again = load_scenario("energy", SMALL, seed=2)
    assert np.array_equal(first.X, again.X) and np.array_equal(first.y, again.y)
    assert again.feature_names == first.feature_names and again.vertical == first.vertical
    for k, v in first.info.items():
        assert np.array_equal(v, again.info[k]), k
    load_scenario("energy", {**SMALL, "days": 7}, seed=2)
    assert len(list((tmp_path / "scenarios").glob("energy-*.npz"))) == 2


def test_metrics_in_natural_units_through_the_scaled_wrapper(data):
    spec = get_spec("energy")
    assert {s.name for s in spec.metric_specs} == {"energy_error", "energy_consumption_error",
                                                  "energy_efficiency_error"}
    fns = scaled_metric_fns(data, data.test, spec)
    _, ys = data.scaled()
    t = ys[data.test]
    assert fns["energy_error"](t, t) == pytest.approx(0.0, abs=1e-6)
    nat = data.y[data.test].astype(np.float64)
    off = nat * np.array([1.2, 1.0])
    xm, xs, ym, ysd = data.scaling()
    pred = (off - ym) / ysd
    got = fns["energy_consumption_error"](pred, t)
    assert got == pytest.approx(0.2, rel=1e-4)
    assert fns["energy_efficiency_error"](pred, t) == pytest.approx(0.0, abs=1e-5)
    assert fns["energy_error"](pred, t) == pytest.approx(0.1, rel=1e-3)


def test_bad_parameters_are_config_errors():
    for bad in ({"cell_mix": {"tower": 1.0}}, {"bandwidth_mhz": {"macro": 12.0}}, {"sites": 40},
                {"weekend_factor": {"business": 1.0}}, {"colour": 1}):
        with pytest.raises(ConfigError):
            load_scenario("energy", bad, cache=False)


def test_describe_writes_stats_and_a_png(data, tmp_path):
    lines, paths = get_spec("energy").describe(data, tmp_path)
    assert lines[0].startswith(f"energy: {len(data.y)} cell-hours")
    assert any("ES mode share" in line for line in lines)
    assert len(paths) == 1 and paths[0].stat().st_size > 10_000
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
