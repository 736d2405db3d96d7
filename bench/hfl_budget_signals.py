"""Benchmark (diagnostic): does any signal tell the federations where Sluice's budget costs accuracy?

A rule that spent more bytes where a federation needs them would have to recognise those federations from
what it can measure. This benchmark runs Sluice at its defaults on every scenario of
:mod:`hfl_scenarios` and records, each round, four signals of how hard the budget binds, reported as their
median over rounds 16 to the end:

* ``captured``: the share of the accumulated aggregate's energy that the server's step moves,
  ``‖a[I]‖² / ‖a‖²`` (over the coordinates the step chooses from: without the output layer when its
  momentum is replayed). Low when the step leaves most of what it could move in the residual.
* ``lag``: the residual's norm over the aggregate's, ``‖e‖ / ‖g‖`` after the step, in rounds of aggregate the
  model trails what the clients sent.
* ``upload noise``: ``‖ĝ − ḡ‖² / ‖ḡ‖²``, the energy of the sampled uploads' error in the aggregate over
  the energy of the aggregate of the clients' exact updates ``ḡ``. It needs the clients' exact updates, so
  only a simulation measures it.
* ``control variate``: the most that subtracting a known direction before sampling could take off an
  upload's variance. The sample upload's variance grows with ``‖Δ‖₁²``; with the round's exact aggregate
  ``ḡ`` as the direction (an oracle: no client knows it) the ratio is ``min_λ ‖Δ − λ·ḡ‖₁² / ‖Δ‖₁²``, the
  median over the round's uploads (λ on a grid of 0 to 2 in steps of 0.1).

The gap is each seed's final accuracy less dense FedAvg's run of that seed in ``--baselines``. A signal
that could drive such a rule would set the rows more than a point short apart from the others.

    .venv/bin/python bench/hfl_budget_signals.py --jobs 2      # every scenario, 3 seeds, 150 rounds

Results go to ``bench/results/hfl_budget_signals.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from hfl_scenarios import DENSE_NAME, SCENARIOS, seed_note  # noqa: E402
from hfl_step_signals import write_results  # noqa: E402
from sluice.hfl.client import Client  # noqa: E402
from sluice.hfl.server import Server, aggregate  # noqa: E402

SKIP = 15
"""Rounds left out of the medians: the first ones, before the residual builds up."""
SIGNALS = ("captured", "lag", "upload noise", "control variate")
LAMBDAS = np.linspace(0.0, 2.0, 21)


class SignalServer(Server):
    """Sluice's server that also keeps each round's uploads by client (:attr:`heard`) and the step's
    captured energy and lag (:attr:`signals`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.heard: dict[int, tuple[np.ndarray, float]] = {}
        self.signals: dict[str, float] = {}

    def close_round(self) -> bytes | None:
        self.heard, self.signals = dict(self._uploads), {}
        if not self.heard:
            return super().close_round()
        ids = sorted(self.heard)
        g = aggregate([self.heard[i][0] for i in ids], [self.heard[i][1] for i in ids], self.d)
        lo = self.d if self.replay is None else self.replay
        acc = (g + self.state.residual)[:lo]
        broadcast = super().close_round()
        stepped = self.state.last_idx
        moved = 0.0 if stepped is None else float(np.sum(acc[stepped[stepped < lo]] ** 2))
        self.signals = {"captured": moved / max(float(acc @ acc), 1e-300),
                        "lag": float(np.linalg.norm(self.state.residual) / max(np.linalg.norm(g), 1e-300))}
        return broadcast


class SignalClient(Client):
    """Sluice's client that keeps its last exact update (:attr:`delta`)."""

    delta: np.ndarray | None = None

    def local_update(self, held: np.ndarray, X: np.ndarray, y: np.ndarray, round: int) -> np.ndarray:
        self.delta = super().local_update(held, X, y, round)
        return self.delta


def upload_signals(server: SignalServer, clients: list[SignalClient]) -> dict[str, float]:
    """Upload noise and the control-variate bound of the round the server just closed (module docstring)."""
    ids = sorted(server.heard)
    weights = [server.heard[i][1] for i in ids]
    exact = aggregate([clients[i].delta for i in ids], weights, server.d)
    sampled = aggregate([server.heard[i][0] for i in ids], weights, server.d)
    energy = max(float(exact @ exact), 1e-300)
    bounds = []
    for i in ids:
        delta = clients[i].delta
        l1 = max(float(np.abs(delta).sum()), 1e-300)
        bounds.append(min(float(np.abs(delta - lam * exact).sum()) for lam in LAMBDAS) ** 2 / l1 ** 2)
    return {"upload noise": float(np.sum((sampled - exact) ** 2)) / energy,
            "control variate": statistics.median(bounds)}


def run_one(job: tuple[str, int, int]) -> dict:
    scenario, seed, rounds = job
    import torch

    from sluice.config import load_config
    from sluice.hfl import HFLEngine
    from sluice.hfl.config import HFLConfig

    torch.set_num_threads(1)
    cfg = load_config(None, [*SCENARIOS[scenario]["over"], f"seed={seed}", f"train.rounds={rounds}"], HFLConfig)
    engine = HFLEngine(cfg, server_cls=SignalServer, client_cls=SignalClient)
    series: dict[str, list[float]] = {s: [] for s in SIGNALS}
    for t in range(1, rounds + 1):
        event = engine.iterate()
        if t > SKIP and engine.server.heard:
            for name, value in {**engine.server.signals, **upload_signals(engine.server, engine.clients)}.items():
                series[name].append(value)
    return {"scenario": scenario, "seed": seed, "accuracy": event.metrics["test_accuracy"],
            **{name: statistics.median(v) if v else float("nan") for name, v in series.items()}}


def dense_accuracy(path: str, rounds: int) -> dict[tuple[str, int], float]:
    """Dense FedAvg's final accuracy by (scenario, seed) in the result file ``path`` of :mod:`hfl_scenarios`,
    which must have run ``rounds`` rounds."""
    results = json.loads(Path(path).read_text())
    if results["rounds"] != rounds:
        sys.exit(f"{path} ran {results['rounds']} rounds, not {rounds}: its gaps would not compare")
    stored = results["scenarios"]
    return {(name, r["seed"]): r["final_accuracy"] for name, s in stored.items()
            for r in s["methods"].get(DENSE_NAME, {}).get("runs", [])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--baselines", default=str(Path(__file__).parent / "results" / "hfl_scenarios.json"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "hfl_budget_signals"))
    args = ap.parse_args()
    if args.rounds <= SKIP:
        ap.error(f"--rounds must exceed the {SKIP} rounds the signals leave out")
    dense = dense_accuracy(args.baselines, args.rounds)
    missing = [(s, seed) for s in SCENARIOS for seed in range(args.seeds) if (s, seed) not in dense]
    if missing:
        sys.exit(f"{args.baselines} has no dense FedAvg run of {missing[0][0]!r}, seed {missing[0][1]}")
    jobs = [(s, seed, args.rounds) for s in SCENARIOS for seed in range(args.seeds)]
    runs = []
    with ProcessPoolExecutor(args.jobs) as ex:
        for r in ex.map(run_one, jobs):
            r["gap_points"] = 100 * (r["accuracy"] - dense[r["scenario"], r["seed"]])
            runs.append(r)
            print(f"{r['scenario']:40s} seed {r['seed']}: gap {r['gap_points']:+.2f} "
                  + " ".join(f"{s} {r[s]:.3f}" for s in SIGNALS), flush=True)
    rows = [{"scenario": s, "gap_points": statistics.fmean(r["gap_points"] for r in rs),
             **{k: statistics.fmean(r[k] for r in rs) for k in SIGNALS}}
            for s in SCENARIOS if (rs := [r for r in runs if r["scenario"] == s])]
    short, rest = ([r for r in rows if (r["gap_points"] < -1.0) == flag] for flag in (True, False))
    table = ["| scenario | gap (points) | " + " | ".join(SIGNALS) + " |", "|---|---|" + "---|" * len(SIGNALS)]
    table += [f"| {r['scenario']} | {r['gap_points']:+.2f} | " + " | ".join(f"{r[s]:.3f}" for s in SIGNALS) + " |"
              for r in rows]
    if short and rest:
        table += ["", "Range of each signal over the rows more than a point short and over the others:", "",
                  "| signal | rows short | other rows |", "|---|---|---|"]
        table += [f"| {s} | {min(r[s] for r in short):.3f} to {max(r[s] for r in short):.3f} | "
                  f"{min(r[s] for r in rest):.3f} to {max(r[s] for r in rest):.3f} |" for s in SIGNALS]
    results = {"rounds": args.rounds, "seeds": args.seeds, "skip": SKIP, "rows": rows, "runs": runs}
    write_results(Path(args.out), results,
                  "Signals of a binding budget "
                  f"({args.rounds} rounds, {seed_note(list(range(args.seeds)))}, Sluice's defaults)",
                  f"Each signal is the median over rounds {SKIP + 1}–{args.rounds} of a seed, averaged over the seeds "
                  "(module docstring of `bench/hfl_budget_signals.py`); gap: final accuracy less dense FedAvg's, in "
                  "points, averaged over the seeds.", table)


if __name__ == "__main__":
    main()
