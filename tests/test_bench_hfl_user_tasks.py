"""bench/hfl_user_tasks.py on a tiny setting: two tasks, one seed, two rounds, dense FedAvg beside Sluice."""

from __future__ import annotations

import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_hfl_user_tasks_bench_writes_its_results(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import hfl_user_tasks

    out = tmp_path / "user"
    hfl_user_tasks.main(["--tasks", "gru-bn-adam", "regression-ln-sgd", "--seeds", "1", "--rounds", "2",
                         "--jobs", "1", "--out", str(out)])
    res = json.loads(out.with_suffix(".json").read_text())
    assert res["rounds"] == 2 and res["seeds"] == [0]
    assert {(r["task"], r["method"]) for r in res["runs"]} == {
        (t, m) for t in ("gru-bn-adam", "regression-ln-sgd") for m in ("dense", "sluice")}
    gru = res["results"]["gru-bn-adam"]
    assert gru["params"] == 1156 and gru["target_reduction"] == 20.0 and gru["reduction"] > 1
    assert any("fitted to task 'gru-bn-adam'" in n and "Adam" in n for n in gru["notes"])
    assert all(r["notes"] == [] for r in res["runs"] if r["method"] == "dense")
    md = out.with_suffix(".md").read_text()
    assert "| gru-bn-adam | Adam |" in md and "Worst gap" in md
