"""Run traces for ``bench/eta.py``: real ``sluice`` jobs of many families, each run to a fixed budget, kept as
the curve of the metric its target watches and the measured seconds of every iteration.

Targets are applied to the stored curves afterwards (``bench/eta.py``): a run with a target stops at the
first iteration where the metric has passed the threshold ``patience`` times in a row, which depends only on
the curve up to there, so a run to the budget holds the runs with any target. Each family is a job shape
(engine, task, settings); its runs differ by seed.

    .venv/bin/python bench/eta_traces.py            # (re)generate bench/results/eta_traces.json.gz

Every job runs in one of ``--jobs`` worker processes through :func:`sluice.cli.main` (no interpreter start
per run), with one torch thread each.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
TRACES = RESULTS / "eta_traces.json.gz"
ROOT = Path(__file__).resolve().parent.parent
SEEDS = 10

ACC = "test_accuracy"
HFL = ["run"]
LOCAL = ["local"]
SPLIT = ["split", "run"]
FAMILIES: dict[str, tuple[list[str], list[str], str, str, int]] = {
    # name: (command and config, overrides, metric, mode, budget in iterations)
    "hfl digits, sampled uploads (default)": (HFL, [], ACC, "max", 70),
    "hfl digits, dense": (HFL, ["compression.up=dense", "compression.down=dense"], ACC, "max", 70),
    "hfl digits, top-k uploads, lr 0.02": (HFL, ["compression.up=topk", "train.lr=0.02"], ACC, "max", 70),
    "hfl digits, 50 clients, q 0.2": (HFL, ["data.num_clients=50", "train.participation=0.2"], ACC, "max", 60),
    "hfl breast cancer": (HFL, ["data.dataset=breast_cancer", "data.num_clients=10"], ACC, "max", 60),
    "hfl synthetic": (HFL, ["data.dataset=synthetic", "data.num_clients=10"], ACC, "max", 60),
    "hfl coverage scenario": ([*HFL, "examples/coverage_hfl.toml"], ["termination.training_error=0.01"],
                              "coverage_error", "min", 60),
    "hfl own CNN task": (HFL, ["task.factory=cnn:task", "data.num_clients=10", "train.participation=0.5"],
                         ACC, "max", 50),
    "local digits": (LOCAL, ["train.lr=0.01"], ACC, "max", 60),
    "local energy scenario": ([*LOCAL, "examples/energy_local.toml"],
                              ["train.lr=0.01", "termination.training_error=0.001"], "energy_error", "min", 40),
    "split breast cancer": ([*SPLIT, "examples/split_breast_cancer.toml"],
                            ["transport.kind=inproc", "train.epochs=100", "train.lr=0.002"], ACC, "max", 500),
    "split digits": (SPLIT, ["task.name=digits", "transport.kind=inproc", "train.epochs=100", "train.lr=0.01",
                             "train.eval_every=5"], ACC, "max", 300),
}


def _overrides(cmd: list[str], sets: list[str], seed: int, budget: int) -> list[str]:
    out = [*sets, f"seed={seed}", f"termination.iterations={budget}"]
    if cmd[0] == "run":
        out.append(f"train.rounds={budget}")
    elif cmd[0] == "local":
        out.append(f"train.iterations={budget}")
    return out


def run_one(family: str, seed: int) -> dict | None:
    """One job of ``family`` with ``seed`` to its budget: the metric's curve and each iteration's seconds."""
    import torch

    from sluice.cli import main

    torch.set_num_threads(1)
    cmd, sets, metric, mode, budget = FAMILIES[family]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [*cmd, "--out", str(out)]
        for o in _overrides(cmd, sets, seed, budget):
            argv += ["--set", o]
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                main(argv)
        except (Exception, SystemExit) as exc:  # a failed job is reported and left out
            print(f"{family} seed {seed}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        path = out / "metrics.jsonl"
        if not path.exists():
            return None
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    curve = [[i + 1, round(float(r[metric]), 5)] for i, r in enumerate(rows) if r.get(metric) is not None]
    seconds = [round(float(r.get("seconds") or 0.0), 5) for r in rows]
    print(f"{family} seed {seed}: {len(rows)} iterations, {len(curve)} values, "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    if len(curve) < 8:
        return None
    return {"family": family, "seed": seed, "metric": metric, "mode": mode, "iterations": len(rows),
            "curve": curve, "seconds": seconds}


def _init() -> None:
    os.nice(10)
    sys.path.insert(0, str(ROOT / "examples" / "own_model"))
    os.chdir(ROOT)


def generate(jobs: int, seeds: int = SEEDS, families: list[str] | None = None) -> list[dict]:
    """Every family's ``seeds`` runs, ``jobs`` at a time; written to :data:`TRACES`."""
    todo = [(f, s) for s in range(seeds) for f in (families or list(FAMILIES))]
    with ProcessPoolExecutor(jobs, initializer=_init) as pool:
        runs = [r for r in pool.map(run_one, *zip(*todo, strict=True)) if r is not None]
    TRACES.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(TRACES, "wt", encoding="utf-8") as f:
        json.dump(runs, f, separators=(",", ":"))
    return runs


def load() -> list[dict]:
    with gzip.open(TRACES, "rt", encoding="utf-8") as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=SEEDS)
    ap.add_argument("--family", action="append", help="only these families (default: all)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    runs = generate(args.jobs, args.seeds, args.family)
    print(f"{len(runs)} runs in {time.perf_counter() - t0:.0f} s -> {TRACES}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
