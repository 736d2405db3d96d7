"""Benchmark: cost of the control plane on the default ``sluice run``, and how good its ETA is.

1. **Monitoring overhead.** The default run (digits, 20 terminals, 150 rounds) is driven by
   :class:`sluice.control.TrainingProcess` with every kind of criterion watched (performance target,
   plateau, CPU / memory / storage / network thresholds, divergence bound) but none firing before the
   round limit. Per round, the time the process spends outside ``engine.iterate()`` and outside the
   caller's ``on_event`` callback is the control overhead; it is reported against the round time.
   An A/B wall-clock comparison against a bare ``for`` loop is reported too (noisier: shared cores).
2. **ETA accuracy.** The default run with a target accuracy: the process records its estimate of the
   remaining rounds and seconds after every round; once the target fires at round N, the estimates made
   at 25 %, 50 % and 75 % of N are compared with the truth (N − n rounds, and the seconds actually spent).

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
from sluice.control import ModelIdentity, ResourceSampler, TrainingProcess
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
    """Control time per round = loop time − iterate() time − callback time, measured per round."""
    cfg = load_config(None, [f"train.rounds={rounds}"], HFLConfig)
    eng = Timed(HFLEngine(cfg))
    eng.start()
    callback_s: list[float] = []

    def on_event(ev: IterationEvent, proc: TrainingProcess) -> None:
        t0 = time.perf_counter()
        callback_s.append(time.perf_counter() - t0)

    proc = TrainingProcess(eng, {"iterations": rounds, **WATCH_ALL}, model=ModelIdentity(id="bench"),
                           on_event=on_event, sampler=ResourceSampler())
    t0 = time.perf_counter()
    report = proc.run()
    wall = time.perf_counter() - t0
    assert report.fired == "iterations" and report.iterations == rounds, report.fired
    loop_s = wall
    ctrl_total = loop_s - sum(eng.iterate_s) - sum(callback_s)
    t1 = time.perf_counter()
    for _ in range(20):
        proc.estimate()
    eta_ms = (time.perf_counter() - t1) / 20 * 1e3
    return {
        "rounds": rounds,
        "mean_round_ms": 1e3 * statistics.fmean(eng.iterate_s),
        "control_ms_per_round": 1e3 * ctrl_total / rounds,
        "control_percent_of_round": 100 * ctrl_total / sum(eng.iterate_s),
        "includes": "start/stop, monitor, resource sampling, ETA bookkeeping, report",
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
        TrainingProcess(eng, {"iterations": rounds, **WATCH_ALL}, sampler=ResourceSampler()).run()
        ctrl.append(time.perf_counter() - t0)
    b, c = statistics.median(bare), statistics.median(ctrl)
    return {"repeats": repeats, "bare_s": bare, "controlled_s": ctrl, "median_bare_s": b,
            "median_controlled_s": c, "difference_percent": 100 * (c - b) / b}


def eta_accuracy(target: float, rounds: int) -> dict[str, Any]:
    cfg = load_config(None, [f"train.rounds={rounds}"], HFLConfig)
    est: dict[int, tuple[int | None, float | None, str]] = {}
    elapsed: dict[int, float] = {}

    def on_event(ev: IterationEvent, proc: TrainingProcess) -> None:
        e = proc.estimate()
        est[proc.n] = (e.remaining_iterations, e.remaining_s, e.note)
        elapsed[proc.n] = proc.elapsed_s

    rep = TrainingProcess(HFLEngine(cfg), {"iterations": rounds, "performance": {"accuracy": target}},
                          on_event=on_event).run()
    n_total, t_total = rep.iterations, rep.duration_s
    out: dict[str, Any] = {"target": target, "fired": rep.fired, "rounds_to_target": n_total,
                           "seconds_to_target": t_total, "at": []}
    if rep.fired != "performance.test_accuracy":
        out["note"] = f"target not reached in {rounds} rounds"
        return out
    for frac in (0.25, 0.5, 0.75):
        n = max(1, round(frac * n_total))
        rem_i, rem_s, note = est[n]
        true_i, true_s = n_total - n, t_total - elapsed[n]
        out["at"].append({
            "fraction": frac, "round": n, "true_remaining_rounds": true_i,
            "estimated_remaining_rounds": rem_i,
            "rounds_error_percent": None if rem_i is None else 100 * (rem_i - true_i) / true_i,
            "true_remaining_s": true_s, "estimated_remaining_s": rem_s,
            "seconds_error_percent": None if rem_s is None else 100 * (rem_s - true_s) / true_s,
            "note": note,
        })
    return out


def _fmt(v: float | None, spec: str = ".0f", suffix: str = "") -> str:
    return "null" if v is None else f"{v:{spec}}{suffix}"


def markdown(res: dict[str, Any]) -> str:
    o, a = res["overhead"], res["ab"]
    lines = [
        "# Control-plane overhead and ETA accuracy",
        "",
        f"Machine: {res['machine']}. Command: `{res['command']}`.",
        "",
        "## Monitoring overhead on the default `sluice run`",
        "",
        f"Default config, {o['rounds']} rounds, every kind of criterion watched (none firing early).",
        "",
        "| mean round | control per round | control / round time | one ETA estimate (fit on all rounds) |",
        "|---|---|---|---|",
        f"| {o['mean_round_ms']:.2f} ms | {o['control_ms_per_round']:.3f} ms | "
        f"**{o['control_percent_of_round']:.2f} %** | {o['eta_estimate_ms_at_end']:.2f} ms |",
        "",
        f"A/B wall clock, bare loop vs training process, median of {a['repeats']}: "
        f"{a['median_bare_s']:.2f} s vs {a['median_controlled_s']:.2f} s "
        f"({a['difference_percent']:+.2f} %; this difference is dominated by noise on shared cores).",
        "",
        "## ETA accuracy on the default run with a target accuracy",
        "",
        "Error = (estimated − true) / true remaining, for estimates made at 25 / 50 / 75 % of the rounds the "
        "run needed to reach the target.",
        "",
        "| target | rounds to target | at | est. rounds | true rounds | error | est. s | true s | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for e in res["eta"]:
        if not e["at"]:
            lines.append(f"| {e['target']} | not reached | | | | | | | |")
            continue
        for p in e["at"]:
            at = f"{int(p['fraction'] * 100)} % (round {p['round']})"
            cells = [
                str(e["target"]), str(e["rounds_to_target"]), at, _fmt(p["estimated_remaining_rounds"], "d"),
                str(p["true_remaining_rounds"]), _fmt(p["rounds_error_percent"], "+.0f", " %"),
                _fmt(p["estimated_remaining_s"], ".2f"), f"{p['true_remaining_s']:.2f}",
                _fmt(p["seconds_error_percent"], "+.0f", " %"),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Notes on the estimates (fitted curve at each point):", ""]
    for e in res["eta"]:
        for p in e["at"]:
            lines.append(f"- target {e['target']}, round {p['round']}: {p['note']}")
    lines += ["", res["discussion"], ""]
    return "\n".join(lines)


DISCUSSION = (
    "Reading the ETA numbers: the estimator extrapolates a power law y = c + a·n^(−α) (asymptote kept in "
    "the metric's range, so c ≤ 1 for accuracy) fitted from the steepest part of the curve on, and gives "
    "null with a reason when the fit explains under half of the variance or the target is beyond the "
    "asymptote. On the default run the test accuracy stays near chance for about ten rounds, rises "
    "steeply, then creeps along a plateau around 0.93–0.95 with round-to-round noise of about ±0.015. "
    "Early (25 %) points see only the flat start, so the answer is null; later, the round at which a noisy "
    "accuracy first touches a target near its plateau is set by the noise more than by the trend, and the "
    "smooth-curve estimate is late (positive errors). The estimator is accurate where its model holds "
    "(tests: within 15 % on synthetic power-law curves from 30 % of the way); on this run read it as the "
    "order of magnitude. A target with `patience` > 1 makes the stopping round less noise-driven (the "
    "estimate then adds patience − 1 rounds)."
)


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
    res["eta"] = [eta_accuracy(t, 150) for t in ((0.9,) if args.quick else (0.9, 0.93, 0.95))]
    res["discussion"] = DISCUSSION
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "control_overhead_quick" if args.quick else "control_overhead"
    (out / f"{stem}.json").write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    (out / f"{stem}.md").write_text(markdown(res), encoding="utf-8")
    print(markdown(res))


if __name__ == "__main__":
    main()
