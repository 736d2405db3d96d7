"""Benchmark: Sluice's default compression on user-like tasks (:mod:`user_tasks`) against dense FedAvg.

Every task of :data:`user_tasks.TASKS` (their own models, optimizers and data; 10 clients, IID or Dirichlet
splits) trains with dense FedAvg (fp32 both ways, the same client optimizer) and with Sluice's defaults,
side by side: same seeds, rounds, sampling, data and local training (``train.participation`` 0.25, 2 local
epochs of batches of 16, the task's learning rate). Per task and seed: the final score — test accuracy, or
for the regression task R² = 1 − MSE / Var(y), both in points — its gap to dense FedAvg, the bytes of every
encoded message both ways, the reduction, and the notes Sluice's run made (automatic settings, stalls).

    .venv/bin/python bench/hfl_user_tasks.py                       # full: every task, 3 seeds, 40 rounds
    .venv/bin/python bench/hfl_user_tasks.py --seeds 1 --rounds 3  # smoke
    .venv/bin/python bench/hfl_user_tasks.py --tasks gru-bn-adam --set compression.up_ratio=0.1

Runs are independent processes (``--jobs``, default every core; one thread each); results go to
``bench/results/hfl_user_tasks.{md,json}`` (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from user_tasks import TASKS  # noqa: E402

DENSE = ["compression.up=dense", "compression.down=dense"]
TARGET_GAP, TARGET_MEDIAN = -3.0, -1.0
"""Every task and seed within 3 points of dense FedAvg; the median over tasks within 1."""


def target_reduction(params: int) -> float | None:
    """The reduction a task of ``params`` parameters must reach: 20× under 10,000, 100× from 100,000."""
    return 20.0 if params < 10_000 else 100.0 if params >= 100_000 else None


def run_one(job: tuple[str, str, int, int, list[str]]) -> dict:
    name, method, seed, rounds, extra = job
    import torch

    from sluice.config import load_config
    from sluice.hfl import HFLEngine
    from sluice.hfl.config import HFLConfig

    torch.set_num_threads(1)
    spec = TASKS[name]
    task = spec.build()
    overrides = [f"seed={seed}", f"train.rounds={rounds}", f"train.lr={spec.lr}",
                 *(DENSE if method == "dense" else extra)]
    engine = HFLEngine(load_config(None, overrides, HFLConfig), task)
    regression = task.kind == "regression"
    variance = float(torch.stack([task.test[i][1] for i in range(len(task.test))]).var()) if regression else 0.0
    t0, total, curve = time.perf_counter(), 0, []
    for _ in range(rounds):
        ev = engine.iterate()
        total += ev.bytes_up + ev.bytes_down
        m = ev.metrics
        curve.append(100 * (1 - m["test_mse"] / variance) if regression else 100 * m["test_accuracy"])
    notes = list(engine.notes()) if hasattr(engine, "notes") else []
    return {"task": name, "method": method, "seed": seed, "score": curve[-1], "best": max(curve), "curve": curve,
            "bytes_total": total, "num_params": engine.num_params, "notes": notes,
            "wall_seconds": time.perf_counter() - t0}


def collect(runs: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r["task"] for r in runs):
        dense = {r["seed"]: r for r in runs if r["task"] == name and r["method"] == "dense"}
        ours = sorted((r for r in runs if r["task"] == name and r["method"] == "sluice"), key=lambda r: r["seed"])
        gaps = [r["score"] - dense[r["seed"]]["score"] for r in ours]
        mb = statistics.fmean(r["bytes_total"] for r in ours) / 1e6
        mb_dense = statistics.fmean(r["bytes_total"] for r in dense.values()) / 1e6
        params = ours[0]["num_params"]
        out[name] = {"params": params, "dense": statistics.fmean(r["score"] for r in dense.values()),
                     "sluice": statistics.fmean(r["score"] for r in ours), "gap": statistics.fmean(gaps),
                     "worst_gap": min(gaps), "gaps": gaps, "mb": mb, "mb_dense": mb_dense,
                     "reduction": mb_dense / mb, "target_reduction": target_reduction(params),
                     "notes": sorted({n for r in ours for n in r["notes"]})}
    return out


def markdown(results: dict[str, dict], rounds: int, seeds: list[int], command: str, extra: list[str]) -> str:
    from user_tasks import TASKS as specs

    median = statistics.median(r["gap"] for r in results.values())
    worst = min(r["worst_gap"] for r in results.values())
    lines = [f"# Sluice's default compression on user-like tasks ({rounds} rounds, {len(seeds)} seeds)", "",
             f"`{command}` on {platform.node() or 'this machine'}; settings beside the defaults: "
             f"{', '.join(f'`{e}`' for e in extra) or 'none'}.", "",
             f"Worst gap of any task and seed: **{worst:+.2f} points** (target ≥ {TARGET_GAP:+.0f}); median of "
             f"the tasks' mean gaps: **{median:+.2f}** (target ≥ {TARGET_MEDIAN:+.0f}). Scores: test accuracy, "
             "or R² for the regression task, in points.", "",
             "| task | optimizer | covers | dense FedAvg | Sluice | gap (worst seed) | reduction (target) |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        spec = specs[name]
        target = f"{r['target_reduction']:.0f}×" if r["target_reduction"] else "–"
        lines.append(f"| {name} | {spec.optimizer} | {spec.covers} | {r['dense']:.2f} | {r['sluice']:.2f} | "
                     f"{r['gap']:+.2f} ({r['worst_gap']:+.2f}) | {r['reduction']:.1f}× ({target}) |")
    notes = {n: name for name, r in results.items() for n in r["notes"]}
    if notes:
        lines += ["", "What Sluice's runs said (automatic settings, stalls), one line per distinct note:", ""]
        lines += [f"- {name}: {n}" for n, name in notes.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="*", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--set", action="append", default=[], dest="extra",
                   help="a setting for Sluice's runs (not dense FedAvg's), as --set takes it")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "hfl_user_tasks"),
                   help="results path without suffix (.md and .json are written)")
    args = p.parse_args(argv)
    seeds = list(range(args.seeds))
    jobs = [(t, m, s, args.rounds, args.extra) for t in args.tasks for s in seeds for m in ("dense", "sluice")]
    jobs.sort(key=lambda j: j[0] != "embedding-adam")  # the longest runs first
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = []
        for r in pool.map(run_one, jobs):
            runs.append(r)
            print(f"{r['task']:18s} {r['method']:6s} seed {r['seed']}: {r['score']:6.2f} "
                  f"{r['bytes_total'] / 1e6:8.3f} MB {r['wall_seconds']:6.1f} s", flush=True)
    results = collect(runs)
    command = "python bench/hfl_user_tasks.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    md = markdown(results, args.rounds, seeds, command.strip(), args.extra)
    out.with_suffix(".md").write_text(md)
    out.with_suffix(".json").write_text(json.dumps({"rounds": args.rounds, "seeds": seeds, "command": command,
                                                    "settings": args.extra, "results": results, "runs": runs},
                                                   indent=1))
    print(md)


if __name__ == "__main__":
    main()
