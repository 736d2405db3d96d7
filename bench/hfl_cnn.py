"""Benchmark: Sluice against dense FedAvg and the published methods on McMahan et al.'s CNN (``mnist_cnn``).

The workload is the paper's pathological non-IID setting: the CNN of McMahan et al. 2017 (1,663,370
parameters) on the embedded MNIST subset, 2 shards of one label per client over 100 clients, 10 % of the
clients a round, 5 local epochs of batches of 10. Every method — dense FedAvg (fp32 both ways), Sluice's
defaults and the published methods of :mod:`sluice.hfl.baselines` (FedAvg excepted: it is dense FedAvg) — runs the
same seeds and rounds on the same engine, sampling, data and local training. Per method: final accuracy
(mean ± sd and every seed's), its gap to dense FedAvg, total bytes up + down (``len()`` of every encoded
message), the reduction against dense FedAvg, accuracy per MB, and the seconds of a round split into local
training, encoding (client upload compression + the server's downlink messages), decoding (the server's
decoding of uploads + the clients' sync), the server step (``close_round``) and evaluation, timed by
subclasses of each method's server and client halves defined here. A plot shows accuracy against cumulative MB.

    .venv/bin/python bench/hfl_cnn.py --jobs 2                  # full: every method, 3 seeds, 60 rounds
    .venv/bin/python bench/hfl_cnn.py --rounds 2 --seeds 1      # smoke
    .venv/bin/python bench/hfl_cnn.py --no-peers --rounds 30    # dense FedAvg and Sluice only

Runs are independent processes (``--jobs``, default: every core; one thread each); results go to
``bench/results/hfl_cnn.{md,json,png}``.
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
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # the shared helpers of bench/hfl_scenarios.py

from hfl_scenarios import DENSE, DENSE_NAME, PEER_BUDGETS, collect, plot, seed_note  # noqa: E402

SCENARIO = "mnist_cnn (100 clients, 2 shards each, q 0.1, E 5, B 10)"
WORKLOAD = ['task.name="mnist_cnn"', "train.participation=0.1", "train.local_epochs=5", "train.batch_size=10"]
"""The paper's setting; ``--lr`` adds the local learning rate."""
SLUICE = "Sluice"
COLLAPSE_POINTS = 10.0
"""A seed collapses when its final accuracy is more than this many points below dense FedAvg's run of that seed."""
PARTS = ("local", "up_encode", "down_encode", "up_decode", "down_decode", "server", "evaluate")
"""The timed parts of a round (seconds summed over the round's clients)."""
COMPRESSION = ("up_encode", "down_encode", "up_decode", "down_decode", "server")
"""The parts that are the compression's cost: encoding and decoding both ways and the server step."""

TIMES: defaultdict[str, float] = defaultdict(float)
"""Wall seconds per part of the run in progress (one run at a time per process)."""
CPU: defaultdict[str, float] = defaultdict(float)
"""CPU seconds (``time.process_time``) per part of the run in progress."""


def _timed(part: str, fn, *args, **kwargs):
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        return fn(*args, **kwargs)
    finally:
        TIMES[part] += time.perf_counter() - t0
        CPU[part] += time.process_time() - c0


class TimedServer:
    """Mixed in before a server class: times its downlink messages, upload decoding and round closing."""

    def message(self, client_id):
        return _timed("down_encode", super().message, client_id)

    def receive(self, client_id, upload, weight):
        return _timed("up_decode", super().receive, client_id, upload, weight)

    def close_round(self):
        return _timed("server", super().close_round)


class TimedClient:
    """Mixed in before a client class: times the whole of ``train``, its local training and its sync; the rest
    of ``train`` is the upload's encoding."""

    def train(self, *args, **kwargs):
        return _timed("train", super().train, *args, **kwargs)

    def local_update(self, *args, **kwargs):
        return _timed("local", super().local_update, *args, **kwargs)

    def sync(self, server_message):
        return _timed("down_decode", super().sync, server_message)

    def receive_anchor(self, broadcast):
        return _timed("down_decode", super().receive_anchor, broadcast)


def timed(mixin: type, cls: type) -> type:
    return type(f"Timed{cls.__name__}", (mixin, cls), {})


