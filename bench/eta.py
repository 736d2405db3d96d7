"""How good are the remaining-iteration estimates? Runs that reach their target, scored at 25, 50 and 75 %.

Every run is a real ``sluice`` job with a performance target (HFL on several federations and compression
settings, local training, split training); it stops when the target fires at iteration N. The estimator
(:class:`sluice.control.Estimator`, fed the run's ``metrics.jsonl`` as the run fed it) is asked after
``k = round(f·N)`` iterations for ``f`` = 25, 50 and 75 %; the truth is ``N − k``. Per fraction: the median
absolute relative error of the estimate, the share within ±25 %, and the share of 80 % intervals that
cover the truth (an estimate that is missing counts as wrong and uncovered).

The runs are split by seed: even seeds tune :class:`sluice.control.eta.EtaSettings` (``--tune`` tries a
grid and prints the best), odd seeds are held out and scored with the settings the estimator ships with.

    .venv/bin/python bench/eta.py --collect     # run the jobs (about 10 minutes on 2 cores), then score
    .venv/bin/python bench/eta.py               # score the collected runs (bench/results/eta_runs.json)
    .venv/bin/python bench/eta.py --tune        # grid over the settings on the tuning runs

Writes ``bench/results/eta.md`` and ``eta.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

from sluice.control.eta import Estimator, EtaSettings

RESULTS = Path(__file__).parent / "results"
RUNS_FILE = RESULTS / "eta_runs.json"
FRACTIONS = (0.25, 0.5, 0.75)
SEEDS = range(8)

ACC = "test_accuracy"
FAMILIES = {
    # name: (command, overrides, metric, threshold, patience)
    "hfl digits, sampled uploads (default)": (["run"], [], ACC, 0.95, 2),
    "hfl digits, dense": (["run"], ["compression.up=dense", "compression.down=dense"], ACC, 0.95, 2),
    "hfl digits, top-k uploads, lr 0.02": (["run"], ["compression.up=topk", "train.lr=0.02"], ACC, 0.93, 2),
    "hfl digits, 50 clients, q 0.2": (["run"], ["data.num_clients=50", "train.participation=0.2"], ACC, 0.93, 2),
    "local digits": (["local"], ["train.lr=0.01"], ACC, 0.95, 1),
    "split breast cancer": (["split", "run", "examples/split_breast_cancer.toml"],
                            ["transport.kind=inproc", "train.epochs=200", "train.lr=0.002"], ACC, 0.95, 1),
}


def _job(family: str, seed: int, out: Path) -> dict | None:
    """Run one job to its target; its metric curve and stop, or None when the budget ended it first."""
    cmd, sets, metric, threshold, patience = FAMILIES[family]
    key = metric.removeprefix("test_")
    overrides = [*sets, f"seed={seed}", "termination.iterations=400", "train.rounds=400",
                 f"termination.performance.{key}.threshold={threshold}",
                 f"termination.performance.{key}.patience={patience}"]
    if cmd == ["local"]:
        overrides = [o for o in overrides if not o.startswith("train.rounds")] + ["train.iterations=400"]
    if cmd[0] == "split":
        overrides = [o for o in overrides if not o.startswith(("train.rounds", "termination.iterations"))]
    argv = [sys.executable, "-m", "sluice", *cmd, "--out", str(out)]
    for o in overrides:
        argv += ["--set", o]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    report = out / "report.json"
    if not report.exists():
        print(f"{family} seed {seed}: no report (exit {proc.returncode}): {proc.stderr[-300:]}", file=sys.stderr)
        return None
    rep = json.loads(report.read_text())
    if rep.get("cause") != "CRITERION_MET":
        return None
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [[i + 1, r[metric]] for i, r in enumerate(rows) if r.get(metric) is not None]
    return {"family": family, "seed": seed, "metric": metric, "threshold": threshold, "patience": patience,
            "stop": len(rows), "curve": curve}


def collect(jobs: int) -> list[dict]:
    """Run every family's seeds (``jobs`` at a time); keep the runs that met their target."""
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(jobs) as pool:
        todo = [(f, s, Path(tmp) / f"{i}") for i, (f, s) in enumerate(itertools.product(FAMILIES, SEEDS))]
        runs = [r for r in pool.map(lambda t: _job(*t), todo) if r is not None]
    RUNS_FILE.parent.mkdir(parents=True, exist_ok=True)
    RUNS_FILE.write_text(json.dumps(runs), encoding="utf-8")
    return runs


