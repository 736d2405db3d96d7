"""Benchmark: pipelined split training (chosen G) against serial split training (G = 1).

Two workloads, both topology 4A (one follower's bottom model -> the leader's top), the rows of
``make_classification`` 16384 x 256 (32 informative), batch 1024, float32, SGD:

* ``mlp``: the built-in split task, follower bottom MLP 256-512-512-E, leader top E-64-2.
* ``conv``: the same rows written to CSV files (``follower-1.csv``: id + 256 feature columns; ``leader.csv``:
  id + label), each party listing its rows in its own order under random ids; the parties load them with
  ``sluice.read_table`` in a task factory of this module (``split_pipeline:conv_task``) and align them by
  private set intersection. The follower's bottom is convolutional: the 256 features as a one-channel
  signal, Conv1d 1->8 (k7, s2), 8->16 (k5, s2), 16->16 (k5, s2), 16->C (k4, s4), ReLU after each: it sends
  a (C, 8) feature map per row (E = 8C); leader top Flatten-(E)-64-2.

Each workload's embedding width E is calibrated on this machine so that sending one batch's embeddings at
100 Mbit/s takes about as long as the follower's forward + backward of that batch (transfer time ~ compute
time). The gradients coming back have the same size.

For 10, 100 and 1000 Mbit/s on the in-process link (token bucket each way, 1500-byte burst, 1 ms one-way
latency) it runs serial and pipelined training and reports the median step time, the speedup and the
ratio of the measured step time to the lower bound (target: <= 1.10)

    T_G >= max{ G(f+b), Gf+u+c+d+b+2L, f+Gu+c+d+b+2L, f+u+Gc+d+b+2L, f+u+c+Gd+b+2L }

with f, b, c the per-group operation times measured during that same run (follower forward and backward,
leader top forward+backward), u, d = encoded bytes of one group's message / bandwidth, L the latency.
It also checks that serial and pipelined training give the same loss curve. Then, when the machine
allows it (root, ``ip netns``, ``tc tbf``), the ``mlp`` runs go over gRPC between two network
namespaces joined by a veth pair shaped with tbf at 100 Mbit/s (burst 16 kB).

Run: ``.venv/bin/python bench/split_pipeline.py`` (about 2-4 minutes on 2 cores); ``--quick`` for a smoke
run. Writes ``bench/results/split_pipeline.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tomli_w
import torch
from torch import nn

from sluice import SplitTask, read_table
from sluice.split import SplitConfig, run_inprocess
from sluice.split.grouping import PipeStage as Stage
from sluice.split.grouping import chain_bound, group_sizes, lower_bound
from sluice.tasks.split_builtin import mlp
from sluice.transport.netns import NetnsPair, netns_available
from sluice.wire.tensor import encode_tensor

ROOT = Path(__file__).resolve().parents[1]
N_SAMPLES = 16384
BATCH = 1024
FEATURES = 256
INFORMATIVE = 32
HIDDEN = [512, 512]
CONV = (8, 16)  # channels of the convolutional bottom's first layers
POSITIONS = 8  # length of the feature map the convolutional bottom sends
LATENCY_MS = 1.0
BURST = 1500  # bytes: one Ethernet frame, so the nominal bound (no burst credit) is a true bound
WARMUP = 2
TARGET = 1.10  # measured / bound, pipelined


# -- the convolutional workload: tables in files, a task of one's own ----------------------------------------
class SignalConv(nn.Module):
    """The follower's 256 features as a one-channel signal -> a (channels, 8) feature map per row."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        a, b = CONV
        self.net = nn.Sequential(
            nn.Conv1d(1, a, 7, stride=2, padding=3), nn.ReLU(),  # 128
            nn.Conv1d(a, b, 5, stride=2, padding=2), nn.ReLU(),  # 64
            nn.Conv1d(b, b, 5, stride=2, padding=2), nn.ReLU(),  # 32
            nn.Conv1d(b, channels, 4, stride=4), nn.ReLU(),  # 8
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(len(x), 1, -1))


def conv_task(party: str, tables: str, channels: int) -> SplitTask:
    """``party``'s share of the ``conv`` workload: its table ``tables/<party>.csv``; the follower's bottom is a
    :class:`SignalConv`, the leader's top reads its (channels, 8) maps flattened."""
    table = read_table(Path(tables) / f"{party}.csv", label_column="label" if party == "leader" else None)
    if party != "leader":
        return SplitTask(table=table, bottom=lambda: SignalConv(channels), name="conv-signal")

    def top() -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(channels * POSITIONS, 64), nn.ReLU(), nn.Linear(64, 2))

    return SplitTask(table=table, top=top, name="conv-signal")