def methods(peers: list[str] | None) -> dict[str, tuple[list[str], str | None]]:
    """Display name -> (config overrides, peer name or None): dense FedAvg, Sluice and the peers named in
    ``peers`` (None: every peer but FedAvg, which is dense FedAvg), with the budgets of bench/hfl_scenarios.py."""
    from sluice.hfl.baselines import PEERS

    out: dict[str, tuple[list[str], str | None]] = {DENSE_NAME: (DENSE, None), SLUICE: ([], None)}
    names = [n for n in PEERS if n != "FedAvg"] if peers is None else peers
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        raise SystemExit(f"unknown peer(s) {unknown}; choose from {sorted(PEERS)}")
    for name in names:
        out[name] = ([*PEERS[name][2], *PEER_BUDGETS.get(name, [])], name)
    return out


def run_one(job: tuple[str, list[str], str | None, int, int]) -> dict:
    """One run: accuracy and cumulative bytes every round, and the seconds of each part of the rounds."""
    method, overrides, peer, seed, rounds = job
    import torch

    from sluice.config import load_config
    from sluice.hfl import Client, HFLEngine, Server
    from sluice.hfl.config import HFLConfig

    torch.set_num_threads(1)
    cfg = load_config(None, [*overrides, f"seed={seed}", f"train.rounds={rounds}"], HFLConfig)
    server_cls, client_cls = Server, Client
    if peer is not None:
        from sluice.hfl.baselines import PEERS

        server_cls, client_cls, _ = PEERS[peer]

    class TimedEngine(HFLEngine):
        def _evaluate(self):
            return _timed("evaluate", super()._evaluate)

    engine = TimedEngine(cfg, server_cls=timed(TimedServer, server_cls), client_cls=timed(TimedClient, client_cls))
    engine.start()
    TIMES.clear()
    CPU.clear()
    acc, cum = [], []
    total = up = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        ev = engine.iterate()
        total += ev.bytes_up + ev.bytes_down
        up += ev.bytes_up
        acc.append(ev.metrics.get("test_accuracy", float("nan")))
        cum.append(total)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"scenario": SCENARIO, "method": method, "seed": seed, "final_accuracy": acc[-1], "bytes_total": total,
            "bytes_up": up, "bytes_down": total - up, "accuracy_curve": acc, "cum_bytes": cum,
            "num_params": engine.num_params, "wall_seconds": wall, "cpu_seconds": cpu,
            "seconds_per_round": _per_round(TIMES, wall, rounds), "cpu_seconds_per_round": _per_round(CPU, cpu, rounds)}


def _per_round(times: dict[str, float], total: float, rounds: int) -> dict[str, float]:
    """Seconds per round of every part of :data:`PARTS`, of the rest (``other``) and in all (``round``), from the
    run's sums ``times`` (``up_encode``: ``train`` less local training and sync) and its ``total``."""
    parts = {k: times[k] for k in PARTS}
    parts["up_encode"] = times["train"] - times["local"] - times["down_decode"]
    parts["other"] = total - sum(parts.values())
    return {**{k: v / rounds for k, v in parts.items()}, "round": total / rounds}


def timing(runs: list[dict], key: str) -> dict[str, float]:
    """Mean seconds per round of every part over ``runs`` (``key``: ``seconds_per_round``, wall clock, or
    ``cpu_seconds_per_round``), the encode / decode sums and the compression's share of a round."""
    out = {k: statistics.fmean(r[key][k] for r in runs) for k in runs[0][key]}
    out["encode"] = out["up_encode"] + out["down_encode"]
    out["decode"] = out["up_decode"] + out["down_decode"]
    out["compression"] = sum(out[k] for k in COMPRESSION)
    out["compression_share"] = out["compression"] / out["round"]
    return out


