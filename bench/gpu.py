"""``mnist_cnn`` on a CUDA GPU against the CPU: one client update, and a round split into its parts.

One client update is McMahan et al.'s setting (a client's 50 images, batch 10, 5 epochs) through
:meth:`sluice.hfl.learner.Learner.fit`, timed after two warm-up updates: on the CPU with 2 threads, on the GPU
eagerly (``Learner.cuda_graphs = False``) and with the step captured as a CUDA graph (the default). A round is
:meth:`sluice.hfl.HFLEngine.iterate` with Sluice's defaults and 10 of 100 clients, timed after one warm-up
round, split as ``bench/hfl_cnn.py`` splits it (local training, upload encoding, decoding, server step,
evaluation); on the GPU the update, the compressors and the aggregation run there. Writes
``bench/results/gpu.{md,json}``; needs a machine where torch sees a CUDA GPU.

    python bench/gpu.py [--repeats 20] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

import hfl_cnn  # noqa: E402
from sluice.config import load_config  # noqa: E402
from sluice.hfl import Client, HFLEngine, Server  # noqa: E402
from sluice.hfl.config import HFLConfig  # noqa: E402
from sluice.hfl.learner import Learner  # noqa: E402
from sluice.tasks import client_datasets, load_task  # noqa: E402

RESULTS = Path(__file__).parent / "results"
SETS = [*hfl_cnn.WORKLOAD, "train.lr=0.05"]
PARTS = {"local": "local training", "up_encode": "upload encoding", "decode": "decoding (up + down)",
         "down_encode": "downlink encoding", "server": "server step", "evaluate": "evaluation", "round": "round"}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def client_update(device: str, repeats: int, graphs: bool = True) -> float:
    """Mean seconds of one client update on ``device`` (after two warm-up updates)."""
    cfg = load_config(None, [*SETS, f"train.device={device}"], HFLConfig)
    task = load_task(cfg.task, seed=0, data=cfg.data)
    learner = Learner(task, 0, device)
    learner.cuda_graphs = graphs
    data = learner.check(client_datasets(task, cfg.data, seed=0)[:1])[0]
    times = []
    for i in range(repeats + 2):
        _sync()
        t0 = time.perf_counter()
        learner.fit(learner.theta0, None, data, epochs=5, batch_size=10, lr=0.05, seed=i, on_device=True)
        _sync()
        times.append(time.perf_counter() - t0)
    return sum(times[2:]) / repeats


def round_parts(device: str, rounds: int) -> dict[str, float]:
    """Mean seconds per round of each part (:data:`PARTS`) and the final test accuracy, after a warm-up round."""
    cfg = load_config(None, [*SETS, f"train.device={device}", "seed=0"], HFLConfig)

    class TimedEngine(HFLEngine):
        def _evaluate(self):
            return hfl_cnn._timed("evaluate", super()._evaluate)

    engine = TimedEngine(cfg, server_cls=hfl_cnn.timed(hfl_cnn.TimedServer, Server),
                         client_cls=hfl_cnn.timed(hfl_cnn.TimedClient, Client))
    engine.iterate()
    hfl_cnn.TIMES.clear()
    _sync()
    t0 = time.perf_counter()
    for _ in range(rounds):
        ev = engine.iterate()
    _sync()
    parts = hfl_cnn._per_round(hfl_cnn.TIMES, time.perf_counter() - t0, rounds)
    parts["decode"] = parts["up_decode"] + parts["down_decode"]
    return {**{k: parts[k] for k in PARTS}, "accuracy": ev.metrics["test_accuracy"], "rounds": rounds + 1}


def write(res: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=2), encoding="utf-8")
    cu, ro = res["client_update_s"], res["round_s"]
    lines = [f"# mnist_cnn on a CUDA GPU against the CPU ({res['gpu']}, torch {res['torch']})", "",
             f"Command: `python bench/gpu.py --repeats {res['repeats']} --rounds {res['rounds']}`. A client update "
             "on the CPU runs torch with 2 threads; the simulator's rounds run it with one, as `sluice run` does.",
             "", "## One client update (50 images, batch 10, 5 epochs)", "",
             "| where | seconds | speed-up over the CPU |", "|---|---|---|"]
    for key, name in (("cpu", "CPU, 2 threads"), ("cuda_eager", "GPU, eager steps"),
                      ("cuda", "GPU, step captured as a CUDA graph (default)")):
        lines.append(f"| {name} | {cu[key]:.4f} | {cu['cpu'] / cu[key]:.1f}× |")
    lines += ["", f"## A round of Sluice's defaults (10 of 100 clients; mean of {res['rounds']} rounds after one "
              "warm-up)", "", "| part | CPU (s) | GPU (s) | speed-up |", "|---|---|---|---|"]
    for key, name in PARTS.items():
        cpu, gpu = ro["cpu"][key], ro["cuda"][key]
        lines.append(f"| {name} | {cpu:.4f} | {gpu:.4f} | {cpu / gpu:.1f}× |" if gpu > 0 else
                     f"| {name} | {cpu:.4f} | {gpu:.4f} | |")
    lines += ["", f"Test accuracy after {ro['cpu']['rounds']} rounds: CPU {ro['cpu']['accuracy']:.4f}, "
              f"GPU {ro['cuda']['accuracy']:.4f} (same seed; the GPU's keep draws and floating point differ)."]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", type=Path, default=RESULTS / "gpu")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA GPU; torch sees none", file=sys.stderr)
        return 2
    torch.set_num_threads(2)
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "machine": platform.platform(),
           "repeats": args.repeats, "rounds": args.rounds,
           "client_update_s": {"cpu": client_update("cpu", args.repeats),
                               "cuda_eager": client_update("cuda", args.repeats, graphs=False),
                               "cuda": client_update("cuda", args.repeats)}}
    print(res["client_update_s"], flush=True)
    torch.set_num_threads(1)  # as the simulator runs
    res["round_s"] = {d: round_parts(d, args.rounds) for d in ("cuda", "cpu")}
    res["client_speedup"] = res["client_update_s"]["cpu"] / res["client_update_s"]["cuda"]
    res["round_speedup"] = res["round_s"]["cpu"]["round"] / res["round_s"]["cuda"]["round"]
    write(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
