"""Benchmark: dense FedAvg vs Sluice's bidirectional sparse compression (SPEC C).

Runs every setting for several seeds on two scenarios and writes ``bench/results/hfl_compression.md``
and ``.json``: final accuracy (mean ± sd), total MB up and down (``len()`` of every encoded message),
reduction × against dense fp32 FedAvg, and rounds to reach (dense final accuracy − 1 point).

    .venv/bin/python bench/hfl_compression.py            # full: 2 scenarios x 3 seeds, 150 rounds
    .venv/bin/python bench/hfl_compression.py --quick    # 1 seed, 30 rounds (smoke)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from sluice.config import load_config
from sluice.hfl import HFLEngine
from sluice.hfl.config import HFLConfig
from sluice.runs import History

SCENARIOS = {
    "digits-dir0.3": [],  # the built-in default of `sluice run`
    "mnist-shards": ["data.dataset=\"mnist\"", "data.partition=\"shards\""],
}
SETTINGS = {
    "dense FedAvg (fp32)": ["compression.up=\"dense\"", "compression.down=\"dense\"",
                            "compression.downlink=\"dense\""],
    "sluice per-client": [],
    "sluice anchor (A=10)": ["compression.downlink=\"anchor\""],
    "sluice initial": ["compression.downlink=\"initial\""],
}
BASELINE = "dense FedAvg (fp32)"


def run_one(overrides: list[str]) -> dict:
    cfg = load_config(None, overrides, HFLConfig)
    engine = HFLEngine(cfg)
    history = History()
    t0 = time.perf_counter()
    for _ in range(cfg.train.rounds):
        history.add(engine.iterate())
    return {
        "wall_seconds": time.perf_counter() - t0,
        "final_accuracy": history.last("test_accuracy"),
        "bytes_up": history.cum_bytes_up,
        "bytes_down": history.cum_bytes_down,
        "accuracy_curve": [r["test_accuracy"] for r in history.records],
        "num_params": engine.num_params,
    }


def rounds_to_reach(curve: list[float], target: float) -> int | None:
    return next((i + 1 for i, a in enumerate(curve) if a >= target), None)


def mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--quick", action="store_true", help="1 seed, 30 rounds")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "hfl_compression"))
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.rounds = 1, 30
    results: dict = {"rounds": args.rounds, "seeds": args.seeds, "machine": platform.platform(),
                     "python": platform.python_version(), "scenarios": {}}
    for scen, scen_over in SCENARIOS.items():
        per_setting: dict = {}
        for name, set_over in SETTINGS.items():
            runs = []
            for seed in range(args.seeds):
                over = [f"seed={seed}", f"train.rounds={args.rounds}", *scen_over, *set_over]
                r = run_one(over)
                runs.append(r)
                print(f"{scen:14s} {name:22s} seed {seed}: acc {r['final_accuracy']:.4f} "
                      f"up {r['bytes_up'] / 1e6:.3f} MB down {r['bytes_down'] / 1e6:.3f} MB "
                      f"({r['wall_seconds']:.1f} s)", flush=True)
            per_setting[name] = runs
        base = per_setting[BASELINE]
        base_total = statistics.fmean(r["bytes_up"] + r["bytes_down"] for r in base)
        target = statistics.fmean(r["final_accuracy"] for r in base) - 0.01
        rows = {}
        for name, runs in per_setting.items():
            acc_m, acc_sd = mean_sd([r["final_accuracy"] for r in runs])
            up = statistics.fmean(r["bytes_up"] for r in runs)
            down = statistics.fmean(r["bytes_down"] for r in runs)
            reach = [rounds_to_reach(r["accuracy_curve"], target) for r in runs]
            rows[name] = {
                "final_accuracy_mean": acc_m, "final_accuracy_sd": acc_sd,
                "mb_up": up / 1e6, "mb_down": down / 1e6, "mb_total": (up + down) / 1e6,
                "reduction_x": base_total / (up + down),
                "rounds_to_target": reach, "target_accuracy": target,
                "wall_seconds_mean": statistics.fmean(r["wall_seconds"] for r in runs),
                "num_params": runs[0]["num_params"],
                "runs": runs,
            }
        results["scenarios"][scen] = rows
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    lines = [f"# HFL compression benchmark ({args.rounds} rounds, {args.seeds} seeds)", "",
             f"Machine: {results['machine']}, Python {results['python']}. Bytes are `len()` of every encoded "
             "message, headers included. Target = dense final accuracy − 1 point.", ""]
    for scen, rows in results["scenarios"].items():
        d = next(iter(rows.values()))["num_params"]
        lines += [f"## {scen} (d = {d})", "",
                  "| setting | final accuracy | MB up | MB down | MB total | reduction × | rounds to target | s/run |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, r in rows.items():
            reach = ", ".join("—" if x is None else str(x) for x in r["rounds_to_target"])
            lines.append(f"| {name} | {r['final_accuracy_mean']:.4f} ± {r['final_accuracy_sd']:.4f} | "
                         f"{r['mb_up']:.3f} | {r['mb_down']:.3f} | {r['mb_total']:.3f} | "
                         f"{r['reduction_x']:.1f} | {reach} | {r['wall_seconds_mean']:.1f} |")
        lines.append("")
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
