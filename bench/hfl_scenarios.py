"""Benchmark: Sluice's compression on a suite of federations, against dense FedAvg and published methods.

Every scenario runs dense FedAvg (fp32 both ways) and Sluice with the same seeds; the table gives each
one's mean final accuracy, the gap in points, the seeds' accuracies (so a collapsed seed shows) and the
reduction of total bytes (up + down, ``len()`` of every encoded message) against dense FedAvg. On the
scenarios marked ``peers`` (every scenario with ``--peers``) the published methods of
:mod:`sluice.hfl.baselines` run beside them, on the same engine, sampling, data and local training, and a plot
shows accuracy against cumulative megabytes.

    .venv/bin/python bench/hfl_scenarios.py                  # full: every scenario, 3 seeds, 150 rounds
    .venv/bin/python bench/hfl_scenarios.py --quick          # 1 seed, 30 rounds, two scenarios (smoke)
    .venv/bin/python bench/hfl_scenarios.py --only synthetic-1-1 --jobs 2
    .venv/bin/python bench/hfl_scenarios.py --peers --only 'digits momentum 0.9'   # the peers there too

Runs are independent processes (``--jobs``, default: every core); results go to
``bench/results/hfl_scenarios.{md,json,png}``. Each gap comes with its standard error over the seeds, every
seed's gap paired with dense FedAvg's run of that seed. ``--merge`` runs nothing and tabulates result files of
other seeds together; ``--baselines`` takes the methods Sluice is compared with from a result file and runs only
Sluice and the variants (after a change of Sluice's defaults):

    .venv/bin/python bench/hfl_scenarios.py --seeds 6 --first-seed 3 --no-peers \
        --baselines bench/results/hfl_scenarios_seeds_0_8.json --out bench/results/hfl_scenarios_seeds_3_8
    .venv/bin/python bench/hfl_scenarios.py --merge bench/results/hfl_scenarios.json \
        bench/results/hfl_scenarios_seeds_3_8.json --out bench/results/hfl_scenarios_seeds_0_8
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

DENSE = ["compression.up=\"dense\"", "compression.down=\"dense\"", "compression.downlink=\"dense\""]
DENSE_NAME = "dense FedAvg (fp32)"
PREVIOUS_NAME = "Sluice, earlier default (top-k int8)"
PREVIOUS = ['compression.up="topk"', "compression.up_by_weight=0", "compression.down_ratio=0.005",
            'compression.down_values="int8"', "compression.down_adapt=0", "compression.momentum_replay=0"]
"""Sluice's earlier default: top-k uploads of int8 values with a client residual and a fixed top-k of 0.5 %
of the coordinates per round at the server, as int8 steps of a fixed gain (under today's server step,
whose momentum is the sparse heavy ball, with no replay on the output layer, every upload of the same size)."""


def synthetic(alpha: float, beta: float) -> list[str]:
    """Overrides for FedProx Synthetic(alpha, beta)."""
    return ["data.dataset=\"synthetic\"", f"data.synthetic_alpha={alpha:g}", f"data.synthetic_beta={beta:g}"]


SCENARIOS: dict[str, dict] = {
    "default (digits Dir 0.3, 20 clients, q 0.25)": {"over": [], "peers": True},
    "mnist-shards": {"over": ["data.dataset=\"mnist\"", "data.partition=\"shards\""], "peers": True},
    "synthetic-1-1": {"over": synthetic(1, 1)},
    "synthetic-0.5-0.5": {"over": synthetic(0.5, 0.5)},
    "synthetic-0-0": {"over": synthetic(0, 0)},
    "digits Dir 0.1": {"over": ["data.alpha=0.1"]},
    "digits 100 clients q 0.1": {"over": ["data.num_clients=100", "train.participation=0.1"]},
    "digits dropout 0.3": {"over": ["train.dropout=0.3"]},
    "digits momentum 0.9": {"over": ["compression.momentum=0.9"]},
    "digits Dir 0.1 momentum 0.9": {"over": ["data.alpha=0.1", "compression.momentum=0.9"]},
    "digits 100 clients q 0.1 momentum 0.9": {"over": ["data.num_clients=100", "train.participation=0.1",
                                                       "compression.momentum=0.9"]},
    "mnist-shards momentum 0.9": {"over": ["data.dataset=\"mnist\"", "data.partition=\"shards\"",
                                           "compression.momentum=0.9"]},
    "synthetic-1-1 momentum 0.9": {"over": [*synthetic(1, 1), "compression.momentum=0.9"]},
    "synthetic-1-1 q 0.1": {"over": [*synthetic(1, 1), "train.participation=0.1"]},
    "synthetic-1-1 100 clients q 0.1": {"over": [*synthetic(1, 1), "data.num_clients=100", "train.participation=0.1"]},
    "digits model x10 (512-448)": {"over": ["model.hidden=[512, 448]"]},
}
PEER_BUDGETS = {"FetchSGD": ["compression.sketch_cols_ratio=0.02"]}
"""FetchSGD's sketch: 5 rows of 2 % of d columns (10 % of d values), a budget near the others' uploads."""
QUICK = ("default (digits Dir 0.3, 20 clients, q 0.25)", "synthetic-1-1")


def methods(with_peers: bool) -> dict[str, tuple[list[str], str | None]]:
    """Display name -> (config overrides, peer name or None)."""
    out: dict[str, tuple[list[str], str | None]] = {
        DENSE_NAME: (DENSE, None),
        "Sluice": ([], None),
        PREVIOUS_NAME: (PREVIOUS, None),
    }
    if with_peers:
        from sluice.hfl.baselines import PEERS

        for name, (_, _, over) in PEERS.items():
            if name != "FedAvg":  # dense FedAvg above is the same method
                out[name] = ([*over, *PEER_BUDGETS.get(name, [])], name)
    return out


def run_one(job: tuple[str, str, list[str], str | None, int, int]) -> dict:
    scenario, method, overrides, peer, seed, rounds = job
    import torch

    from sluice.config import load_config
    from sluice.hfl import HFLEngine
    from sluice.hfl.config import HFLConfig

    torch.set_num_threads(1)
    cfg = load_config(None, [*overrides, f"seed={seed}", f"train.rounds={rounds}"], HFLConfig)
    kwargs = {}
    if peer is not None:
        from sluice.hfl.baselines import PEERS

        server_cls, client_cls, _ = PEERS[peer]
        kwargs = {"server_cls": server_cls, "client_cls": client_cls}
    engine = HFLEngine(cfg, **kwargs)
    t0 = time.perf_counter()
    acc, cum = [], []
    total = 0
    for _ in range(rounds):
        ev = engine.iterate()
        total += ev.bytes_up + ev.bytes_down
        acc.append(ev.metrics.get("test_accuracy", float("nan")))
        cum.append(total)
    return {"scenario": scenario, "method": method, "seed": seed, "final_accuracy": acc[-1],
            "bytes_total": total, "accuracy_curve": acc, "cum_bytes": cum, "num_params": engine.num_params,
            "wall_seconds": time.perf_counter() - t0}


def summarise(runs: list[dict]) -> dict:
    """Mean final accuracy (and its spread), the mean over runs of the last 10 rounds' accuracy (less
    noisy than the final round alone), mean MB."""
    accs = [r["final_accuracy"] for r in runs]
    return {"accuracy_mean": statistics.fmean(accs), "accuracy_sd": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            "accuracies": accs, "last10_mean": statistics.fmean(statistics.fmean(r["accuracy_curve"][-10:])
                                                                for r in runs),
            "mb_total": statistics.fmean(r["bytes_total"] for r in runs) / 1e6, "num_params": runs[0]["num_params"]}


def paired_se_points(runs: list[dict], base: list[dict]) -> float | None:
    """Standard error, in points, of the mean difference of ``runs`` to ``base`` (dense FedAvg, or Sluice) over
    their common seeds, each seed's difference paired with the base run of the same seed (the seed fixes data,
    partition, sampling and initial model for both); None with fewer than 2 common seeds."""
    paired = {r["seed"]: r["final_accuracy"] for r in base}
    gaps = [r["final_accuracy"] - paired[r["seed"]] for r in runs if r["seed"] in paired]
    return 100 * statistics.stdev(gaps) / len(gaps) ** 0.5 if len(gaps) > 1 else None


def collect(runs: list[dict], with_peers: dict[str, bool]) -> dict[str, dict]:
    """The per-scenario results of ``runs``: every method's summary, gap to dense FedAvg (and its standard
    error), reduction and accuracy per MB, in the order scenarios and methods first appear."""
    out: dict[str, dict] = {}
    for scen in dict.fromkeys(r["scenario"] for r in runs):
        by_method: dict[str, dict] = {}
        for name in dict.fromkeys(r["method"] for r in runs if r["scenario"] == scen):
            mine = [r for r in runs if r["scenario"] == scen and r["method"] == name]
            by_method[name] = {**summarise(mine), "runs": mine}
        base, ours = by_method[DENSE_NAME], by_method["Sluice"]
        for m in by_method.values():
            m["gap_points"] = 100 * (m["accuracy_mean"] - base["accuracy_mean"])
            m["gap_se_points"] = paired_se_points(m["runs"], base["runs"])
            m["change_points"] = 100 * (m["accuracy_mean"] - ours["accuracy_mean"])
            m["change_se_points"] = paired_se_points(m["runs"], ours["runs"])
            m["gap_last10_points"] = 100 * (m["last10_mean"] - base["last10_mean"])
            m["reduction_x"] = base["mb_total"] / m["mb_total"]
            m["accuracy_per_mb"] = m["accuracy_mean"] / m["mb_total"]
        out[scen] = {"methods": by_method, "peers": with_peers[scen]}
    return out


def merged_runs(paths: list[str]) -> tuple[list[dict], dict[str, bool], int, list[str]]:
    """The runs of several result files of the same rounds, in the scenarios every file has; a method is kept
    where its runs, over the files, have exactly the seeds of dense FedAvg's (so files of other seeds, or a
    file of variants only beside one of the same seeds with the baselines, merge). With which scenarios ran
    peers (in every file), the rounds and the files' commands."""
    files = [json.loads(Path(p).read_text()) for p in paths]
    rounds = {f["rounds"] for f in files}
    if len(rounds) != 1:
        raise SystemExit(f"--merge: the files ran different numbers of rounds ({sorted(rounds)})")
    scenarios = [s for s in files[0]["scenarios"] if all(s in f["scenarios"] for f in files)]
    if not scenarios:
        raise SystemExit("--merge: no scenario is in every file")
    runs: list[dict] = []
    for scen in scenarios:
        by_method: dict[str, list[dict]] = {}
        for f in files:
            for name, m in f["scenarios"][scen]["methods"].items():
                by_method.setdefault(name, []).extend(m["runs"])
        dense = sorted(r["seed"] for r in by_method.get(DENSE_NAME, []))
        for name, mine in by_method.items():
            seeds = sorted(r["seed"] for r in mine)
            if len(set(seeds)) != len(seeds):
                raise SystemExit(f"--merge: seeds {seeds} of {scen} / {name} repeat across the files")
            if seeds == dense:
                runs += sorted(mine, key=lambda r: r["seed"])
            else:
                print(f"--merge: {scen} / {name} left out: seeds {seeds}, dense FedAvg's {dense}", file=sys.stderr)
    with_peers = {s: all(f["scenarios"][s]["peers"] for f in files) for s in scenarios}
    return runs, with_peers, rounds.pop(), [f["command"] for f in files]


