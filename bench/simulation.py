"""Simulating many clients a round: the HFL simulator one client at a time against the clients trained together.

For every task (the default one, ``digits`` with the default MLP; ``mnist_cnn``, McMahan et al.'s CNN on the
embedded MNIST images), number of clients N (every client in every round: ``train.participation = 1``), mode
(``train.batched_clients`` false: one by one; true: together) and device (the CPU; a CUDA GPU when torch sees
one), one process builds the simulator with Sluice's defaults otherwise, runs one warm-up round and then the
timed rounds, and reports: seconds a round (mean of the timed rounds), the process's peak resident memory
(``ru_maxrss``) and on a GPU its peak allocated device memory, the clients' state in memory (every array and
tensor a client object holds: the model it holds, anchors and velocities, the compressor's residual), the
bytes up and down of every round (``len()`` of every encoded message) and the test accuracy of every round,
and what a round's seconds are made of (local training, the downlink messages, the clients' sync, the upload
encoding, the server's decoding, the rest). The two modes of a setting are then compared round by round: the
same bytes, the same accuracy. With ``--flower-clients``, the same work also runs on Flower's Simulation Engine
(``sluice run --runtime flower-sim``: the Sluice ServerApp and ClientApp as Ray actors, ``--ray-cpus`` CPUs), whose
seconds a round are the engine's own per-round seconds from the run's metrics lines (the warm-up round left out),
compared round by round with the simulator's bytes and accuracy. ``--variants dense`` runs dense FedAvg (dense
uploads, dense server step, dense downlink) beside Sluice's compression.

    .venv/bin/python bench/simulation.py                                   # default: about 6 min on 2 cores
    .venv/bin/python bench/simulation.py --clients 10,100 --tasks default  # a part
    .venv/bin/python bench/simulation.py --rounds 10 --cnn-rounds 3        # more rounds
    .venv/bin/python bench/simulation.py --tasks default --flower-clients 10,100 --variants sluice,dense

``mnist_cnn`` runs at 10 and 100 clients unless ``--cnn-clients`` says otherwise (its clients' state is about
20 MB each). Results go to ``bench/results/simulation.{md,json}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).parent / "results"
TASKS = {"default": {}, "mnist_cnn": {"task": {"name": "mnist_cnn"}}}
MODES = {"one by one": False, "together": True}
VARIANTS = {"sluice": {}, "dense": {"compression": {"up": "dense", "down": "dense", "downlink": "dense"}}}
"""The compression of a setting: Sluice's defaults, or dense FedAvg."""
FLOWER = "flower-sim"
SHARED = ("learner", "cfg", "theta0", "uplink")
"""Client attributes shared by all clients (or holding no per-client array), left out of the client state."""


