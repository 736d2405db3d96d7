"""Benchmark: the network-analytics scenarios, centralised vs dense FedAvg vs Sluice's compressed HFL.

For each scenario at its default size (``coverage``, ``energy``, ``kpi_anomaly``; :mod:`sluice.data.scenarios`)
it measures

* generation time (the cache turned off) and the size of the cached ``.npz`` file;
* the type-specific error of the centralised model (``sluice local``: every party's train rows pooled),
  of dense FedAvg across the scenario's parties (fp32 both ways, dense downlink) and of Sluice's
  compressed HFL (the defaults of ``sluice run``), with the bytes each federated run put on the wire (up +
  down, ``len()`` of every message).

Both federated runs use the same model, rounds, learning rate, participation and seeds; the centralised
run the same model and learning rate. The type-specific error is ``coverage_error`` (coverage: RMSE of
RSRP / RSRQ / SINR over their standard deviation, averaged; predicting the mean scores 1),
``energy_error`` (energy: mean relative L1 error of consumption and efficiency) and ``1 − anomaly_f1``
(kpi_anomaly: the anomaly-vs-normal F1 as an error).
Because it moves from one evaluation to the next, a run's error is the mean over its last ``--tail``
evaluations, then averaged over the seeds. The target: the compressed model within 10 % of dense FedAvg's
error (``err_sluice ≤ 1.1 · err_dense``) with at least 50× fewer bytes.

    .venv/bin/python bench/scenarios.py            # 2 seeds (writes bench/results/scenarios.{md,json})
    .venv/bin/python bench/scenarios.py --quick    # 1 seed, a fifth of the rounds (smoke)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sluice.data.scenarios import load_scenario
from sluice.data.scenarios.base import cache_dir
from sluice.runtimes.jobs import job_from_dict

# Per scenario: the error metric, the model and training settings shared by every run of it.
SCENARIOS: dict[str, dict[str, Any]] = {
    "coverage": {"metric": "coverage_error", "hidden": [64, 64], "lr": 0.05, "rounds": 100,
                 "participation": 1.0, "local_epochs": 2, "batch_size": 16, "epochs": 30},
    "energy": {"metric": "energy_error", "hidden": [64, 64], "lr": 0.1, "rounds": 400,
               "participation": 0.25, "local_epochs": 2, "batch_size": 16, "epochs": 30},
    "kpi_anomaly": {"metric": "anomaly_f1", "hidden": [64, 64], "lr": 0.1, "rounds": 200,
                    "participation": 0.25, "local_epochs": 1, "batch_size": 32, "epochs": 20},
}
SETTINGS = {
    "dense FedAvg": {"up": "dense", "down": "dense", "downlink": "dense"},
    "sluice": {},  # the defaults of `sluice run`
}
TARGET_RATIO, TARGET_REDUCTION = 1.10, 50.0


def error_of(metric: str, value: float) -> float:
    """The type-specific error: the metric itself, or ``1 − F1`` for the anomaly F1."""
    return 1.0 - value if metric == "anomaly_f1" else value


def tail_mean(values: list[float], tail: int) -> float:
    return statistics.fmean(values[-tail:])


def generation(name: str) -> dict[str, float]:
    """Seconds to generate the default-size scenario (no cache) and the size of its cached file."""
    t0 = time.perf_counter()
    data = load_scenario(name, {}, seed=0, cache=False)
    seconds = time.perf_counter() - t0
    old = os.environ.get("SLUICE_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SLUICE_CACHE"] = tmp
        try:
            load_scenario(name, {}, seed=0)
            (path,) = list(cache_dir().glob(f"{name}-*.npz"))
            size = path.stat().st_size
        finally:
            if old is None:
                os.environ.pop("SLUICE_CACHE")
            else:
                os.environ["SLUICE_CACHE"] = old
    return {"generate_s": seconds, "npz_bytes": size, "rows": int(len(data.y)), "features": int(data.X.shape[1]),
            "parties": data.num_parties, "task": data.task}


def run_local(name: str, s: dict[str, Any], seed: int, tail: int) -> dict[str, Any]:
    job = job_from_dict("local", {"seed": seed, "data": {"dataset": name}, "model": {"hidden": s["hidden"]},
                                  "train": {"iterations": s["epochs"], "lr": s["lr"], "batch_size": s["batch_size"]}})
    engine = job.build()
    curve = [engine.iterate().metrics[s["metric"]] for _ in range(s["epochs"])]
    return {"error": tail_mean([error_of(s["metric"], v) for v in curve], tail), "curve": curve}


def run_hfl(name: str, s: dict[str, Any], compression: dict[str, str], seed: int, rounds: int,
            tail: int) -> dict[str, Any]:
    job = job_from_dict("hfl", {
        "seed": seed, "data": {"dataset": name}, "model": {"hidden": s["hidden"]}, "compression": compression,
        "train": {"rounds": rounds, "lr": s["lr"], "participation": s["participation"],
                  "local_epochs": s["local_epochs"], "batch_size": s["batch_size"]}})
    engine = job.build()
    curve, up, down = [], 0, 0
    t0 = time.perf_counter()
    for _ in range(rounds):
        ev = engine.iterate()
        curve.append(ev.metrics[s["metric"]])
        up, down = up + ev.bytes_up, down + ev.bytes_down
    return {"error": tail_mean([error_of(s["metric"], v) for v in curve], tail), "bytes_up": up,
            "bytes_down": down, "wall_s": time.perf_counter() - t0, "num_params": engine.num_params,
            "clients": len(engine.data.clients), "curve": curve}


def mean(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.fmean(r[key] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--tail", type=int, default=10, help="evaluations averaged at the end of each run")
    ap.add_argument("--quick", action="store_true", help="1 seed, a fifth of the rounds")
    ap.add_argument("--only", nargs="*", default=list(SCENARIOS), choices=list(SCENARIOS))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "scenarios"))
    args = ap.parse_args()
    if args.quick:
        args.seeds = 1
    results: dict[str, Any] = {"seeds": args.seeds, "tail": args.tail, "machine": platform.platform(),
                               "python": platform.python_version(), "cpus": os.cpu_count(),
                               "target": {"error_ratio_max": TARGET_RATIO, "reduction_min": TARGET_REDUCTION},
                               "scenarios": {}}
    for name in args.only:
        s = SCENARIOS[name]
        rounds = max(10, s["rounds"] // 5) if args.quick else s["rounds"]
        gen = generation(name)
        print(f"{name}: generated in {gen['generate_s']:.2f} s, {gen['npz_bytes'] / 1e6:.2f} MB", flush=True)
        local = [run_local(name, s, seed, args.tail) for seed in range(args.seeds)]
        fed = {label: [run_hfl(name, s, comp, seed, rounds, args.tail) for seed in range(args.seeds)]
               for label, comp in SETTINGS.items()}
        dense, sluice = fed["dense FedAvg"], fed["sluice"]
        err_dense, err_sluice = mean(dense, "error"), mean(sluice, "error")
        bytes_dense = mean(dense, "bytes_up") + mean(dense, "bytes_down")
        bytes_sluice = mean(sluice, "bytes_up") + mean(sluice, "bytes_down")
        ratio, reduction = err_sluice / err_dense, bytes_dense / bytes_sluice
        results["scenarios"][name] = {
            "settings": {**s, "rounds": rounds}, "generation": gen,
            "error_name": "1 - anomaly_f1" if s["metric"] == "anomaly_f1" else s["metric"],
            "centralised": {"error": mean(local, "error"), "runs": local},
            **{label: {"error": mean(runs, "error"), "bytes_up": mean(runs, "bytes_up"),
                       "bytes_down": mean(runs, "bytes_down"), "wall_s": mean(runs, "wall_s"), "runs": runs}
               for label, runs in fed.items()},
            "error_ratio": ratio, "reduction": reduction,
            "pass": ratio <= TARGET_RATIO and reduction >= TARGET_REDUCTION,
        }
        print(f"  centralised {mean(local, 'error'):.4f}, dense {err_dense:.4f} ({bytes_dense / 1e6:.2f} MB), "
              f"sluice {err_sluice:.4f} ({bytes_sluice / 1e6:.3f} MB): ratio {ratio:.3f}, {reduction:.0f}x", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    out.with_suffix(".md").write_text(render(results))
    print(f"wrote {out.with_suffix('.md')} and .json")


def render(results: dict[str, Any]) -> str:
    """The Markdown table of ``results``."""
    lines = [
        "# Network-analytics scenarios: centralised vs dense FedAvg vs Sluice's compressed HFL",
        "",
        f"`bench/scenarios.py`, default scenario sizes, {results['seeds']} training seed(s) (data seed 0), "
        f"error = mean of the last {results['tail']} evaluations of a run, averaged over the seeds. "
        f"Machine: {results['machine']}, {results['cpus']} CPUs (shared). Target: Sluice's error ≤ "
        f"{TARGET_RATIO:.2f} × dense FedAvg's at ≥ {TARGET_REDUCTION:.0f}× fewer bytes (up + down).",
        "",
        "| scenario | error | parties | rounds | centralised | dense FedAvg | MB | Sluice | MB | error ratio "
        "| bytes reduction | target |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in results["scenarios"].items():
        d, s = r["dense FedAvg"], r["sluice"]
        lines.append(
            f"| {name} | {r['error_name']} | {r['generation']['parties']} | {r['settings']['rounds']} "
            f"| {r['centralised']['error']:.4f} | {d['error']:.4f} | {(d['bytes_up'] + d['bytes_down']) / 1e6:.2f} "
            f"| {s['error']:.4f} | {(s['bytes_up'] + s['bytes_down']) / 1e6:.3f} | {r['error_ratio']:.3f} "
            f"| {r['reduction']:.0f}× | {'pass' if r['pass'] else 'MISS'} |")
    lines += ["", "| scenario | task | rows | features | parties | generation (s, no cache) | .npz on disk (MB) |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for name, r in results["scenarios"].items():
        g = r["generation"]
        lines.append(f"| {name} | {g['task']} | {g['rows']} | {g['features']} | {g['parties']} "
                     f"| {g['generate_s']:.2f} | {g['npz_bytes'] / 1e6:.2f} |")
    lines += ["", "Settings per scenario (the same for every run of it): " + "; ".join(
        f"{n}: hidden {r['settings']['hidden']}, lr {r['settings']['lr']}, participation "
        f"{r['settings']['participation']}, local epochs {r['settings']['local_epochs']}, batch "
        f"{r['settings']['batch_size']}, centralised epochs {r['settings']['epochs']}"
        for n, r in results["scenarios"].items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