def seed_note(seeds: list[int]) -> str:
    """``3 seeds`` for seeds 0, 1, 2; ``3 seeds, 3–5`` or ``4 seeds: 0, 2, 3, 7`` otherwise."""
    s = sorted(set(seeds))
    count = f"{len(s)} seed{'s' if len(s) > 1 else ''}"
    if s == list(range(len(s))):
        return count
    if s == list(range(s[0], s[-1] + 1)):
        return f"{count}, {s[0]}–{s[-1]}"
    return f"{count}: {', '.join(map(str, s))}"


def plot(results: dict, path: Path) -> bool:
    """Accuracy against cumulative MB for the scenarios run with peers; False when there is none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    peers_scen = [s for s, r in results["scenarios"].items() if r["peers"]]
    if not peers_scen:
        return False
    fig, axes = plt.subplots(1, len(peers_scen), figsize=(7 * len(peers_scen), 5), squeeze=False)
    for ax, scen in zip(axes[0], peers_scen, strict=True):
        for name, m in results["scenarios"][scen]["methods"].items():
            curves = np.array([r["accuracy_curve"] for r in m["runs"]])
            mb = np.array([r["cum_bytes"] for r in m["runs"]]).mean(axis=0) / 1e6
            ax.plot(mb, np.nanmean(curves, axis=0), label=name)
        ax.set_xscale("log")
        ax.set_xlabel("cumulative MB (up + down)")
        ax.set_ylabel("test accuracy (mean of seeds)")
        ax.set_title(scen)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--quick", action="store_true", help="1 seed, 30 rounds, two scenarios")
    ap.add_argument("--only", action="append", help="run only this scenario (repeatable)")
    peers = ap.add_mutually_exclusive_group()
    peers.add_argument("--no-peers", action="store_true", help="leave the published methods out")
    peers.add_argument("--peers", action="store_true",
                       help="run the published methods on every scenario, not only on those marked peers")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE;KEY=VALUE",
                    help="also run Sluice with these overrides on every scenario (repeatable)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an override for every method of every scenario, dense FedAvg's too (repeatable)")
    ap.add_argument("--baselines", metavar="JSON",
                    help="take the methods Sluice is compared with (dense FedAvg, its earlier default, the "
                         "published methods) from this result file (same rounds; it must hold the seeds asked "
                         "for) instead of running them again; Sluice and the variants run")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "hfl_scenarios"))
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="run nothing: tabulate the runs of these result files together (same rounds), "
                         "keeping the methods whose seeds over the files are dense FedAvg's")
    args = ap.parse_args()
    command = shlex.join(["python", "bench/hfl_scenarios.py", *sys.argv[1:]])
    if args.merge:
        runs, with_peers, rounds, sources = merged_runs(args.merge)
    else:
        runs, with_peers = run_suite(args)
        rounds, sources = args.rounds, []
    results: dict = {"rounds": rounds, "seeds": len({r["seed"] for r in runs}), "machine": platform.platform(),
                     "python": platform.python_version(), "command": command, "merged": sources,
                     "scenarios": collect(runs, with_peers)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    plotted = plot(results, out.with_suffix(".png"))
    text = render(results, out.with_suffix(".png").name if plotted else None)
    out.with_suffix(".md").write_text(text)
    print(text, end="")


def run_suite(args: argparse.Namespace) -> tuple[list[dict], dict[str, bool]]:
    """Run the scenarios and methods ``args`` choose; return the runs and which scenarios ran the peers."""
    scenarios = dict(SCENARIOS)
    if args.quick:
        args.seeds, args.rounds = 1, 30
        scenarios = {k: v for k, v in SCENARIOS.items() if k in QUICK}
    if args.only:
        unknown = sorted(set(args.only) - set(SCENARIOS))
        if unknown:
            raise SystemExit(f"unknown scenario(s) {unknown}; choose from {sorted(SCENARIOS)}")
        scenarios = {k: SCENARIOS[k] for k in args.only}
    with_peers = {scen: (bool(spec.get("peers")) or args.peers) and not args.no_peers
                  for scen, spec in scenarios.items()}
    variants = {name: (over.split(";"), None) for name, over in (v.split("=", 1) for v in args.variant)}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    runs: list[dict] = []
    if args.baselines:
        runs = stored_runs(args.baselines, {scen: [m for m in methods(with_peers[scen]) if m != "Sluice"]
                                            for scen in scenarios}, seeds, args.rounds)
    jobs = []
    for scen, spec in scenarios.items():
        run = {name: m for name, m in methods(with_peers[scen]).items() if not args.baselines or name == "Sluice"}
        for name, (over, peer) in {**run, **variants}.items():
            for seed in seeds:
                jobs.append((scen, name, [*spec["over"], *args.set, *over], peer, seed, args.rounds))
    print(f"{len(jobs)} runs on {args.jobs} processes", flush=True)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for r in pool.map(run_one, jobs):
            runs.append(r)
            print(f"{r['scenario'][:40]:40s} {r['method'][:38]:38s} seed {r['seed']}: acc "
                  f"{r['final_accuracy']:.4f}, {r['bytes_total'] / 1e6:8.3f} MB ({r['wall_seconds']:.0f} s)",
                  flush=True)
    return runs, with_peers


def stored_runs(path: str, wanted: dict[str, list[str]], seeds: range, rounds: int) -> list[dict]:
    """The runs of result file ``path`` of the methods ``wanted[scenario]`` and ``seeds``; exits naming what
    the file lacks."""
    f = json.loads(Path(path).read_text())
    if f["rounds"] != rounds:
        raise SystemExit(f"--baselines: {path} ran {f['rounds']} rounds, not {rounds}")
    out, missing = [], []
    for scen, names in wanted.items():
        ms = f["scenarios"].get(scen, {}).get("methods", {})
        for name in names:
            have = {r["seed"]: r for r in ms.get(name, {}).get("runs", [])}
            missing += [f"{scen} / {name} seed {s}" for s in seeds if s not in have]
            out += [have[s] for s in seeds if s in have]
    if missing:
        raise SystemExit(f"--baselines: {path} lacks {len(missing)} runs, e.g. {missing[0]}")
    return out


def _gap(m: dict, key: str = "gap") -> str:
    se = m.get(f"{key}_se_points")
    return f"{m[f'{key}_points']:+.2f}" + ("" if se is None else f" ± {se:.2f}")


def render(results: dict, plot_name: str | None) -> str:
    """The markdown of ``results``: one line per scenario, then every method of the scenarios that ran more
    than Sluice, its earlier default and dense FedAvg."""
    seeds = [r["seed"] for s in results["scenarios"].values() for m in s["methods"].values() for r in m["runs"]]
    sources = results.get("merged", [])
    merged = f" Merged from: {'; '.join(f'`{c}`' for c in sources)}." if sources else ""
    lines = [f"# HFL scenario suite ({results['rounds']} rounds, {seed_note(seeds)})", "",
             f"Machine: {results['machine']}, Python {results['python']}. Bytes: `len()` of every encoded "
             "message, up + down. Gap: mean final accuracy minus dense FedAvg's, in points, ± its standard error "
             "over the seeds (each seed's gap paired with dense FedAvg's run of that seed, which shares its data, "
             "sampling and initial model); last 10: the same for the mean accuracy of the last 10 rounds; against "
             "Sluice: the same against Sluice's runs. Reduction: dense FedAvg's total bytes over the method's. "
             f"Command: `{results['command']}`.{merged}", "",
             "| scenario | d | dense FedAvg | Sluice | gap (points) | gap, last 10 | seeds (Sluice) | reduction × | "
             "earlier default: gap, seeds |", "|---|---|---|---|---|---|---|---|---|"]
    for scen, res in results["scenarios"].items():
        ms = res["methods"]
        dense, ours = ms[DENSE_NAME], ms["Sluice"]
        prev = ms[PREVIOUS_NAME]
        ours_seeds = ", ".join(f"{a:.3f}" for a in ours["accuracies"])
        prev_seeds = ", ".join(f"{a:.3f}" for a in prev["accuracies"])
        lines.append(f"| {scen} | {ours['num_params']} | {dense['accuracy_mean']:.4f} | {ours['accuracy_mean']:.4f} | "
                     f"{_gap(ours)} | {ours['gap_last10_points']:+.2f} | {ours_seeds} | "
                     f"{ours['reduction_x']:.1f} | {_gap(prev)}: {prev_seeds} |")
    for scen, res in results["scenarios"].items():
        if not res["peers"] and len(res["methods"]) <= 3:
            continue
        lines += ["", f"## {scen}: every method", "",
                  "| method | accuracy | gap (points) | gap, last 10 | against Sluice (points) | MB total | "
                  "reduction × | accuracy per MB |", "|---|---|---|---|---|---|---|---|"]
        for name, m in sorted(res["methods"].items(), key=lambda kv: -kv[1]["accuracy_per_mb"]):
            lines.append(f"| {name} | {m['accuracy_mean']:.4f} ± {m['accuracy_sd']:.4f} | {_gap(m)} | "
                         f"{m['gap_last10_points']:+.2f} | {_gap(m, 'change')} | "
                         f"{m['mb_total']:.3f} | {m['reduction_x']:.1f} | {m['accuracy_per_mb']:.3f} |")
    if plot_name:
        lines += ["", f"Plot: `{plot_name}` (accuracy against cumulative MB, one curve per method)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