def write_tables(folder: Path, seed: int = 0) -> dict[str, Any]:
    """The ``mlp`` workload's rows as two CSV files, each party's rows in its own order under random ids."""
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=N_SAMPLES, n_features=FEATURES, n_informative=INFORMATIVE,
                               n_redundant=0, n_classes=2, random_state=seed)
    rng = np.random.default_rng(seed)
    ids = np.array([f"s{v:08x}" for v in rng.choice(2**32, N_SAMPLES, replace=False)])
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    for name, head, rows in (
        ("follower-1", [f"x{j}" for j in range(FEATURES)], lambda i: [f"{v:.7g}" for v in X[i]]),
        ("leader", ["label"], lambda i: [int(y[i])]),
    ):
        path = folder / f"{name}.csv"
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["id", *head])
            for i in rng.permutation(N_SAMPLES):
                w.writerow([ids[i], *rows(i)])
        out[name] = {"rows": N_SAMPLES, "columns": len(head), "bytes": path.stat().st_size}
    return out


# -- workloads -----------------------------------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    embedding: int  # numbers the follower sends per row
    emb_shape: tuple[int, ...]  # their shape
    compute_s: float  # follower forward + backward of one batch
    transfer_s: float  # one batch's embeddings at 100 Mbit/s
    task: dict[str, Any] | None = None  # [task] section; None: the built-in task of [data] and [model]
    tables: dict[str, Any] = field(default_factory=dict)


