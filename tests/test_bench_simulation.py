"""bench/simulation.py on a tiny setting: the default task at 4 clients, one timed round, both modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_simulation_bench_writes_both_modes_side_by_side(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import simulation

    out = tmp_path / "simulation"
    simulation.main(["--tasks", "default", "--clients", "4", "--rounds", "1", "--devices", "cpu",
                     "--out", str(out)])
    res = json.loads(out.with_suffix(".json").read_text())
    (row,) = res["rows"]
    assert (row["task"], row["device"], row["clients"]) == ("default", "cpu", 4)
    assert set(row["runs"]) == {"one by one", "together"}
    for run in row["runs"].values():
        assert "error" not in run, run
        assert run["seconds_per_round"] > 0 and 0 < run["training_seconds_per_round"] < run["seconds_per_round"]
        assert run["client_state_bytes"] > 0 and run["peak_rss_bytes"] > run["client_state_bytes"]
        assert len(run["bytes_up"]) == 2 and all(b > 0 for b in run["bytes_up"])
    assert row["rounds_same_bytes"] == row["rounds_compared"] == 2
    assert row["max_accuracy_diff"] == 0 and row["speedup"] > 0
    md = out.with_suffix(".md").read_text()
    assert "| default | cpu | 4 | together |" in md and "2/2" in md


@pytest.mark.flower
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_simulation_bench_runs_the_same_work_on_flowers_simulation_engine(tmp_path, monkeypatch):
    pytest.importorskip("ray", reason="Flower's Simulation Engine needs sluice[flower] (flwr[simulation])")
    monkeypatch.syspath_prepend(str(BENCH))
    import simulation

    out = tmp_path / "simulation"
    simulation.main(["--tasks", "default", "--clients", "3", "--rounds", "1", "--devices", "cpu", "--variants",
                     "dense", "--flower-clients", "3", "--ray-cpus", "2", "--out", str(out)])
    (row,) = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert (row["variant"], set(row["runs"])) == ("dense", {"one by one", "together", "flower-sim"})
    flower = row["runs"]["flower-sim"]
    assert "error" not in flower, flower
    assert flower["seconds_per_round"] > 0 and len(flower["bytes_up"]) == 2
    # dense FedAvg on Flower's engine: the simulator's bytes and accuracy, round by round
    assert row["flower"]["rounds_same_bytes"] == row["flower"]["rounds_compared"] == 2
    assert row["flower"]["max_accuracy_diff"] == 0 and row["flower"]["speedup"] > 0
    md = out.with_suffix(".md").read_text()
    assert "| default (dense FedAvg) | 3 |" in md and "Flower's Simulation Engine" in md