def state_bytes(obj: object, seen: set[int] | None = None) -> int:
    """Bytes of the arrays and tensors ``obj`` holds (its attributes, walked through tuples, lists and dicts),
    each counted once; the learner, the configuration and θ_0 (shared by all clients) are left out."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, list | tuple):
        return sum(state_bytes(v, seen) for v in obj)
    if isinstance(obj, dict):
        return sum(state_bytes(v, seen) for v in obj.values())
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return sum(state_bytes(v, seen) for k, v in vars(obj).items() if k not in SHARED)
    return 0


def job_of(task: str, clients: int, variant: str) -> dict:
    """The job of a setting (the train section's participation 1; device and mode are added by the runner)."""
    return {**TASKS[task], **VARIANTS[variant], "data": {"num_clients": clients}, "train": {"participation": 1.0}}


def run_one(task: str, clients: int, mode: str, device: str, rounds: int, variant: str = "sluice") -> dict:
    """One setting in this process (see the module docstring)."""
    from sluice.hfl import HFLEngine
    from sluice.hfl.config import HFLConfig

    job = job_of(task, clients, variant)
    job["train"].update(device=device, batched_clients=MODES[mode])
    cfg = HFLConfig.model_validate(job)
    from sluice.hfl.batched import BatchedFit
    from sluice.hfl.client import Client
    from sluice.hfl.learner import Learner
    from sluice.hfl.server import Server

    training = _time_calls(Learner, "fit") + _time_calls(BatchedFit, "fit")
    parts = {"messages": _time_calls(Server, "message") + _time_calls(Server, "messages"),
             "sync": _time_calls(Client, "sync"), "upload encoding": _time_calls(Client, "upload"),
             "server decoding": _time_calls(Server, "receive")}
    engine = HFLEngine(cfg)
    t0 = time.perf_counter()
    engine.start()
    start = time.perf_counter() - t0
    events = [engine.iterate()]
    if device != "cpu":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for t in training + [t for ts in parts.values() for t in ts]:
        t[0] = 0.0
    t0 = time.perf_counter()
    events += [engine.iterate() for _ in range(rounds)]
    seconds = (time.perf_counter() - t0) / rounds
    out = {"task": task, "clients": clients, "mode": mode, "device": device, "rounds": rounds,
           "start_seconds": start, "seconds_per_round": seconds,
           "training_seconds_per_round": sum(t[0] for t in training) / rounds,
           "parts_seconds_per_round": {k: sum(t[0] for t in ts) / rounds for k, ts in parts.items()},
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "client_state_bytes": sum(state_bytes(c) for c in engine.clients),
           "d": engine.num_params, "samples": engine.num_samples,
           "bytes_up": [e.bytes_up for e in events], "bytes_down": [e.bytes_down for e in events],
           "accuracy": [e.metrics.get("test_accuracy") for e in events],
           "train_loss": [e.metrics.get("train_loss") for e in events], "notes": engine.notes()}
    if device != "cpu":
        out["peak_device_bytes"] = torch.cuda.max_memory_allocated()
    return out


def _settings(section: str, value: object) -> list[str]:
    """``--set`` pairs for a job's (nested) section."""
    if isinstance(value, dict):
        return [kv for k, v in value.items() for kv in _settings(f"{section}.{k}" if section else k, v)]
    return [f"{section}={json.dumps(value)}"]


def run_flower(task: str, clients: int, rounds: int, variant: str, cpus: int, timeout: float) -> dict:
    """One setting on Flower's Simulation Engine: ``sluice run --runtime flower-sim`` in a fresh process tree."""
    import tempfile

    from sluice.runtimes.flower.failure import records_of

    setting = {"task": task, "clients": clients, "mode": FLOWER, "device": "cpu", "rounds": rounds, "variant": variant}
    job = job_of(task, clients, variant)
    job["train"]["rounds"] = rounds + 1
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = [sys.executable, "-m", "sluice", "run", "--runtime", FLOWER, "--ray-cpus", str(cpus),
                "--round-timeout", str(int(timeout)), "--node-wait", str(int(timeout)), "--out", str(out)]
        argv += [x for kv in _settings("", job) for x in ("--set", kv)]
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop_tree(proc)
            return {**setting, "error": f"took more than {timeout:.0f} s"}
        done = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
        wall = time.perf_counter() - t0
        rows = records_of(out)
        if done.returncode != 0 or len(rows) != rounds + 1:
            report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else {}
            why = f"{report.get('cause', '')}: {report.get('detail', '')}" if report else (
                done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            return {**setting, "error": f"{len(rows)} of {rounds + 1} rounds; {why}"}
    seconds = sum(r["seconds"] for r in rows[1:]) / rounds
    return {**setting, "seconds_per_round": seconds, "start_seconds": wall - sum(r["seconds"] for r in rows),
            "bytes_up": [r["bytes_up"] for r in rows], "bytes_down": [r["bytes_down"] for r in rows],
            "accuracy": [r.get("test_accuracy") for r in rows], "train_loss": [r.get("train_loss") for r in rows]}


def _stop_tree(proc: subprocess.Popen) -> None:
    """Stop a run that took too long and every process it started: its process group (the CLI stops its
    deployment on SIGTERM), then its descendants as they were when it was stopped (Ray starts some in sessions
    of their own)."""
    import signal

    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.kill()


def _time_calls(cls: type, name: str) -> list[list[float]]:
    """Wrap ``cls.name`` so that the seconds spent in it add up in the returned one-element list (in a list)."""
    spent = [0.0]
    real = getattr(cls, name)

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    setattr(cls, name, timed)
    return [spent]


def _child(setting: dict, timeout: float) -> dict:
    """:func:`run_one` in a fresh process (its own peak memory); a failure is reported, not raised."""
    cmd = [sys.executable, __file__, "--one", json.dumps(setting)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {**setting, "error": f"took more than {timeout:.0f} s"}
    if done.returncode != 0:
        return {**setting, "error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def same_work(one: dict, other: dict) -> dict:
    """Whether two runs of a setting gave the same bytes and accuracy, round by round."""
    rounds = min(len(one["bytes_up"]), len(other["bytes_up"]))
    same_bytes = sum(one["bytes_up"][i] == other["bytes_up"][i] and one["bytes_down"][i] == other["bytes_down"][i]
                     for i in range(rounds))
    acc = [abs(a - b) for a, b in zip(one["accuracy"][:rounds], other["accuracy"][:rounds], strict=True)]
    loss = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(one["train_loss"][:rounds], other["train_loss"][:rounds],
                                                             strict=True)]
    return {"rounds_compared": rounds, "rounds_same_bytes": same_bytes, "max_accuracy_diff": max(acc),
            "max_train_loss_rel_diff": max(loss)}


def compare(one: dict, together: dict) -> dict:
    """The two modes of one setting side by side: speed-up and whether bytes and accuracy match round by round."""
    if "error" in one or "error" in together:
        return {}
    return {"speedup": one["seconds_per_round"] / together["seconds_per_round"],
            "training_speedup": one["training_seconds_per_round"] / max(together["training_seconds_per_round"], 1e-9),
            **same_work(one, together)}


def against_flower(runs: dict) -> dict:
    """Flower's Simulation Engine against the simulator's faster mode on the same setting."""
    flower, sluice = runs.get(FLOWER), [r for m, r in runs.items() if m in MODES and "error" not in r]
    if flower is None or "error" in flower or not sluice:
        return {}
    best = min(r["seconds_per_round"] for r in sluice)
    return {"flower": {"speedup": flower["seconds_per_round"] / best, **same_work(runs["one by one"], flower)}}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="default,mnist_cnn")
    p.add_argument("--clients", default="10,100,1000", help="clients of the default task")
    p.add_argument("--cnn-clients", default="10,100", help="clients of mnist_cnn")
    p.add_argument("--rounds", type=int, default=2, help="timed rounds of the default task (after one warm-up)")
    p.add_argument("--cnn-rounds", type=int, default=1, help="timed rounds of mnist_cnn (after one warm-up)")
    p.add_argument("--devices", default="auto", help="cpu, cuda, or auto: the CPU and a CUDA GPU when there is one")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one setting may take")
    p.add_argument("--variants", default="sluice", help="compression: sluice (its defaults), dense (dense FedAvg)")
    p.add_argument("--flower-clients", default="", help="clients at which Flower's Simulation Engine runs the same "
                   "work (CPU only; needs sluice[flower])")
    p.add_argument("--ray-cpus", type=int, default=_cpus(), help="CPUs Ray gives Flower's Simulation Engine")
    p.add_argument("--out", type=Path, default=RESULTS / "simulation")
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(run_one(**json.loads(a.one))))
        return {}
    devices = ["cpu", "cuda"] if a.devices == "auto" and torch.cuda.is_available() else (
        ["cpu"] if a.devices == "auto" else a.devices.split(","))
    flower_at = {int(c) for c in a.flower_clients.split(",") if c}
    rows = []
    for task in a.tasks.split(","):
        counts = a.cnn_clients if task == "mnist_cnn" else a.clients
        rounds = a.cnn_rounds if task == "mnist_cnn" else a.rounds
        for device, variant in ((d, v) for d in devices for v in a.variants.split(",")):
            for n in (int(c) for c in counts.split(",") if c):
                setting = {"task": task, "clients": n, "device": device, "rounds": rounds, "variant": variant}
                runs = {m: _child({**setting, "mode": m}, a.timeout) for m in MODES}
                if device == "cpu" and n in flower_at:
                    runs[FLOWER] = run_flower(task, n, rounds, variant, a.ray_cpus, a.timeout)
                for m, r in runs.items():
                    print(f"{task} {variant} {device} {n:>5} clients {m:>10}: "
                          + (r.get("error") or f"{r['seconds_per_round']:.3f} s/round"), flush=True)
                rows.append({**setting, "runs": runs, **compare(runs["one by one"], runs["together"]),
                             **against_flower(runs)})
    res = {"command": "python bench/simulation.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "torch": torch.__version__, "machine": platform.platform(), "cpus": _cpus(), "rows": rows}
    write(res, a.out)
    return res


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _mib(b: float | None) -> str:
    return "–" if b is None else f"{b / 2**20:,.0f}"


def _name(row: dict) -> str:
    """A row's task, with its compression when it is not Sluice's."""
    variant = row.get("variant", "sluice")
    return row["task"] + ("" if variant == "sluice" else f" ({variant} FedAvg)")


def render(res: dict) -> str:
    lines = ["# Simulating many clients a round: one by one against together", "",
             f"Command: `{res['command'].strip()}`. torch {res['torch']}, {res['cpus']} CPUs ({res['machine']}); "
             "the simulator runs torch with one thread. Every client trains in every round (participation 1); "
             "seconds are the mean of the timed rounds after one warm-up round.", "",
             "| task | device | clients | mode | s/round | speed-up | local training s/round | speed-up | "
             "peak RSS (MiB) | peak GPU (MiB) | client state (MiB) | rounds with the same bytes | max accuracy diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in res["rows"]:
        for m, r in ((m, r) for m, r in row["runs"].items() if m in MODES):
            if "error" in r:
                lines.append(f"| {_name(row)} | {row['device']} | {row['clients']} | {m} | {r['error']} "
                             "| | | | | | | | |")
                continue
            mine = m == "together" and "speedup" in row
            lines.append(
                f"| {_name(row)} | {row['device']} | {row['clients']:,} | {m} | {r['seconds_per_round']:.3f} | "
                + (f"{row['speedup']:.2f}×" if mine else "") + f" | {r['training_seconds_per_round']:.3f} | "
                + (f"{row['training_speedup']:.2f}×" if mine else "") + f" | {_mib(r['peak_rss_bytes'])} | "
                f"{_mib(r.get('peak_device_bytes'))} | {_mib(r['client_state_bytes'])} | "
                + (f"{row['rounds_same_bytes']}/{row['rounds_compared']}" if mine else "") + " | "
                + (f"{row['max_accuracy_diff']:.4g}" if mine else "") + " |")
    lines += ["", "Local training: the seconds spent in `Learner.fit` (one by one) or `BatchedFit.fit` (together) "
              "in a round. Rounds compared include the warm-up round. Client state: the arrays and tensors the client "
              "objects hold (each client's model, compressor residual...), not θ_0 or the learner they share."]
    return "\n".join(lines + _flower_table(res) + _parts_table(res)) + "\n"


def _flower_table(res: dict) -> list[str]:
    """The simulator against Flower's Simulation Engine, per setting that ran on both."""
    rows = [row for row in res["rows"] if FLOWER in row["runs"]]
    if not rows:
        return []
    lines = ["", "## The simulator against Flower's Simulation Engine (s/round)", "",
             "| task | clients | Flower | Sluice one by one | Sluice together | Sluice faster | "
             "rounds with the same bytes | max accuracy diff |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        runs, f = row["runs"], row.get("flower")
        cells = [runs[m].get("error") or f"{runs[m]['seconds_per_round']:.3f}" for m in (FLOWER, *MODES)]
        lines.append(f"| {_name(row)} | {row['clients']:,} | " + " | ".join(cells) + " | "
                     + (f"{f['speedup']:.1f}× | {f['rounds_same_bytes']}/{f['rounds_compared']} | "
                        f"{f['max_accuracy_diff']:.4g} |" if f else " | | |"))
    lines += ["", "Flower: `sluice run --runtime flower-sim` (the same ServerApp and ClientApp as a Flower deployment, "
              "clients as Ray actors on the CPUs Ray is given); its seconds are the engine's per-round seconds, "
              "the warm-up round and the start of the SuperLink and Ray left out. Sluice faster: Flower's seconds "
              "a round over the simulator's faster mode. Bytes and accuracy are compared with the simulator one by "
              "one, round by round."]
    return lines


PARTS = ("messages", "sync", "upload encoding", "server decoding")


def _parts_table(res: dict) -> list[str]:
    """What a round's seconds are made of, per setting (the rows that timed them)."""
    timed = [(row, m, r) for row in res["rows"] for m, r in row["runs"].items() if "parts_seconds_per_round" in r]
    if not timed:
        return []
    lines = ["", "## What a round is made of (s/round)", "",
             "| task | device | clients | mode | local training | " + " | ".join(PARTS) + " | the rest |",
             "|---|---|---|---|---|" + "---|" * len(PARTS) + "---|"]
    for row, m, r in timed:
        parts = [r["parts_seconds_per_round"][k] for k in PARTS]
        rest = r["seconds_per_round"] - r["training_seconds_per_round"] - sum(parts)
        lines.append(f"| {_name(row)} | {row['device']} | {row['clients']:,} | {m} | "
                     f"{r['training_seconds_per_round']:.3f} | " + " | ".join(f"{v:.3f}" for v in parts)
                     + f" | {rest:.3f} |")
    lines += ["", "Messages: the server's downlink messages (`Server.message`, or `Server.messages` for the "
              "clients trained together, which encodes each different message once); sync: the clients applying "
              "them; upload encoding: `Client.upload` (each client's compressor and wire encoding); server "
              "decoding: `Server.receive`; the rest: sampling, each client's Δ (together), the server's "
              "aggregation and step, the evaluation. One by one, a client's sync and upload run inside its "
              "`Client.train`."]
    return lines


def write(res: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(res))


if __name__ == "__main__":
    main()
