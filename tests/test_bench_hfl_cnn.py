"""bench/hfl_cnn.py on a tiny setting: one round of one seed, dense FedAvg, Sluice and one published method."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_hfl_cnn_bench_writes_its_results(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import hfl_cnn

    out = tmp_path / "hfl_cnn"
    hfl_cnn.main(["--rounds", "1", "--seeds", "1", "--jobs", "1", "--peer", "STC",
                  "--set", "train.local_epochs=1", "--out", str(out)])
    res = json.loads(out.with_suffix(".json").read_text())
    assert res["rounds"] == 1 and res["seeds"] == 1
    assert "task.name=\"mnist_cnn\"" in res["workload"] and "train.participation=0.1" in res["workload"]
    ms = res["scenarios"][hfl_cnn.SCENARIO]["methods"]
    assert list(ms) == [hfl_cnn.DENSE_NAME, "Sluice", "STC"]
    for name, m in ms.items():
        assert m["num_params"] == 1_663_370
        assert 0.0 <= m["accuracy_mean"] <= 1.0 and len(m["accuracies"]) == 1
        assert m["mb_total"] > 0 and m["accuracy_per_mb"] > 0
        assert abs(m["mb_up"] + m["mb_down"] - m["mb_total"]) < 1e-6
        for key in ("gap_points", "reduction_x", "collapsed_seeds"):
            assert key in m, (name, key)
        for clock in ("seconds_per_round", "cpu_seconds_per_round"):
            t = m[clock]
            parts = ("local", "up_encode", "down_encode", "up_decode", "down_decode", "server", "evaluate")
            assert all(t[k] >= 0 for k in parts), (name, clock, t)
            assert t["local"] > 0 and t["round"] >= t["local"]
            assert 0 < t["compression_share"] < 1
    assert ms[hfl_cnn.DENSE_NAME]["reduction_x"] == 1.0 and ms["Sluice"]["reduction_x"] > 10
    assert set(res["targets"]) == {"within_1_point", "reduction_100x", "no_collapsed_seed", "best_accuracy_per_mb",
                                   "compression_share_15pct"}
    md = out.with_suffix(".md").read_text()
    for text in ("| method | accuracy | seeds | gap (points) |", "| STC |", "compression share (CPU)",
                 "Within 1 point of dense FedAvg", "What the numbers show", "mnist_cnn", res["command"]):
        assert text in md, text
    assert out.with_suffix(".png").stat().st_size > 0
    again = tmp_path / "again" / "hfl_cnn"  # --render: the same markdown from the result file, nothing run
    hfl_cnn.main(["--render", str(out.with_suffix(".json")), "--out", str(again)])
    assert again.with_suffix(".md").read_text() == md and again.with_suffix(".png").exists()
    sys.modules.pop("hfl_cnn", None)
