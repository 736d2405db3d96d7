"""Local training of ``mnist_cnn`` on a CUDA GPU against the CPU: one client update and one round.

One client update is McMahan et al.'s setting (the client's images, batch 10, 5 epochs) through
:meth:`sluice.hfl.learner.Learner.fit`, timed after a warm-up on each device (the CPU with 2 threads, as the
anchor measured: 0.26 s), the data of a tensor dataset kept on the device and the default SGD fused there.
A round is :meth:`sluice.hfl.HFLEngine.iterate` with 10 clients (compression, aggregation and evaluation
included). Writes ``bench/results/gpu.md`` and ``gpu.json``; needs a machine where torch sees a CUDA GPU.

    python bench/gpu.py [--repeats 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from sluice.config import load_config
from sluice.hfl import HFLEngine
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.tasks import client_datasets, load_task

RESULTS = Path(__file__).parent / "results"
SETS = ["task.name=mnist_cnn", "train.participation=0.1", "train.local_epochs=5", "train.batch_size=10",
        "train.lr=0.05"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def client_update(device: str, repeats: int) -> float:
    """Mean seconds of one client update on ``device`` (after two warm-up updates)."""
    cfg = load_config(None, [*SETS, f"train.device={device}"], HFLConfig)
    task = load_task(cfg.task, seed=0, data=cfg.data)
    learner = Learner(task, 0, device)
    data = learner.check(client_datasets(task, cfg.data, seed=0)[:1])[0]
    times = []
    for i in range(repeats + 2):
        _sync(learner.device)
        t0 = time.perf_counter()
        learner.fit(learner.theta0, None, data, epochs=5, batch_size=10, lr=0.05, seed=i)
        _sync(learner.device)
        times.append(time.perf_counter() - t0)
    return sum(times[2:]) / repeats


def round_seconds(device: str, rounds: int) -> float:
    """Mean seconds of a round (10 clients) of the HFL simulator on ``device`` (after one warm-up round)."""
    engine = HFLEngine(load_config(None, [*SETS, f"train.device={device}"], HFLConfig))
    engine.iterate()
    t0 = time.perf_counter()
    for _ in range(rounds):
        engine.iterate()
    return (time.perf_counter() - t0) / rounds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS / "gpu")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU; torch sees none", file=sys.stderr)
        return 2
    torch.set_num_threads(2)
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "client_update_s": {d: client_update(d, args.repeats) for d in ("cpu", "cuda")},
           "round_s": {d: round_seconds(d, args.rounds) for d in ("cpu", "cuda")}}
    res["client_speedup"] = res["client_update_s"]["cpu"] / res["client_update_s"]["cuda"]
    res["round_speedup"] = res["round_s"]["cpu"] / res["round_s"]["cuda"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(res, indent=2), encoding="utf-8")
    lines = [f"# mnist_cnn local training: CUDA against CPU ({res['gpu']}, torch {res['torch']})", "",
             "Command: `python bench/gpu.py`", "", "| measure | cpu (2 threads) | cuda | speed-up |",
             "|---|---|---|---|"]
    for key, name in (("client_update_s", "one client update (batch 10, 5 epochs)"), ("round_s", "one round")):
        cpu, gpu = res[key]["cpu"], res[key]["cuda"]
        lines.append(f"| {name} | {cpu:.3f} s | {gpu:.3f} s | {cpu / gpu:.1f}× |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
