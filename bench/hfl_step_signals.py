"""Benchmark (diagnostic): what the server can observe about its step size, at fixed server steps.

Sluice's adaptive step (``compression.down_adapt``) tunes its gain from one signal, ``A``: the share of the
coordinates the server stepped last round where this round's aggregate has the step's sign. This
benchmark runs fixed server steps (``train.server_lr``, gain off) on federations whose best step differs,
and records for each step the final accuracy and two signals, averaged over rounds 16 to the end:

* ``A`` as the gain computes it, with the coordinates it rests on per round: the stepped ones that some
  sampled upload covers;
* the client-paired agreement ``Ap``: each client compares its update with its own previous update at the
  coordinates the server moved since that client last synced, counting those moved the way its previous
  update asked, and ``Ap`` is the share where its new update still asks for that sign. It compares each
  client with itself, so which clients take part in a round does not enter it. A client computes it
  locally (it knows its previous update and the coordinates its downlink changed); a server using it would
  receive two counts with every upload.

The table also gives how often a step repeats: the share of a step's coordinates that the step before
moved as well. Only those meet their velocity undecayed, so it says how much of the step the sparse heavy
ball (``compression.momentum``) can accelerate.

A signal fit to set the step would take one value at every federation's best step and another where steps
are too large. The accuracy column gives each seed, so a collapsed seed shows.

    .venv/bin/python bench/hfl_step_signals.py --jobs 2      # 5 federations x 5 steps x 2 seeds, 150 rounds

Results go to ``bench/results/hfl_step_signals.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from hfl_scenarios import SCENARIOS, seed_note  # noqa: E402
from sluice.hfl.client import Client  # noqa: E402
from sluice.hfl.server import Server, aggregate  # noqa: E402

FEDERATIONS = ("default (digits Dir 0.3, 20 clients, q 0.25)", "digits momentum 0.9", "mnist-shards", "synthetic-0-0",
               "synthetic-1-1 momentum 0.9")
STEPS = (1.0, 2.0, 4.0, 6.0, 10.0)
SKIP = 15
"""Rounds left out of the averages: the first ones, before the step's effect settles."""


class SignalServer(Server):
    """Sluice's server that also counts, each round, the heard coordinates of the last step and how many of
    them the aggregate agrees with (``A``'s numerator and denominator), and the coordinates of the step it
    applies and how many of them the last step moved too."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.counts: list[tuple[int, int, int]] = []  # (round, heard, agreeing)
        self.repeats: list[tuple[int, int, int]] = []  # (round, stepped, stepped the round before too)

    def close_round(self) -> bytes | None:
        s = self.state
        if self._uploads and s.last_idx is not None:
            ids = sorted(self._uploads)
            g = aggregate([self._uploads[i][0] for i in ids], [self._uploads[i][1] for i in ids], self.d)
            seen = g[s.last_idx]
            heard = seen != 0
            self.counts.append((s.round + 1, int(heard.sum()), int((np.sign(seen[heard]) == s.last_sign[heard]).sum())))
        broadcast = super().close_round()
        stepped = self.state.last_idx
        if s.last_idx is not None and stepped is not None and stepped is not s.last_idx:
            self.repeats.append((self.state.round, len(stepped), int(np.isin(stepped, s.last_idx).sum())))
        return broadcast


class SignalClient(Client):
    """Sluice's client that also counts the client-paired agreement of each update (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.counts: list[tuple[int, int, int]] = []  # (round, paired coordinates, agreeing)
        self._before: np.ndarray | None = None
        self._previous: np.ndarray | None = None

    def train(self, server_message: bytes, X: np.ndarray, y: np.ndarray, round: int,
              up_ratio: float | None = None) -> bytes:
        self._before = self.params.astype(np.float64)
        return super().train(server_message, X, y, round, up_ratio)

    def local_update(self, held: np.ndarray, X: np.ndarray, y: np.ndarray, round: int) -> np.ndarray:
        delta = super().local_update(held, X, y, round)
        if self._previous is not None and self._before is not None:
            moved = np.sign(held.astype(np.float64) - self._before)
            asked = (moved != 0) & (np.sign(self._previous) == moved)
            self.counts.append((round, int(asked.sum()), int((np.sign(delta[asked]) == moved[asked]).sum())))
        self._previous = delta
        return delta