def collapsed(m: dict, dense: dict) -> list[int]:
    """The seeds of method ``m`` more than :data:`COLLAPSE_POINTS` below dense FedAvg's run of the same seed."""
    base = {r["seed"]: r["final_accuracy"] for r in dense["runs"]}
    return [r["seed"] for r in m["runs"]
            if r["seed"] in base and 100 * (base[r["seed"]] - r["final_accuracy"]) > COLLAPSE_POINTS]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--lr", type=float, default=0.05, help="local learning rate (train.lr)")
    peers = ap.add_mutually_exclusive_group()
    peers.add_argument("--peer", action="append", metavar="NAME",
                       help="run only these published methods (repeatable; default: every one but FedAvg)")
    peers.add_argument("--no-peers", action="store_true", help="dense FedAvg and Sluice only")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for every method, dense FedAvg's too (repeatable)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "hfl_cnn"))
    ap.add_argument("--render", metavar="JSON", help="run nothing: write the markdown and plot of this result file "
                    "again (to --out)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.render:
        return write(json.loads(Path(args.render).read_text()), out)
    command = shlex.join(["python", "bench/hfl_cnn.py", *(sys.argv[1:] if argv is None else argv)])
    workload = [*WORKLOAD, f"train.lr={args.lr:g}", *args.set]
    chosen = methods([] if args.no_peers else args.peer)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    jobs = [(name, [*workload, *over], peer, seed, args.rounds)
            for name, (over, peer) in chosen.items() for seed in seeds]
    print(f"{len(jobs)} runs on {args.jobs} processes", flush=True)
    runs = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) if args.jobs > 1 else _Inline() as pool:
        for r in pool.map(run_one, jobs):
            runs.append(r)
            s = r["seconds_per_round"]
            print(f"{r['method'][:24]:24s} seed {r['seed']}: acc {r['final_accuracy']:.4f}, "
                  f"{r['bytes_total'] / 1e6:9.3f} MB, {s['round']:.2f} s/round (local {s['local']:.2f}) "
                  f"({r['wall_seconds']:.0f} s)", flush=True)
    scen = collect(runs, {SCENARIO: bool(set(chosen) - {DENSE_NAME, SLUICE})})[SCENARIO]
    dense = scen["methods"][DENSE_NAME]
    for m in scen["methods"].values():
        m["mb_up"] = statistics.fmean(r["bytes_up"] for r in m["runs"]) / 1e6
        m["mb_down"] = statistics.fmean(r["bytes_down"] for r in m["runs"]) / 1e6
        m["seconds_per_round"] = timing(m["runs"], "seconds_per_round")
        m["cpu_seconds_per_round"] = timing(m["runs"], "cpu_seconds_per_round")
        m["collapsed_seeds"] = collapsed(m, dense)
    results: dict = {"rounds": args.rounds, "seeds": len(seeds), "machine": platform.platform(),
                     "python": platform.python_version(), "cpus": os.cpu_count(), "jobs": args.jobs,
                     "command": command, "workload": workload, "bench_wall_seconds": time.perf_counter() - t0,
                     "targets": targets(scen["methods"]), "scenarios": {SCENARIO: scen}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    return write(results, out)


def write(results: dict, out: Path) -> dict:
    """Write the plot and the markdown of ``results`` beside ``out`` (``.png``, ``.md``) and print the markdown."""
    out.parent.mkdir(parents=True, exist_ok=True)
    plotted = plot(results, out.with_suffix(".png"))
    text = render(results, out.with_suffix(".png").name if plotted else None)
    out.with_suffix(".md").write_text(text)
    print(text, end="")
    return results


class _Inline:
    """``map`` in this process (``--jobs 1``), as a context manager like the process pool."""

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc) -> None:
        return None

    @staticmethod
    def map(fn, items):
        return map(fn, items)


def targets(ms: dict[str, dict]) -> dict:
    """The issue's targets for Sluice, as measured: within 1 point of dense FedAvg, at least 100x fewer total
    bytes, no collapsed seed, better accuracy per MB than every published method, compression at most 15 % of a
    round's wall time."""
    ours = ms[SLUICE]
    peers = {n: m for n, m in ms.items() if n not in (DENSE_NAME, SLUICE)}
    best_peer = max(peers, key=lambda n: peers[n]["accuracy_per_mb"]) if peers else None
    share = ours["cpu_seconds_per_round"]["compression_share"]
    return {
        "within_1_point": {"value": ours["gap_points"], "met": ours["gap_points"] >= -1.0},
        "reduction_100x": {"value": ours["reduction_x"], "met": ours["reduction_x"] >= 100.0},
        "no_collapsed_seed": {"value": ours["collapsed_seeds"], "met": not ours["collapsed_seeds"]},
        "best_accuracy_per_mb": {"value": ours["accuracy_per_mb"], "best_peer": best_peer,
                                 "best_peer_value": peers[best_peer]["accuracy_per_mb"] if best_peer else None,
                                 "met": all(ours["accuracy_per_mb"] > m["accuracy_per_mb"] for m in peers.values())},
        "compression_share_15pct": {"value": share, "wall_clock": ours["seconds_per_round"]["compression_share"],
                                    "met": share <= 0.15},
    }


