"""Benchmark: pipelined split training (chosen G) against serial split training (G = 1).

Workload: topology 4A (follower bottom MLP -> leader top), ``make_classification`` 16384 x 256, batch
1024, float32. The follower's embedding width is calibrated on this machine so that sending one batch's
embeddings at 100 Mbit/s takes about as long as the follower's forward + backward of that batch
(transfer time ~ compute time). The gradients coming back have the same size.

For 10, 100 and 1000 Mbit/s on the in-process link (token bucket each way, 1500-byte burst, 1 ms one-way
latency) it runs serial and pipelined training and reports the median step time, the speedup and the
ratio of the measured step time to the lower bound

    T_G >= max{ G(f+b), Gf+u+c+d+b+2L, f+Gu+c+d+b+2L, f+u+Gc+d+b+2L, f+u+c+Gd+b+2L }

with f, b, c the per-group operation times measured during that same run (follower forward and backward,
leader top forward+backward), u, d = encoded bytes of one group's message / bandwidth, L the latency.
It also checks that serial and pipelined training give the same loss curve. Then, when the machine
allows it (root, ``ip netns``, ``tc tbf``), the same two runs go over gRPC between two network
namespaces joined by a veth pair shaped with tbf at 100 Mbit/s (burst 16 kB).

Run: ``.venv/bin/python bench/split_pipeline.py`` (about 2-3 minutes); ``--quick`` for a smoke run.
Writes ``bench/results/split_pipeline.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w
import torch

from sluice.split import SplitConfig, run_inprocess
from sluice.split.grouping import PipeStage as Stage
from sluice.split.grouping import chain_bound, group_sizes, lower_bound
from sluice.split.models import build_mlp, mlp_spec
from sluice.transport.netns import NetnsPair, netns_available
from sluice.wire.tensor import encode_tensor

ROOT = Path(__file__).resolve().parents[1]
BATCH = 1024
FEATURES = 256
HIDDEN = [512, 512]
LATENCY_MS = 1.0
BURST = 1500  # bytes: one Ethernet frame, so the nominal bound (no burst credit) is a true bound
WARMUP = 2


def workload(embedding: int, groups: int | str, steps: int, bw_mbps: float | None) -> dict[str, Any]:
    return {
        "seed": 0,
        "topology": "4A",
        "followers": 1,
        "data": {
            "dataset": "classification", "n_samples": 16384, "n_features": FEATURES, "n_informative": 32
        },
        "model": {"bottom_hidden": HIDDEN, "embedding": embedding, "top_hidden": [64], "dtype": "float32"},
        "train": {"steps": steps, "batch_size": BATCH, "eval_every": 0, "lr": 0.05, "momentum": 0.9},
        "pipeline": {"groups": groups},
        "transport": {
            "kind": "inproc",
            "timeout_s": 60.0,
            "emulate": {"bandwidth_mbps": bw_mbps, "latency_ms": LATENCY_MS, "burst_bytes": BURST},
        },
    }


def bottom_seconds(embedding: int, repeats: int = 7) -> float:
    """Median forward + backward time of the follower's bottom model on one batch."""
    torch.set_num_threads(1)
    m = build_mlp(mlp_spec(FEATURES, HIDDEN, embedding, "relu", True, False, "float32"), 0)
    x = torch.randn(BATCH, FEATURES)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        h = m(x)
        h.backward(torch.ones_like(h))
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def calibrate(bw_mbps: float) -> dict[str, Any]:
    """Embedding width whose batch transfer at ``bw_mbps`` takes as long as the bottom's compute."""
    emb = 128
    for _ in range(3):
        fb = bottom_seconds(emb)
        want = fb * bw_mbps * 1e6 / 8 / (BATCH * 4)
        emb = int(min(1024, max(16, round(want / 8) * 8)))
    fb = bottom_seconds(emb)
    return {"embedding": emb, "compute_s": fb, "transfer_s": BATCH * emb * 4 * 8 / (bw_mbps * 1e6)}


def per_op(records: list[dict[str, Any]], party: str, op: str) -> float:
    tot = sum(r["op_s"][party][op][0] for r in records)
    cnt = sum(r["op_s"][party][op][1] for r in records)
    return tot / max(cnt, 1)


def analyse(
    records: list[dict[str, Any]], embedding: int, bw_mbps: float, latency_s: float
) -> dict[str, Any]:
    """Median step time and the lower bound for the G used, from what was measured in this run."""
    meas = records[WARMUP:]
    G = meas[0]["groups"]
    n = group_sizes(BATCH, G)[0]
    msg = len(encode_tensor(0, 0, "emb", torch.zeros(n, embedding)))
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


def inproc(embedding: int, bw: float, steps: int) -> dict[str, Any]:
    out: dict[str, Any] = {"bandwidth_mbps": bw}
    losses = {}
    for label, groups in (("serial", 1), ("pipelined", "auto")):
        res = run_inprocess(SplitConfig.model_validate(workload(embedding, groups, steps, bw)))
        out[label] = analyse(res.records, embedding, bw, LATENCY_MS / 1000)
        losses[label] = [r["loss"] for r in res.records]
        if label == "pipelined":
            out[label]["group_choice"] = res.summary.get("group_choice")
    out["speedup"] = out["serial"]["median_step_s"] / out["pipelined"]["median_step_s"]
    out["speedup_mean"] = out["serial"]["mean_step_s"] / out["pipelined"]["mean_step_s"]
    out["max_loss_diff"] = max(abs(a - b) for a, b in zip(losses["serial"], losses["pipelined"], strict=True))
    return out