def bottom_seconds(make: Callable[[int], nn.Module], embedding: int, repeats: int = 7) -> float:
    """Median forward + backward time of the follower's bottom model on one batch."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    m = make(embedding)
    x = torch.randn(BATCH, FEATURES)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        h = m(x)
        h.backward(torch.ones_like(h))
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def calibrate(make: Callable[[int], nn.Module], bw_mbps: float) -> tuple[int, float, float]:
    """Embedding width (a multiple of 8) whose batch transfer at ``bw_mbps`` takes as long as the bottom's
    compute: (width, compute seconds, transfer seconds)."""
    emb = 128
    for _ in range(3):
        fb = bottom_seconds(make, emb)
        want = fb * bw_mbps * 1e6 / 8 / (BATCH * 4)
        emb = int(min(1024, max(16, round(want / 8) * 8)))
    return emb, bottom_seconds(make, emb), BATCH * emb * 4 * 8 / (bw_mbps * 1e6)


def mlp_workload() -> Workload:
    emb, fb, tr = calibrate(lambda e: mlp(FEATURES, HIDDEN, e, "relu", True, False, "float32"), 100.0)
    return Workload("mlp", emb, (emb,), fb, tr)


def conv_workload(folder: Path) -> Workload:
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:  # the factory is imported by name, as a party would
        sys.path.insert(0, here)
    emb, fb, tr = calibrate(lambda e: SignalConv(e // POSITIONS), 100.0)
    tables = write_tables(folder)
    task = {"factory": "split_pipeline:conv_task", "args": {"tables": str(folder), "channels": emb // POSITIONS}}
    return Workload("conv", emb, (emb // POSITIONS, POSITIONS), fb, tr, task, tables)


def config(w: Workload, groups: int | str, steps: int, bw_mbps: float | None) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "seed": 0,
        "topology": "4A",
        "followers": 1,
        "data": {
            "dataset": "classification", "n_samples": N_SAMPLES, "n_features": FEATURES,
            "n_informative": INFORMATIVE,
        },
        "model": {"bottom_hidden": HIDDEN, "embedding": w.embedding, "top_hidden": [64], "dtype": "float32"},
        "train": {"steps": steps, "batch_size": BATCH, "eval_every": 0, "lr": 0.05, "momentum": 0.9},
        "pipeline": {"groups": groups},
        "transport": {
            "kind": "inproc",
            "timeout_s": 60.0,
            "emulate": {"bandwidth_mbps": bw_mbps, "latency_ms": LATENCY_MS, "burst_bytes": BURST},
        },
    }
    if w.task is not None:
        cfg["task"] = w.task
        del cfg["data"], cfg["model"]
    return cfg


# -- measurement (shared by the workloads) -------------------------------------------------------------------
def per_op(records: list[dict[str, Any]], party: str, op: str) -> float:
    tot = sum(r["op_s"][party][op][0] for r in records)
    cnt = sum(r["op_s"][party][op][1] for r in records)
    return tot / max(cnt, 1)


def analyse(
    records: list[dict[str, Any]], emb_shape: tuple[int, ...], bw_mbps: float, latency_s: float
) -> dict[str, Any]:
    """Median step time and the lower bound for the G used, from what was measured in this run."""
    meas = records[WARMUP:]
    G = meas[0]["groups"]
    n = group_sizes(BATCH, G)[0]
    msg = len(encode_tensor(0, 0, "emb", torch.zeros(n, *emb_shape)))
    W = bw_mbps * 1e6 / 8
    f = per_op(meas, "follower-1", "bottom.fwd")
    b = per_op(meas, "follower-1", "bottom.bwd")
    c = per_op(meas, "leader", "head")
    u = d = msg / W
    bound = lower_bound(G, f, b, c, u, d, latency_s)
    stages = [Stage("f", "F", f), Stage("u", "up", u), Stage("c", "L", c), Stage("d", "down", d),
              Stage("b", "F", b)]
    steps = [r["step_time_s"] for r in meas]
    med = statistics.median(steps)
    return {
        "groups": G,
        "steps_measured": len(meas),
        "median_step_s": med,
        "mean_step_s": statistics.fmean(steps),
        "per_group": {"f": f, "b": b, "c": c, "u": u, "d": d, "L": latency_s, "message_bytes": msg},
        "lower_bound_s": bound,
        "ratio_to_bound": med / bound,
        "chain_bound_s": chain_bound(G, stages, 2 * latency_s),
        "idle_s": {p: statistics.fmean(r["idle_s"][p] for r in meas) for p in meas[0]["idle_s"]},
        "bytes_up_per_step": meas[-1]["bytes_up"],
        "bytes_down_per_step": meas[-1]["bytes_down"],
    }


def compare(out: dict[str, Any], losses: dict[str, list[float]]) -> dict[str, Any]:
    out["speedup"] = out["serial"]["median_step_s"] / out["pipelined"]["median_step_s"]
    out["speedup_mean"] = out["serial"]["mean_step_s"] / out["pipelined"]["mean_step_s"]
    out["max_loss_diff"] = max(abs(a - b) for a, b in zip(losses["serial"], losses["pipelined"], strict=True))
    out["met"] = out["pipelined"]["ratio_to_bound"] <= TARGET
    return out


def inproc(w: Workload, bw: float, steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"bandwidth_mbps": bw}
    losses = {}
    for label, groups in (("serial", 1), ("pipelined", "auto")):
        res = run_inprocess(SplitConfig.model_validate(config(w, groups, steps, bw)))
        out[label] = analyse(res.records, w.emb_shape, bw, LATENCY_MS / 1000)
        out[label]["aligned_samples"] = res.summary.get("aligned_samples")
        losses[label] = [r["loss"] for r in res.records]
        if label == "pipelined":
            out[label]["group_choice"] = res.summary.get("group_choice")
    return compare(out, losses)


def netns_run(w: Workload, steps: int, rate: float) -> dict[str, Any]:
    ok, why = netns_available()
    if not ok:
        return {"skipped": f"network namespaces are not available here: {why}"}
    out: dict[str, Any] = {"rate_mbit": rate, "tbf_burst": "16kb"}
    with (
        tempfile.TemporaryDirectory(prefix="sluice-netns-") as tmp,
        NetnsPair(rate_mbit=rate, burst="16kb") as net,
    ):
        losses = {}
        for label, groups in (("serial", 1), ("pipelined", "auto")):
            cfg = config(w, groups, steps, None)
            cfg["transport"] = {"kind": "grpc", "timeout_s": 60.0, "connect_timeout_s": 30.0}
            cpath = Path(tmp) / f"{label}.toml"
            cpath.write_text(tomli_w.dumps(cfg))
            ready = Path(tmp) / f"{label}.addr"
            port = 50551 if label == "serial" else 50552
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            fol = subprocess.Popen(
                net.exec_in(net.ns_b) + [
                    sys.executable, "-m", "sluice", "split", "party", "--role", "follower",
                    "--listen", f"{net.addr_b}:{port}", "--ready-file", str(ready), "--accept-timeout", "60",
                    str(cpath),
                ],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            )
            try:
                end = time.monotonic() + 60
                while not ready.exists():
                    if fol.poll() is not None or time.monotonic() > end:
                        raise RuntimeError("the follower in the namespace did not start")
                    time.sleep(0.1)
                rdir = Path(tmp) / f"run-{label}"
                lead = subprocess.run(
                    net.exec_in(net.ns_a) + [
                        sys.executable, "-m", "sluice", "split", "party", "--role", "leader",
                        "--connect", f"{net.addr_b}:{port}", "--out", str(rdir), str(cpath),
                    ],
                    capture_output=True, text=True, timeout=600, env=env,
                )
                if lead.returncode != 0:
                    raise RuntimeError(f"leader failed: {lead.stderr[-2000:]}")
                fol.wait(30)
            finally:
                if fol.poll() is None:
                    fol.kill()
                    fol.wait(10)
            recs = [json.loads(x) for x in (rdir / "steps.jsonl").read_text().splitlines() if x.strip()]
            summ = json.loads((rdir / "summary.json").read_text())
            out[label] = analyse(recs, w.emb_shape, rate, 0.0)
            if label == "pipelined":
                out[label]["group_choice"] = summ.get("group_choice")
            losses[label] = [r["loss"] for r in recs]
    return compare(out, losses)


# -- report --------------------------------------------------------------------------------------------------
def verdict(r: dict[str, Any]) -> str:
    return f"**{r['pipelined']['ratio_to_bound']:.3f}** ({'met' if r['met'] else 'not met'})"


def inproc_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| link | serial step | G chosen | pipelined step | speedup (median / mean) | bound T_G | "
        f"measured / bound (<= {TARGET:.2f}) | max loss diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s, p = r["serial"], r["pipelined"]
        lines.append(
            f"| {r['bandwidth_mbps']:g} Mbit/s | {1000 * s['median_step_s']:.1f} ms | {p['groups']} | "
            f"{1000 * p['median_step_s']:.1f} ms | {r['speedup']:.2f}x / {r['speedup_mean']:.2f}x | "
            f"{1000 * p['lower_bound_s']:.1f} ms | {verdict(r)} | {r['max_loss_diff']:.1e} |"
        )
    lines += ["", "Serial runs against their own bound (G = 1: the sum of all stages): " + ", ".join(
        f"{r['bandwidth_mbps']:g} Mbit/s {r['serial']['ratio_to_bound']:.3f}" for r in rows) + "."]
    return lines


def markdown(res: dict[str, Any]) -> str:
    m, c = res["workloads"].get("mlp"), res["workloads"].get("conv")
    lines = [
        "# Pipelined split training: serial (G = 1) vs pipelined (chosen G)",
        "",
        f"Measured on {res['machine']} ({res['date']}), `{res['command']}`; load average "
        f"{res['load_before']} before, {res['load_after']} after.",
        "",
        f"Both workloads: topology 4A, the rows of make_classification {N_SAMPLES} x {FEATURES} "
        f"({INFORMATIVE} informative), batch {BATCH}, float32, SGD; the embedding width E calibrated here so "
        "that sending a batch's embeddings at 100 Mbit/s takes about as long as the follower's forward+backward "
        "of the batch (the gradients back are the same size). "
        f"{res['steps']} steps per run, the first {WARMUP} not measured; step time = median over the measured "
        "steps.",
        "",
        "Lower bound for the G used (per group: f, b = follower forward/backward and c = leader top "
        "forward+backward, as measured in the same run; u, d = one group's encoded message / bandwidth; "
        "L = one-way latency): T_G >= max{G(f+b), Gf+u+c+d+b+2L, f+Gu+c+d+b+2L, f+u+Gc+d+b+2L, "
        f"f+u+c+Gd+b+2L}}. Target: pipelined step / T_G <= {TARGET:.2f}. In-process link: token bucket each "
        f"way, {BURST}-byte burst, 1 ms one-way latency.",
    ]
    if m is not None:
        lines += [
            "", "## Built-in task, follower bottom MLP (in-process link)", "",
            f"Follower bottom MLP {FEATURES}-{'-'.join(map(str, HIDDEN))}-{m['embedding']} (forward+backward of a "
            f"batch {1000 * m['compute_s']:.1f} ms, its embeddings at 100 Mbit/s {1000 * m['transfer_s']:.1f} ms), "
            f"leader top {m['embedding']}-64-2.", "",
            *inproc_table(m["inproc"]),
        ]
    if c is not None:
        fol, lea = c["tables"]["follower-1"], c["tables"]["leader"]
        ch = c["emb_shape"][0]
        lines += [
            "", "## Tables from CSV files, convolutional follower bottom (in-process link)", "",
            f"The same rows written to CSV: `follower-1.csv` (id + {fol['columns']} feature columns, "
            f"{fol['bytes'] / 1e6:.1f} MB), `leader.csv` (id + label, {lea['bytes'] / 1e6:.2f} MB), each party's "
            "rows in its own order under random ids; each party reads its own file with `sluice.read_table` in "
            "the task factory `split_pipeline:conv_task`, and the parties align "
            f"{c['inproc'][0]['pipelined']['aligned_samples']} rows by private set intersection before training. "
            f"Follower bottom: the {FEATURES} features as a one-channel signal, Conv1d 1-{CONV[0]} (k7, s2), "
            f"{CONV[0]}-{CONV[1]} (k5, s2), {CONV[1]}-{CONV[1]} (k5, s2), {CONV[1]}-{ch} (k4, s4), ReLU after "
            f"each: a ({ch}, {POSITIONS}) feature map per row, E = {c['embedding']} (forward+backward of a batch "
            f"{1000 * c['compute_s']:.1f} ms, its maps at 100 Mbit/s {1000 * c['transfer_s']:.1f} ms); leader top "
            f"Flatten-{c['embedding']}-64-2.", "",
            *inproc_table(c["inproc"]),
        ]
    n = res["netns"]
    lines += ["", "## gRPC between two network namespaces (MLP workload; veth, tc tbf 100 Mbit/s, burst 16 kB)",
              ""]
    if "skipped" in n:
        lines.append(f"Not run: {n['skipped']}")
    else:
        s, p = n["serial"], n["pipelined"]
        lines += [
            "| serial step | G chosen | pipelined step | speedup (median / mean) | bound T_G (L = 0) | "
            "measured / bound | max loss diff |",
            "|---|---|---|---|---|---|---|",
            f"| {1000 * s['median_step_s']:.1f} ms | {p['groups']} | {1000 * p['median_step_s']:.1f} ms | "
            f"{n['speedup']:.2f}x / {n['speedup_mean']:.2f}x | {1000 * p['lower_bound_s']:.1f} ms | "
            f"{verdict(n)} | {n['max_loss_diff']:.1e} |",
            "",
            "Leader and follower are separate processes (`sluice split party`), each in its own namespace; "
            "the bound uses the nominal tbf rate (TCP/IP and HTTP/2 framing are not in u, d).",
        ]
    lines += ["", "Full numbers (per-group times, idle time per party, bytes per step, the automatic choice "
              "of G with the seed's formula value): `split_pipeline.json`.", ""]
    return "\n".join(lines)


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def report(w: Workload, r: dict[str, Any]) -> None:
    print(f"{w.name} {r['bandwidth_mbps']:g} Mbit/s: serial {1000 * r['serial']['median_step_s']:.1f} ms, "
          f"G={r['pipelined']['groups']} {1000 * r['pipelined']['median_step_s']:.1f} ms, "
          f"speedup {r['speedup']:.2f}x, measured/bound {r['pipelined']['ratio_to_bound']:.3f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few steps, 100 Mbit/s only, no namespaces")
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    steps = 5 if args.quick else args.steps
    command = "python bench/split_pipeline.py" + (" --quick" if args.quick else "") + (
        f" --steps {args.steps}" if args.steps != 14 and not args.quick else "")
    res: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, 1 torch thread",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": command,
        "steps": steps,
        "target_ratio": TARGET,
        "load_before": load(),
        "workloads": {},
    }
    links = [100.0] if args.quick else [10.0, 100.0, 1000.0]
    done: dict[str, Workload] = {}
    with tempfile.TemporaryDirectory(prefix="sluice-split-tables-") as tmp:
        for make in (mlp_workload, lambda: conv_workload(Path(tmp))):
            w = make()
            print(f"{w.name}: embedding {w.emb_shape}, compute {w.compute_s * 1000:.1f} ms, "
                  f"transfer at 100 Mbit/s {w.transfer_s * 1000:.1f} ms", flush=True)
            rows = []
            for bw in links:
                rows.append(inproc(w, bw, steps))
                report(w, rows[-1])
            res["workloads"][w.name] = {**asdict(w), "inproc": rows}
            done[w.name] = w
    res["netns"] = {"skipped": "--quick"} if args.quick else netns_run(done["mlp"], steps, 100.0)
    if "skipped" not in res["netns"]:
        n = res["netns"]
        print(f"netns 100 Mbit/s: serial {1000 * n['serial']['median_step_s']:.1f} ms, "
              f"G={n['pipelined']['groups']} {1000 * n['pipelined']['median_step_s']:.1f} ms, "
              f"speedup {n['speedup']:.2f}x, measured/bound {n['pipelined']['ratio_to_bound']:.3f}", flush=True)
    else:
        print("netns:", res["netns"]["skipped"])
    res["load_after"] = load()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "split_pipeline_quick" if args.quick else "split_pipeline"
    (out / f"{name}.json").write_text(json.dumps(res, indent=2, default=float) + "\n")
    (out / f"{name}.md").write_text(markdown(res))
    print(f"wrote {out / name}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