def summary(ms: dict[str, dict], tg: dict) -> str:
    """Three or four sentences of what the measured numbers show."""
    dense, ours = ms[DENSE_NAME], ms[SLUICE]
    peers = {n: m for n, m in ms.items() if n not in (DENSE_NAME, SLUICE)}
    bad = ours["collapsed_seeds"]
    seeds = ", ".join(f"{100 * a:.1f}" for a in ours["accuracies"])
    out = [f"Sluice ends at {100 * ours['accuracy_mean']:.2f} % (seeds {seeds}) against dense FedAvg's "
           f"{100 * dense['accuracy_mean']:.2f} %, a gap of {ours['gap_points']:+.2f} points, with "
           f"{ours['reduction_x']:.0f}× fewer bytes ({ours['mb_total']:.1f} MB against {dense['mb_total']:.0f} MB), "
           + (f"and seeds {bad} collapse." if bad else "and no seed collapses.")]
    if peers:
        near = max(peers, key=lambda n: peers[n]["accuracy_per_mb"])
        top = max(peers, key=lambda n: peers[n]["accuracy_mean"])
        p, q = peers[near], peers[top]
        out.append(f"Of the published methods, {near} has the best accuracy per MB ({p['accuracy_per_mb']:.4g} "
                   f"against Sluice's {ours['accuracy_per_mb']:.4g}: {p['mb_total']:.1f} MB at "
                   f"{100 * p['accuracy_mean']:.2f} %, {p['gap_points']:+.2f} points), and {top} the best accuracy "
                   f"({100 * q['accuracy_mean']:.2f} %, {q['gap_points']:+.2f} points) at {q['reduction_x']:.1f}× "
                   "fewer bytes than dense FedAvg.")
    t = ours["cpu_seconds_per_round"]
    out.append(f"Sluice's compression costs {t['compression']:.2f} CPU s of a {t['round']:.2f} s round "
               f"({100 * t['compression_share']:.1f} %, "
               + ("within" if tg["compression_share_15pct"]["met"] else "above")
               + f" the 15 % target), {t['up_encode']:.2f} s of it the clients' upload encoding, beside "
               f"{t['local']:.2f} s of local training.")
    return " ".join(out)


def _yes(met: bool) -> str:
    return "met" if met else "**not met**"