def netns_run(embedding: int, steps: int, rate: float) -> dict[str, Any]:
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
            cfg = workload(embedding, groups, steps, None)
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
            out[label] = analyse(recs, embedding, rate, 0.0)
            if label == "pipelined":
                out[label]["group_choice"] = summ.get("group_choice")
            losses[label] = [r["loss"] for r in recs]
        out["speedup"] = out["serial"]["median_step_s"] / out["pipelined"]["median_step_s"]
        out["speedup_mean"] = out["serial"]["mean_step_s"] / out["pipelined"]["mean_step_s"]
        pairs = zip(losses["serial"], losses["pipelined"], strict=True)
        out["max_loss_diff"] = max(abs(a - b) for a, b in pairs)
    return out


def markdown(res: dict[str, Any]) -> str:
    w = res["workload"]
    lines = [
        "# Pipelined split training: serial (G = 1) vs pipelined (chosen G)",
        "",
        f"Measured on {res['machine']} ({res['date']}), `{res['command']}`.",
        "",
        f"Workload: topology 4A, make_classification 16384 x {FEATURES}, batch {BATCH}, follower bottom "
        f"MLP {FEATURES}-{'-'.join(map(str, HIDDEN))}-{w['embedding']} (embedding width calibrated here: "
        f"forward+backward of a batch {1000 * w['compute_s']:.1f} ms, sending its embeddings at 100 Mbit/s "
        f"{1000 * w['transfer_s']:.1f} ms; the gradients back are the same size), leader top "
        f"{w['embedding']}-64-2, float32, SGD. {res['steps']} steps per run, the first {WARMUP} not "
        "measured; "
        "step time = median over the measured steps.",
        "",
        "Lower bound for the G used (per group: f, b = follower forward/backward and c = leader top "
        "forward+backward, as measured in the same run; u, d = one group's encoded message / bandwidth; "
        "L = one-way latency): T_G >= max{G(f+b), Gf+u+c+d+b+2L, f+Gu+c+d+b+2L, f+u+Gc+d+b+2L, "
        "f+u+c+Gd+b+2L}.",
        "",
        f"## In-process link (token bucket each way, {BURST}-byte burst, 1 ms one-way latency)",
        "",
        "| link | serial step | G chosen | pipelined step | speedup (median / mean) | bound T_G | "
        "measured / bound | max loss diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in res["inproc"]:
        s, p = r["serial"], r["pipelined"]
        lines.append(
            f"| {r['bandwidth_mbps']:g} Mbit/s | {1000 * s['median_step_s']:.1f} ms | {p['groups']} | "
            f"{1000 * p['median_step_s']:.1f} ms | {r['speedup']:.2f}x / {r['speedup_mean']:.2f}x | "
            f"{1000 * p['lower_bound_s']:.1f} ms | {p['ratio_to_bound']:.3f} | {r['max_loss_diff']:.1e} |"
        )
    lines += ["", "Serial runs against their own bound (G = 1: the sum of all stages): " + ", ".join(
        f"{r['bandwidth_mbps']:g} Mbit/s {r['serial']['ratio_to_bound']:.3f}" for r in res["inproc"]) + "."]
    n = res["netns"]
    lines += ["", "## gRPC between two network namespaces (veth, tc tbf 100 Mbit/s, burst 16 kB)", ""]
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
            f"{p['ratio_to_bound']:.3f} | {n['max_loss_diff']:.1e} |",
            "",
            "Leader and follower are separate processes (`sluice split party`), each in its own namespace; "
            "the bound uses the nominal tbf rate (TCP/IP and HTTP/2 framing are not in u, d).",
        ]
    lines += ["", "Full numbers (per-group times, idle time per party, bytes per step, the automatic choice "
              "of G with the seed's formula value): `split_pipeline.json`.", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few steps, 100 Mbit/s only, no namespaces")
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    steps = 5 if args.quick else args.steps
    w = calibrate(100.0)
    print(f"workload: embedding {w['embedding']}, compute {w['compute_s'] * 1000:.1f} ms, "
          f"transfer at 100 Mbit/s {w['transfer_s'] * 1000:.1f} ms", flush=True)
    res: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, 1 torch thread",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": "python bench/split_pipeline.py" + (" --quick" if args.quick else ""),
        "steps": steps,
        "workload": w,
        "inproc": [],
    }
    for bw in ([100.0] if args.quick else [10.0, 100.0, 1000.0]):
        r = inproc(w["embedding"], bw, steps)
        res["inproc"].append(r)
        print(f"{bw:g} Mbit/s: serial {1000 * r['serial']['median_step_s']:.1f} ms, "
              f"G={r['pipelined']['groups']} {1000 * r['pipelined']['median_step_s']:.1f} ms, "
              f"speedup {r['speedup']:.2f}x, "
              f"measured/bound {r['pipelined']['ratio_to_bound']:.3f}", flush=True)
    res["netns"] = {"skipped": "--quick"} if args.quick else netns_run(w["embedding"], steps, 100.0)
    if "skipped" not in res["netns"]:
        n = res["netns"]
        print(f"netns 100 Mbit/s: serial {1000 * n['serial']['median_step_s']:.1f} ms, "
              f"G={n['pipelined']['groups']} {1000 * n['pipelined']['median_step_s']:.1f} ms, "
              f"speedup {n['speedup']:.2f}x", flush=True)
    else:
        print("netns:", res["netns"]["skipped"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "split_pipeline_quick" if args.quick else "split_pipeline"
    (out / f"{name}.json").write_text(json.dumps(res, indent=2, default=float) + "\n")
    (out / f"{name}.md").write_text(markdown(res))
    print(f"wrote {out / name}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