def estimate_at(run: dict, k: int, settings: EtaSettings) -> tuple[float | None, float | None, float | None]:
    """The estimate of the remaining iterations after ``k`` iterations: (median, low, high)."""
    est = Estimator(metric=run["metric"], target=run["threshold"], mode="max", patience=run["patience"],
                    bounds=(0.0, 1.0), settings=settings)
    for n, y in run["curve"]:
        if n > k:
            break
        est.add(n, {run["metric"]: y}, 0.1)
    e = est.estimate(k, 0.1 * k)
    high = e.remaining_high if e.remaining_high is not None else (math.inf if e.remaining_low is not None else None)
    return e.remaining_iterations, e.remaining_low, high


def score(runs: list[dict], settings: EtaSettings) -> dict:
    """Per fraction: median |relative error|, share within ±25 %, interval coverage, runs without estimate."""
    out = {}
    for f in FRACTIONS:
        errs, within, covered, missing = [], [], [], 0
        for run in runs:
            k = max(1, round(f * run["stop"]))
            truth = run["stop"] - k
            if truth <= 0:
                continue
            mid, lo, hi = estimate_at(run, k, settings)
            err = math.inf if mid is None else abs(mid - truth) / truth
            missing += mid is None
            errs.append(err)
            within.append(err <= 0.25)
            covered.append(mid is not None and lo is not None and lo <= truth <= (math.inf if hi is None else hi))
        out[f"{f:.0%}"] = {"runs": len(errs), "median_abs_rel_error": statistics.median(errs),
                           "within_25": sum(within) / len(within), "coverage_80": sum(covered) / len(covered),
                           "no_estimate": missing}
    return out


def tune(runs: list[dict]) -> EtaSettings:
    """The settings of a small grid that do best on ``runs``: the error at 50 and 75 %, with the coverage of
    the 80 % intervals kept near 80 %."""
    best, best_loss = EtaSettings(), math.inf
    for window, noise, horizon in itertools.product((0.2, 0.33, 0.5), (0.7, 1.0, 1.3), (4.0, 8.0)):
        s = replace(EtaSettings(), noise_window=window, noise_scale=noise, horizon_factor=horizon)
        sc = score(runs, s)
        loss = sc["50%"]["median_abs_rel_error"] + sc["75%"]["median_abs_rel_error"] + sum(
            max(0.0, abs(v["coverage_80"] - 0.8) - 0.1) for v in sc.values())
        print(f"noise window {window}, scale {noise}, horizon {horizon}: loss {loss:.3f}", flush=True)
        if loss < best_loss:
            best, best_loss = s, loss
    return best


def write(results: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    lines = ["# Remaining-iteration estimates on runs that reach their target", "",
             f"Command: `{results['command']}`. Runs: {results['runs']} that met their target "
             f"({results['tuning_runs']} with even seeds for tuning, {results['held_out_runs']} with odd seeds held "
             f"out); settings {results['settings']}.", "",
             "| set | at | runs | median abs. relative error | within ±25 % | 80 % interval covers | no estimate |",
             "|---|---|---|---|---|---|---|"]
    for name in ("held_out", "tuning"):
        for f, v in results[name].items():
            err = v["median_abs_rel_error"]
            shown = f"{err:.1%}" if math.isfinite(err) else "— (most have no estimate)"
            lines.append(f"| {name.replace('_', ' ')} | {f} | {v['runs']} | {shown} | {v['within_25']:.0%} | "
                         f"{v['coverage_80']:.0%} | {v['no_estimate']} |")
    lines += ["", "| family | runs | stop (iterations) |", "|---|---|---|"]
    for fam, stops in results["families"].items():
        lines.append(f"| {fam} | {len(stops)} | {', '.join(map(str, stops))} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collect", action="store_true", help="run the jobs first (else: reuse eta_runs.json)")
    ap.add_argument("--tune", action="store_true", help="grid over the settings on the tuning runs")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "eta")
    args = ap.parse_args(argv)
    runs = collect(args.jobs) if args.collect else json.loads(RUNS_FILE.read_text())
    tuning = [r for r in runs if r["seed"] % 2 == 0]
    held = [r for r in runs if r["seed"] % 2 == 1]
    settings = tune(tuning) if args.tune else EtaSettings()
    families: dict[str, list[int]] = {}
    for r in runs:
        families.setdefault(r["family"], []).append(r["stop"])
    write({"command": "python bench/eta.py" + (" --collect" if args.collect else "") + (" --tune" if args.tune else ""),
           "runs": len(runs), "tuning_runs": len(tuning), "held_out_runs": len(held),
           "settings": asdict(settings), "held_out": score(held, settings), "tuning": score(tuning, settings),
           "families": families}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