def render(results: dict, plot_name: str | None) -> str:
    """The markdown of ``results``: what runs, the accuracy and bytes table, the timing table, the targets."""
    scen = results["scenarios"][SCENARIO]
    ms = scen["methods"]
    seeds = [r["seed"] for m in ms.values() for r in m["runs"]]
    d = ms[SLUICE]["num_params"]
    lines = [f"# HFL on McMahan et al.'s CNN ({results['rounds']} rounds, {seed_note(seeds)})", "",
             f"Command: `{results['command']}` ({results['jobs']} processes of one thread each; "
             f"{results['bench_wall_seconds'] / 60:.0f} min in all). Machine: {results['machine']}, "
             f"{results['cpus']} CPUs, Python {results['python']}.", "",
             f"Workload: task `mnist_cnn`, the CNN of McMahan et al. 2017 (d = {d}) on the embedded 5000-image MNIST "
             "subset, 2 shards of one label per client over 100 clients, participation 0.1 (10 clients a round), "
             "5 local epochs, batch 10, overrides `" + " ".join(results["workload"]) + "`. Every method runs the "
             "same seeds and rounds with the same sampling, data, initial model and local training; the published "
             "methods are those of `sluice.hfl.baselines` at the budgets of `bench/hfl_scenarios.py`.", "",
             "Accuracy: test accuracy of the server model after the last round, mean ± sd over the seeds, and every "
             "seed's. Gap: points against dense FedAvg, ± its standard error over the seeds paired with dense "
             "FedAvg's run of the same seed. MB: `len()` of every encoded message, up + down, mean over the seeds. "
             "Reduction: dense FedAvg's total bytes over the method's. Accuracy per MB: mean final accuracy over "
             "mean total MB.", "",
             "| method | accuracy | seeds | gap (points) | MB up | MB down | MB total | reduction × | "
             "accuracy per MB |", "|---|---|---|---|---|---|---|---|---|"]
    for name, m in ms.items():
        seeds_acc = ", ".join(f"{a:.3f}" for a in m["accuracies"])
        gap = f"{m['gap_points']:+.2f}" + ("" if m["gap_se_points"] is None else f" ± {m['gap_se_points']:.2f}")
        lines.append(f"| {name} | {m['accuracy_mean']:.4f} ± {m['accuracy_sd']:.4f} | {seeds_acc} | {gap} | "
                     f"{m['mb_up']:.2f} | {m['mb_down']:.2f} | {m['mb_total']:.2f} | {m['reduction_x']:.1f} | "
                     f"{m['accuracy_per_mb']:.4g} |")
    lines += ["", "CPU seconds per round (`time.process_time` of the run's process, one thread; mean over the "
              "seeds; every part summed over the round's 10 clients, which run one after another). Local: "
              "`Client.local_update`. Encode: the client's upload compression (the rest of `Client.train`) + the "
              "server's downlink messages (`Server.message`). Decode: the server's decoding of uploads "
              "(`Server.receive`) + the clients' `sync` of the downlink. Server step: `Server.close_round`. "
              "Evaluate: the server model on the 1000 test images. Compression share: (encode + decode + server "
              "step) over the round, in CPU time (what the round costs on a core of its own) and in wall-clock time "
              "(the cores were shared with other work while this ran, so wall times are longer than CPU times).", "",
              "| method | local training | encode (up + down) | decode (up + down) | server step | evaluate | "
              "other | round (CPU) | round (wall) | compression share (CPU) | compression share (wall) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in ms.items():
        t, w = m["cpu_seconds_per_round"], m["seconds_per_round"]
        lines.append(f"| {name} | {t['local']:.3f} | {t['encode']:.3f} ({t['up_encode']:.3f} + "
                     f"{t['down_encode']:.3f}) | {t['decode']:.3f} ({t['up_decode']:.3f} + {t['down_decode']:.3f}) | "
                     f"{t['server']:.3f} | {t['evaluate']:.3f} | {t['other']:.3f} | {t['round']:.3f} | "
                     f"{w['round']:.3f} | {100 * t['compression_share']:.1f} % | "
                     f"{100 * w['compression_share']:.1f} % |")
    tg = results["targets"]
    best = tg["best_accuracy_per_mb"]
    best_line = ("no published method ran" if best["best_peer"] is None else
                 f"{best['value']:.4g} against {best['best_peer']}'s {best['best_peer_value']:.4g}, the best of the "
                 "published methods")
    lines += ["", "## The issue's targets for Sluice (as measured)", "",
              f"- Within 1 point of dense FedAvg: gap {tg['within_1_point']['value']:+.2f} points — "
              f"{_yes(tg['within_1_point']['met'])}.",
              f"- At least 100× fewer total bytes: {tg['reduction_100x']['value']:.1f}× — "
              f"{_yes(tg['reduction_100x']['met'])}.",
              f"- No seed collapsing (more than {COLLAPSE_POINTS:g} points below dense FedAvg's run of the same "
              f"seed): collapsed seeds {tg['no_collapsed_seed']['value'] or 'none'} — "
              f"{_yes(tg['no_collapsed_seed']['met'])}.",
              f"- Better accuracy per MB than every published method: {best_line} — "
              f"{_yes(best['met'])}.",
              f"- Compression CPU cost (encode + decode + server step, both directions) at most 15 % of a round: "
              f"{100 * tg['compression_share_15pct']['value']:.1f} % of its CPU time "
              f"({100 * tg['compression_share_15pct']['wall_clock']:.1f} % of its wall-clock time) — "
              f"{_yes(tg['compression_share_15pct']['met'])}."]
    lines += ["", "## What the numbers show", "", summary(ms, tg)]
    if plot_name:
        lines += ["", f"Plot: `{plot_name}` (test accuracy against cumulative MB, up + down, mean of the seeds; "
                  "one curve per method)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