def share(counts: list[tuple[int, int, int]]) -> tuple[float, float]:
    """(agreeing / counted, counted per round) over the rounds after :data:`SKIP`."""
    kept = [c for c in counts if c[0] > SKIP]
    n = sum(c[1] for c in kept)
    rounds = len({c[0] for c in kept})
    return (sum(c[2] for c in kept) / n if n else float("nan")), (n / rounds if rounds else 0.0)


def run_one(job: tuple[str, float, int, int]) -> dict:
    federation, step, seed, rounds = job
    import torch

    from sluice.config import load_config
    from sluice.hfl import HFLEngine
    from sluice.hfl.config import HFLConfig

    torch.set_num_threads(1)
    over = [*SCENARIOS[federation]["over"], "compression.down_adapt=0", f"train.server_lr={step:g}"]
    cfg = load_config(None, [*over, f"seed={seed}", f"train.rounds={rounds}"], HFLConfig)
    engine = HFLEngine(cfg, server_cls=SignalServer, client_cls=SignalClient)
    for _ in range(rounds):
        event = engine.iterate()
    paired = [c for client in engine.clients for c in client.counts]
    a, heard = share(engine.server.counts)
    ap, pairs = share(paired)
    repeat, _ = share(engine.server.repeats)
    return {"federation": federation, "step": step, "seed": seed, "accuracy": event.metrics["test_accuracy"],
            "A": a, "heard": heard, "Ap": ap, "pairs": pairs, "repeat": repeat}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "hfl_step_signals"))
    args = ap.parse_args()
    if args.rounds <= SKIP:
        ap.error(f"--rounds must exceed the {SKIP} rounds the signals leave out")
    jobs = [(f, s, seed, args.rounds) for f in FEDERATIONS for s in STEPS for seed in range(args.seeds)]
    with ProcessPoolExecutor(args.jobs) as ex:
        runs = []
        for r in ex.map(run_one, jobs):
            runs.append(r)
            print(f"{r['federation']:28s} step {r['step']:g} seed {r['seed']}: accuracy {r['accuracy']:.4f} "
                  f"A {r['A']:.3f} Ap {r['Ap']:.3f}", flush=True)
    rows = []
    for f in FEDERATIONS:
        for s in STEPS:
            rs = [r for r in runs if r["federation"] == f and r["step"] == s]
            rows.append({"federation": f, "step": s, "accuracy": statistics.fmean(r["accuracy"] for r in rs),
                         "accuracies": [r["accuracy"] for r in rs],
                         **{k: statistics.fmean(r[k] for r in rs) for k in ("A", "heard", "Ap", "pairs", "repeat")}})
    results = {"rounds": args.rounds, "seeds": args.seeds, "skip": SKIP, "rows": rows, "runs": runs}
    table = ["| federation | server step | accuracy | seeds | A | coordinates per round | Ap | pairs per round "
             "| repeat |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['federation']} | {r['step']:g} | {r['accuracy']:.4f} | "
                     f"{', '.join(f'{a:.3f}' for a in r['accuracies'])} | {r['A']:.3f} | {r['heard']:.0f} | "
                     f"{r['Ap']:.3f} | {r['pairs']:.0f} | {r['repeat']:.3f} |")
    write_results(Path(args.out), results,
                  "What the server observes about its step "
                  f"({args.rounds} rounds, {seed_note(list(range(args.seeds)))}, fixed steps)",
                  f"Signals averaged over rounds {SKIP + 1}–{args.rounds} of every seed (module docstring of "
                  "`bench/hfl_step_signals.py`): A with the coordinates it rests on per round, Ap with the pairs. "
                  "Repeat: the share of a step's coordinates that the step before moved too. "
                  "A is nan where a seed diverged and left no finite step to compare with.", table)


def write_results(out: Path, results: dict, heading: str, notes: str, body: list[str]) -> None:
    """Write ``results`` (with the machine added) to ``out``.json and ``out``.md: the heading, a line naming the
    machine and the command that ran (this script's arguments) before ``notes``, then the lines of ``body``."""
    results = {**results, "machine": platform.platform(), "python": platform.python_version()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    command = shlex.join(["python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    lines = [f"# {heading}", "", f"Machine: {results['machine']}, Python {results['python']}. Command: `{command}`. "
             f"{notes}", "", *body]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
