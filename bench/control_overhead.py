"""Benchmark: cost of the control plane on the default ``sluice run``.

1. **Monitoring overhead.** The default run (digits, 20 terminals, 150 rounds) is driven by
   :class:`sluice.control.TrainingProcess` with every kind of criterion watched (performance target,
   plateau, CPU / memory / storage / network thresholds, divergence bound) but none firing before the
   round limit. Per round, the time the process spends outside ``engine.iterate()`` is the control
   overhead, with a callback that asks for the estimate and the live status as ``sluice run`` does; it is
   reported against the round time.
   The watched target (accuracy 0.9999) is never met, so the remaining-iteration estimate simulates its
   futures throughout (:mod:`sluice.control.eta`). An A/B wall-clock comparison against a bare ``for``
   loop is reported too (noisier: shared cores). How good the estimates are: ``bench/eta.py``.

    .venv/bin/python bench/control_overhead.py             # full (about 1 minute on 2 cores)
    .venv/bin/python bench/control_overhead.py --quick     # 40 rounds, 1 repeat (smoke)

Writes ``bench/results/control_overhead.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from sluice.config import load_config
from sluice.control import ModelIdentity, ProcessHooks, ProcessOptions, ResourceSampler, TrainingProcess
from sluice.engine import IterationEvent
from sluice.hfl import HFLEngine
from sluice.hfl.config import HFLConfig

WATCH_ALL = {
    "performance": {"accuracy": 0.9999},
    "plateau": {"test_loss": {"patience": 10_000}},
    "resources": {"cpu_percent": 100, "memory_percent": 99.9, "storage_bytes": 1e15, "network_bytes": 1e15},
    "divergence": {"train_loss": 1e6},
}


class Timed:
    """Engine wrapper that records the duration of every ``iterate()``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.iterate_s: list[float] = []

    @property
    def metrics(self) -> Any:
        return self.inner.metrics

    @property
    def counts_bytes(self) -> bool:
        return self.inner.counts_bytes

    def start(self) -> None:
        self.inner.start()

    def iterate(self) -> IterationEvent:
        t0 = time.perf_counter()
        ev = self.inner.iterate()
        self.iterate_s.append(time.perf_counter() - t0)
        return ev

    def stop(self) -> None:
        self.inner.stop()

    def suspend(self) -> None:
        self.inner.suspend()

    def resume(self) -> None:
        self.inner.resume()

    def add_data(self, data: Any) -> None:
        self.inner.add_data(data)

    def save(self, path: str) -> str:
        return self.inner.save(path)


def overhead(rounds: int) -> dict[str, Any]:
    """Control time per round = loop time − iterate() time, measured per round; the per-round callback asks
    for the estimate and the live status as ``sluice run`` does (its file writes aside)."""
    cfg = load_config(None, [f"train.rounds={rounds}"], HFLConfig)
    eng = Timed(HFLEngine(cfg))
    eng.start()

    def on_event(ev: IterationEvent, proc: TrainingProcess) -> None:
        proc.estimate_record()
        proc.progress_status()

    proc = TrainingProcess(eng, {"iterations": rounds, **WATCH_ALL}, model=ModelIdentity(id="bench"),
                           hooks=ProcessHooks(on_event=on_event), options=ProcessOptions(sampler=ResourceSampler()))
    t0 = time.perf_counter()
    report = proc.run()
    wall = time.perf_counter() - t0
    assert report.fired == "iterations" and report.iterations == rounds, report.fired
    ctrl_total = wall - sum(eng.iterate_s)
    t1 = time.perf_counter()
    for _ in range(20):
        proc.estimator._target(proc.n)  # one simulation of the futures, as at a refresh
    eta_ms = (time.perf_counter() - t1) / 20 * 1e3
    return {
        "rounds": rounds,
        "mean_round_ms": 1e3 * statistics.fmean(eng.iterate_s),
        "control_ms_per_round": 1e3 * ctrl_total / rounds,
        "control_percent_of_round": 100 * ctrl_total / sum(eng.iterate_s),
        "includes": "start/stop, monitor, resource sampling, the estimate and live status every round, report",
        "eta_estimate_ms_at_end": eta_ms,
    }


def ab(rounds: int, repeats: int) -> dict[str, Any]:
    """Wall time of a bare loop vs the training process on the same seeded run, alternating."""
    cfg = load_config(None, [f"train.rounds={rounds}"], HFLConfig)
    bare, ctrl = [], []
    for _ in range(repeats):
        eng = HFLEngine(cfg)
        eng.start()
        t0 = time.perf_counter()
        for _ in range(rounds):
            eng.iterate()
        bare.append(time.perf_counter() - t0)
        eng = HFLEngine(cfg)
        eng.start()
        t0 = time.perf_counter()
        options = ProcessOptions(sampler=ResourceSampler())
        TrainingProcess(eng, {"iterations": rounds, **WATCH_ALL}, options=options).run()
        ctrl.append(time.perf_counter() - t0)
    b, c = statistics.median(bare), statistics.median(ctrl)
    return {"repeats": repeats, "bare_s": bare, "controlled_s": ctrl, "median_bare_s": b,
            "median_controlled_s": c, "difference_percent": 100 * (c - b) / b}


def markdown(res: dict[str, Any]) -> str:
    o, a = res["overhead"], res["ab"]
    lines = [
        "# Control-plane overhead",
        "",
        f"Machine: {res['machine']}. Command: `{res['command']}`.",
        "",
        "## Monitoring overhead on the default `sluice run`",
        "",
        f"Default config, {o['rounds']} rounds, every kind of criterion watched (none firing early).",
        "",
        "| mean round | control per round | control / round time | one ETA simulation (at the end) |",
        "|---|---|---|---|",
        f"| {o['mean_round_ms']:.2f} ms | {o['control_ms_per_round']:.3f} ms | "
        f"**{o['control_percent_of_round']:.2f} %** | {o['eta_estimate_ms_at_end']:.2f} ms |",
        "",
        f"A/B wall clock, bare loop vs training process, median of {a['repeats']}: "
        f"{a['median_bare_s']:.2f} s vs {a['median_controlled_s']:.2f} s "
        f"({a['difference_percent']:+.2f} %; this difference is dominated by noise on shared cores).",
        "",
        "How good the remaining-iteration estimates are: `bench/results/eta.md`.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    rounds = 40 if args.quick else 150
    repeats = 1 if args.quick else 3
    res: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}",
        "command": "python bench/control_overhead.py" + (" --quick" if args.quick else ""),
    }
    res["overhead"] = overhead(rounds)
    res["ab"] = ab(rounds, repeats)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "control_overhead_quick" if args.quick else "control_overhead"
    (out / f"{stem}.json").write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    (out / f"{stem}.md").write_text(markdown(res), encoding="utf-8")
    print(markdown(res))


if __name__ == "__main__":
    main()
