"""Sluice on Flower's deployment engine against Flower's own FedAvg app, on the same SuperNodes.

Scenario: the default ``sluice run`` job (digits, Dirichlet 0.3, its default compression both ways with a
per-client downlink) with ``data.num_clients = 4`` and every client in every round
(``train.participation = 1``), on a local TLS deployment: one SuperLink and 4 SuperNodes on 127.0.0.1.

Measured, each for ``--rounds`` rounds:

* Sluice on Flower (``sluice.runtimes.flower``): seconds per round (the ServerApp's iteration time, discovery of the
  nodes excluded), Sluice bytes per round each way (``len()`` of its messages), the bytes of the Flower
  objects that carried them, the SuperLink's traffic counter for the run (``flwr ls``), final accuracy;
* Flower's FedAvg (``bench/flower_fedavg_app.py``: the same model, data and local training, dense float32
  both ways): seconds per round (between its end-of-round evaluations), payload bytes, SuperLink counter,
  final accuracy;
* where a round's time goes: the in-process simulator's time for the same rounds (the compute), Flower's
  ClientApp compute time per message (``flwr ls``: the lifetime of the ``flwr-clientapp`` process each
  message starts), the import time of a ClientApp process, and Sluice on Flower again with the settings
  that can be changed: the SuperExec's task poll at 0.2 s instead of Flower's default 1 s
  (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``), and the server pulling replies every 3 s (as
  ``Grid.send_and_receive``) instead of every 0.05 s. The SuperNode's 3 s sleep between pulls when idle is
  hard-coded in Flower 1.41 (``start_client_internal.py``) and cannot be set.

Run: ``.venv/bin/python bench/flower_runtime.py [--rounds 8]``; writes ``bench/results/flower_runtime.md``
and ``.json``. Timings depend on the load of the machine; the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

from sluice.runtimes.flower.deploy import LocalDeployment, _bin, flower_env, run_status, submit
from sluice.runtimes.jobs import load_job

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
OVERRIDES = ["data.num_clients=4", "train.participation=1.0"]


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _wait(path: Path, timeout_s: float, error: Path | None = None) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if path.exists():
            time.sleep(0.5)
            return
        if error is not None and error.exists():
            raise RuntimeError(error.read_text())
        time.sleep(0.5)
    raise TimeoutError(f"{path} did not appear within {timeout_s} s")


def _final_status(dep: LocalDeployment, run_id: int) -> dict:
    for _ in range(20):
        st = run_status(dep.home, run_id)
        if str(st.get("status", "")).startswith("finished"):
            return st
        time.sleep(1.0)
    return st


def sluice_on_flower(dep: LocalDeployment, work: Path, rounds: int, name: str, pull_s: float = 0.05) -> dict:
    job = load_job("hfl", None, [*OVERRIDES, f"train.rounds={rounds}"])
    out = work / name
    (out / "flower").mkdir(parents=True)
    sub = submit(job.dump(), out, out / "flower", dep.home,
                 run_config={"min-nodes": 4, "round-timeout": 300.0, "poll-interval": pull_s})
    _wait(out / "report.json", 60 + 60 * rounds, out / "flower" / "server-error.txt")
    st = _final_status(dep, sub.run_id)
    rows = _rows(out / "metrics.jsonl")
    secs = [r["seconds"] for r in rows]
    traffic = st.get("network-traffic", {})
    compute = st.get("compute-time", {})
    return {
        "rounds": len(rows), "seconds_per_round_median": statistics.median(secs), "seconds_per_round": secs,
        "sluice_bytes_up_per_round": statistics.mean(r["bytes_up"] for r in rows),
        "sluice_bytes_down_per_round": statistics.mean(r["bytes_down"] for r in rows),
        "flower_object_bytes_up_per_round": statistics.mean(r["flower_bytes_up"] for r in rows),
        "flower_object_bytes_down_per_round": statistics.mean(r["flower_bytes_down"] for r in rows),
        "superlink_in_bytes_per_round": traffic.get("inbound-bytes", 0) / len(rows),
        "superlink_out_bytes_per_round": traffic.get("outbound-bytes", 0) / len(rows),
        "clientapp_seconds_per_message": compute.get("clientapp-seconds", 0.0) / (4 * len(rows) + 4),
        "final_accuracy": rows[-1]["test_accuracy"],
        "messages": 4 * len(rows) + 4,  # one per node per round, plus one hello per node
    }


def fedavg_on_flower(dep: LocalDeployment, work: Path, rounds: int) -> dict:
    job = load_job("hfl", None, [*OVERRIDES, f"train.rounds={rounds}"])
    app = work / "fedavg-app"
    app.mkdir(parents=True)
    shutil.copy(HERE / "flower_fedavg_app.py", app / "flower_fedavg_app.py")
    doc = {"build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
           "project": {"name": "fedavg-baseline", "version": "1.0.0", "license": "Apache-2.0",
                       "description": "Flower FedAvg on a Sluice job's data", "dependencies": []},
           "tool": {"flwr": {"app": {"publisher": "bench", "components": {
               "serverapp": "flower_fedavg_app:server_app", "clientapp": "flower_fedavg_app:client_app"},
               "config": {"sluice-job": "{}", "out-file": "", "rounds": 1}}}}}
    (app / "pyproject.toml").write_text(tomli_w.dumps(doc))
    out_file = work / "fedavg.json"
    (work / "fedavg-run.toml").write_text(tomli_w.dumps({"sluice-job": json.dumps(job.dump()),
                                                         "out-file": str(out_file), "rounds": rounds}))
    res = subprocess.run([_bin("flwr"), "run", str(app), "sluice", "--run-config", str(work / "fedavg-run.toml"),
                          "--format", "json"], capture_output=True, text=True, env=flower_env(dep.home), timeout=120)
    run_id = int(json.loads(res.stdout[res.stdout.index("{"):])["run-id"])
    _wait(Path(str(out_file) + ".done"), 60 + 60 * rounds)
    st = _final_status(dep, run_id)
    rows = json.loads(out_file.read_text())
    rows = [r for r in rows if r["round"] >= 1]
    times = [r["time"] for r in rows]
    secs = [b - a for a, b in zip(times, times[1:], strict=False)]
    d = 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10
    traffic = st.get("network-traffic", {})
    compute = st.get("compute-time", {})
    return {
        "rounds": len(rows), "seconds_per_round_median": statistics.median(secs), "seconds_per_round": secs,
        "payload_bytes_up_per_round": 4 * 4 * d, "payload_bytes_down_per_round": 4 * 4 * d,
        "superlink_in_bytes_per_round": traffic.get("inbound-bytes", 0) / len(rows),
        "superlink_out_bytes_per_round": traffic.get("outbound-bytes", 0) / len(rows),
        "clientapp_seconds_per_message": compute.get("clientapp-seconds", 0.0) / (4 * len(rows)),
        "final_accuracy": rows[-1]["test_accuracy"],
    }


def simulator(rounds: int) -> dict:
    from sluice.hfl import HFLEngine

    job = load_job("hfl", None, [*OVERRIDES, f"train.rounds={rounds}"])
    eng = HFLEngine(job.config)
    secs, ev = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        ev = eng.iterate()
        secs.append(time.perf_counter() - t0)
    return {"seconds_per_round_median": statistics.median(secs), "final_accuracy": ev.metrics["test_accuracy"]}


def clientapp_import_seconds(repeats: int = 3) -> float:
    code = ("import torch, sluice.runtimes.flower.app, sluice.hfl.client, sluice.data;"
            "from sluice.runtimes.jobs import load_job; from sluice.data import load_federated;"
            "load_federated(load_job('hfl', None, ['data.num_clients=4']).config.data, seed=0)")
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    R = args.rounds
    res: dict = {"rounds": R, "scenario": "default sluice run job, " + ", ".join(OVERRIDES) + "; 4 SuperNodes, TLS",
                 "flower": "1.41.0", "load_avg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="sluice-bench-flower-") as tmp:
        work = Path(tmp)
        with LocalDeployment(work / "dep", nodes=4) as dep:
            res["sluice_on_flower"] = sluice_on_flower(dep, work, R, "sluice")
            res["fedavg_on_flower"] = fedavg_on_flower(dep, work, R)
            res["sluice_on_flower_pull_3s"] = sluice_on_flower(dep, work, max(3, R // 2), "sluice-pull3", 3.0)
        os.environ["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = "0.2"
        try:
            with LocalDeployment(work / "dep-poll02", nodes=4) as dep:
                res["sluice_on_flower_superexec_0.2s"] = sluice_on_flower(dep, work, max(3, R // 2), "sluice-poll02")
        finally:
            del os.environ["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"]
    res["simulator"] = simulator(R)
    res["clientapp_import_seconds"] = clientapp_import_seconds()
    res["load_avg_end"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "flower_runtime.json").write_text(json.dumps(res, indent=2))
    (RESULTS / "flower_runtime.md").write_text(render(res))
    print(render(res))


def render(r: dict) -> str:
    s, f, sim = r["sluice_on_flower"], r["fedavg_on_flower"], r["simulator"]
    p, q = r["sluice_on_flower_superexec_0.2s"], r["sluice_on_flower_pull_3s"]
    lines = [
        "# Sluice on Flower vs Flower's FedAvg (bench/flower_runtime.py)",
        "",
        f"Scenario: {r['scenario']}; Flower {r['flower']}; {r['rounds']} rounds; 127.0.0.1, 2-core machine "
        f"(load average {r['load_avg_start'][0]:.1f} at start, {r['load_avg_end'][0]:.1f} at end).",
        "",
        "| | s/round (median) | bytes up/round | bytes down/round | SuperLink in/round | SuperLink out/round "
        "| final accuracy |",
        "|---|---|---|---|---|---|---|",
        f"| Sluice on Flower (Sluice payload) | {s['seconds_per_round_median']:.2f} | "
        f"{s['sluice_bytes_up_per_round']:.0f} | {s['sluice_bytes_down_per_round']:.0f} | "
        f"{s['superlink_in_bytes_per_round']:.0f} | {s['superlink_out_bytes_per_round']:.0f} | "
        f"{s['final_accuracy']:.4f} |",
        f"| Sluice on Flower (Flower objects carrying it) | | {s['flower_object_bytes_up_per_round']:.0f} | "
        f"{s['flower_object_bytes_down_per_round']:.0f} | | | |",
        f"| Flower FedAvg (dense fp32) | {f['seconds_per_round_median']:.2f} | {f['payload_bytes_up_per_round']} | "
        f"{f['payload_bytes_down_per_round']} | {f['superlink_in_bytes_per_round']:.0f} | "
        f"{f['superlink_out_bytes_per_round']:.0f} | {f['final_accuracy']:.4f} |",
        f"| Sluice simulator (in process, same job) | {sim['seconds_per_round_median']:.3f} | | | | | "
        f"{sim['final_accuracy']:.4f} |",
        "",
        "SuperLink in/out: Flower's per-run traffic counter (`flwr ls`, protobuf sizes of Fleet requests and "
        "responses) divided by the rounds; for Sluice it includes the one hello message per node.",
        "",
        "Where a round's time goes:",
        "",
        f"* compute: the simulator runs the same round in {sim['seconds_per_round_median']:.3f} s;",
        f"* each message starts a `flwr-clientapp` process: Flower's ClientApp compute time is "
        f"{s['clientapp_seconds_per_message']:.2f} s per message for Sluice and "
        f"{f['clientapp_seconds_per_message']:.2f} s for FedAvg; importing torch + Sluice and loading the "
        f"data in a fresh process alone takes {r['clientapp_import_seconds']:.2f} s;",
        "* an idle SuperNode sleeps 3 s between pulls (hard-coded in Flower 1.41): up to 3 s before a "
        "node sees its message;",
        f"* the SuperExec polls for tasks every 1 s (Flower's default, kept): with "
        f"`FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.2` Sluice on Flower took {p['seconds_per_round_median']:.2f} s "
        f"per round (median of {p['rounds']}, a fresh deployment) against {s['seconds_per_round_median']:.2f} s;",
        f"* the server pulls replies every 0.05 s (its own loop); pulling every 3 s as "
        f"`Grid.send_and_receive` does took {q['seconds_per_round_median']:.2f} s per round "
        f"(median of {q['rounds']}, same deployment).",
        "",
        f"Per-round seconds, Sluice on Flower: {', '.join(f'{x:.2f}' for x in s['seconds_per_round'])}; "
        f"FedAvg: {', '.join(f'{x:.2f}' for x in f['seconds_per_round'])}.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
