"""How good are the remaining-iteration estimates? Real runs of many job families, each family held out in turn.

The runs (``bench/eta_traces.py``: 12 families of HFL built-ins, a user task, local and split training and
the generated scenarios' models, 10 seeds each, every run to a fixed budget) are cached in
``bench/results/eta_traces.json.gz``. Each family gets two targets, the metric level held for ``patience``
evaluations that the median seed reaches at 40 % and at 70 % of the budget; a run with a target stops at
the first iteration ``N`` where it fires, and one that never fires within the budget is censored there.

The estimator is fed a run's values as the run fed it. Its calibration (:mod:`sluice.control.eta_calibration`)
is fitted on every other family's runs and scored on the family held out (leave one family out): at
``k`` = 25, 50 and 75 % of the way to ``N`` (the last evaluation at or before ``f·N``; the truth is ``N − k``)
and at every evaluation before ``N``. Scored: median absolute relative error (no point estimate counts as
infinite error), coverage of the 80 % intervals (an interval open above, "more than L", covers when
``L ≤`` truth; an answer without any interval counts as uncovered), the same for the seconds, and the
reliability of the probability of meeting the target within the rest of the budget (every evaluation of
every run, censored ones included). Without history and with it (the other seeds of the same job and target
as past runs of the same shape). Side by side: the rules of ``bench/eta_baselines.py``.

    .venv/bin/python bench/eta.py                  # score the cached traces
    .venv/bin/python bench/eta.py --regenerate     # run the jobs first (bench/eta_traces.py)
    .venv/bin/python bench/eta.py --ship           # also write the calibration fitted on every run

Writes ``bench/results/eta.md`` and ``eta.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import pprint
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

import eta_baselines as base
import eta_traces
from sluice.control.eta import INTERVAL, Estimator, answer
from sluice.control.eta_calibration import Calibration, fit, past_signal

RESULTS = Path(__file__).parent / "results"
DATA_MODULE = Path(__file__).parent.parent / "src" / "sluice" / "control" / "eta_calibration_data.py"
FRACTIONS = (0.25, 0.5, 0.75)
TARGET_AT = (0.4, 0.7)
BINS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
ENSEMBLE_EVERY = 4
"""The learning-curve ensemble (slow: four nonlinear fits) is scored at 25/50/75 % and every 4th evaluation."""


def patience_of(family: str) -> int:
    return 2 if family.startswith("hfl") else 1


def _held(trace: dict) -> np.ndarray:
    """At each evaluation, the level the metric has held for ``patience`` evaluations (higher is better)."""
    sgn = 1.0 if trace["mode"] == "max" else -1.0
    z = sgn * np.array([y for _, y in trace["curve"]])
    p = patience_of(trace["family"])
    return np.array([z[max(0, i - p + 1): i + 1].min() if i + 1 >= p else -np.inf for i in range(z.size)])


def runs_with_targets(traces: list[dict]) -> list[dict]:
    """Each trace with each of its family's targets: threshold, stop ``N`` (None: censored at the budget)."""
    fams: dict[str, list[dict]] = {}
    for t in traces:
        fams.setdefault(t["family"], []).append(t)
    out = []
    for fam, ts in fams.items():
        sgn = 1.0 if ts[0]["mode"] == "max" else -1.0
        for j, q in enumerate(TARGET_AT):
            levels = []
            for t in ts:
                ns, held = np.array([n for n, _ in t["curve"]]), _held(t)
                levels.append(float(np.max(held[ns <= q * t["iterations"]], initial=-np.inf)))
            thr = math.floor(float(np.median(levels)) * 1e4) / 1e4  # rounded the easy way: the median seed meets it
            for t in ts:
                ns, held = np.array([n for n, _ in t["curve"]]), _held(t)
                hit = np.flatnonzero(held >= thr)
                stop = int(ns[hit[0]]) if hit.size else None
                out.append({**t, "target": sgn * thr, "target_id": f"{fam} #{j + 1}", "stop": stop,
                            "patience": patience_of(fam)})
    return out


def points_of(run: dict) -> list[dict]:
    """Every evaluation before the stop (or in the budget): the estimator's signals and the rules' answers."""
    est = Estimator(metric="m", target=run["target"], mode=run["mode"], patience=run["patience"],
                    bounds=(0.0, 1.0) if run["mode"] == "max" else (0.0, None))
    sgn = 1.0 if run["mode"] == "max" else -1.0
    secs = run["seconds"]
    end = run["stop"] or run["iterations"] + 1
    ns, ys, out, done = [], [], [], 0
    picked = set() if not run["stop"] else {max([n for n, _ in run["curve"] if n <= f * run["stop"]], default=0)
                                            for f in FRACTIONS}
    for j, (n, y) in enumerate(run["curve"]):
        if n >= end:
            break
        for i in range(done, n):
            est.add(i + 1, {"m": y} if i + 1 == n else {}, secs[i])
        done = n
        ns.append(n)
        ys.append(y)
        sig, _, horizon = est.signals(n)
        a, b = np.array(ns, float), np.array(ys)
        out.append({"n": n, "sig": sig, "horizon": horizon, "spi": est.spi,
                    "linear": base.linear(a, b, run["target"], sgn, n),
                    "ensemble": base.ensemble(a, b, run["target"], sgn, n)
                    if run["stop"] and (n in picked or j % ENSEMBLE_EVERY == 0) else None})
    return out


def estimate_cost(runs: list[dict]) -> float:
    """Mean seconds of one :meth:`Estimator.estimate` per evaluation, replaying the runs as a run asks it."""
    calls, total = 0, 0.0
    for run in runs:
        est = Estimator(metric="m", target=run["target"], mode=run["mode"], patience=run["patience"],
                        bounds=(0.0, 1.0) if run["mode"] == "max" else (0.0, None))
        for n, y in run["curve"]:
            est.add(n, {"m": y}, run["seconds"][n - 1])
            t0 = time.perf_counter()
            est.estimate(n, 0.0)
            total += time.perf_counter() - t0
            calls += 1
    return total / max(calls, 1)


def _err(est: float | None, truth: float) -> float:
    return math.inf if est is None or not math.isfinite(est) else abs(est - truth) / truth


def score_point(cal: Calibration, run: dict, pt: dict, past: list[int] | None) -> dict:
    """One scored estimate: Sluice's answer and the rules' errors at this point of a run that met its target."""
    n, truth = pt["n"], run["stop"] - pt["n"]
    sig = pt["sig"] if past is None else replace(pt["sig"], past=past_signal(past, n))
    ans = answer(cal, sig, n, pt["horizon"])
    covered = ans.low <= truth and (ans.high is None or truth <= ans.high)
    secs = sum(run["seconds"][n:run["stop"]])
    s_lo, s_hi = ans.low * pt["spi"], None if ans.high is None else ans.high * pt["spi"]
    return {"sluice": _err(ans.mid, truth), "covered": covered, "missing": ans.mid is None,
            "s_covered": s_lo <= secs and (s_hi is None or secs <= s_hi),
            "raw": _err(n * math.exp(pt["sig"].curve) if pt["sig"].reach > 0.5 else None, truth),
            "again": _err(base.as_many_again(n), truth), "linear": _err(pt["linear"], truth),
            "ensemble": None if pt["ensemble"] is None else _err(pt["ensemble"], truth),
            "oracle": _err(base.oracle(past or [], n), truth)}


def _pick(points: list[dict], stop: int, f: float) -> dict | None:
    ok = [p for p in points if p["n"] <= f * stop]
    return ok[-1] if ok else None


def _summary(rows: list[dict]) -> dict:
    if not rows:
        return {"points": 0}
    med = {k: statistics.median(r[k] for r in rows if r[k] is not None)
           for k in ("sluice", "raw", "again", "linear", "ensemble", "oracle")}
    return {"points": len(rows), "median_error": med,
            "coverage": sum(r["covered"] for r in rows) / len(rows),
            "seconds_coverage": sum(r["s_covered"] for r in rows) / len(rows),
            "no_point": sum(r["missing"] for r in rows)}


def _others(runs: list[dict], run: dict) -> list[int]:
    return [r["stop"] for r in runs if r["target_id"] == run["target_id"] and r["seed"] != run["seed"] and r["stop"]]


def calibration_points(runs: list[dict], pts: dict[int, list[dict]], history: bool) -> tuple[list, list]:
    """``(signals, remaining, done)`` at every evaluation of the runs that met their target, and of those
    that did not (remaining: what was left of the budget, a lower bound)."""
    met, later = [], []
    for i, run in enumerate(runs):
        past = _others(runs, run) if history else None
        for p in pts[i]:
            sig = p["sig"] if past is None else replace(p["sig"], past=past_signal(past, p["n"]))
            if run["stop"]:
                met.append((sig, run["stop"] - p["n"], p["n"]))
            else:
                later.append((sig, run["iterations"] + 1 - p["n"], p["n"]))
    return met, later


def calibrate(runs: list[dict], pts: dict[int, list[dict]]) -> Calibration:
    """Both regressions: without history on every point, with history on those whose history has enough runs."""
    plain = fit(*calibration_points(runs, pts, False))
    met, later = calibration_points(runs, pts, True)
    met, later = [p for p in met if p[0].past is not None], [p for p in later if p[0].past is not None]
    if not met:
        return plain
    with_past = fit(met, later)
    return replace(plain, past_coef=with_past.past_coef, past_residuals=with_past.past_residuals,
                   past_counts=with_past.past_counts)


HORIZONS = {"the estimate's horizon": lambda n, horizon, rest: horizon, "n more": lambda n, horizon, rest: n,
            "2n more": lambda n, horizon, rest: 2 * n, "rest of the budget": lambda n, horizon, rest: rest}
"""The horizons ``h`` at which the probability of meeting the target within ``h`` is scored."""


def reliability(cal: Calibration, runs: list[dict], pts: dict[int, list[dict]], idx: list[int]) -> dict[str, list]:
    """Per horizon: (predicted probability of meeting the target within it, met) at every point where the
    outcome is known (the run met its target, or its budget reached past the horizon)."""
    out: dict[str, list] = {k: [] for k in HORIZONS}
    for i in idx:
        run = runs[i]
        for p in pts[i]:
            rest = run["iterations"] - p["n"]
            for name, fn in HORIZONS.items():
                h = fn(p["n"], p["horizon"], rest)
                if h >= 1 and (run["stop"] or h <= rest):
                    met = run["stop"] is not None and run["stop"] - p["n"] <= h
                    out[name].append((cal.probability_within(p["sig"], p["n"], h), met))
    return out


def evaluate(runs: list[dict], pts: dict[int, list[dict]]) -> dict:
    """Leave one family out: calibrate on the others, score the one held out."""
    fams = sorted({r["family"] for r in runs})
    scored: dict[str, list[dict]] = {}
    rel: dict[str, list] = {k: [] for k in HORIZONS}
    for fam in fams:
        train = [i for i, r in enumerate(runs) if r["family"] != fam]
        test = [i for i, r in enumerate(runs) if r["family"] == fam]
        cal = calibrate([runs[i] for i in train], {j: pts[i] for j, i in enumerate(train)})
        for k, v in reliability(cal, runs, pts, test).items():
            rel[k] += v
        for i in test:
            run = runs[i]
            if not run["stop"]:
                continue
            for hist in (False, True):
                past = _others(runs, run) if hist else None
                tag = "history" if hist else "no history"
                for f in FRACTIONS:
                    p = _pick(pts[i], run["stop"], f)
                    if p is not None:
                        scored.setdefault(f"{tag} {f:.0%}", []).append(score_point(cal, run, p, past))
                scored.setdefault(f"{tag} all", []).extend(score_point(cal, run, p, past) for p in pts[i])
    return {"scores": {k: _summary(v) for k, v in scored.items()},
            "reliability": {k: _reliability_table(v) for k, v in rel.items()}}


def _reliability_table(rel: list[tuple]) -> dict:
    p = np.array([r[0] for r in rel])
    y = np.array([r[1] for r in rel], float)
    rows = []
    for lo, hi in zip(BINS[:-1], BINS[1:], strict=True):
        m = (p > lo) & (p <= hi) if lo > 0 else p <= hi
        rows.append({"bin": f"{lo:.1f}–{hi:.1f}", "points": int(m.sum()),
                     "mean_predicted": float(p[m].mean()) if m.any() else None,
                     "observed": float(y[m].mean()) if m.any() else None})
    return {"points": len(rel), "bins": rows, "brier": float(np.mean((p - y) ** 2)),
            "brier_constant": float(np.mean((y.mean() - y) ** 2)), "min_probability": float(p.min()),
            "met_at_or_below_0.01": int(((p <= 0.01) & (y > 0)).sum()),
            "met_share_at_or_below_0.1": float(y[p <= 0.1].mean()) if (p <= 0.1).any() else None}


def ship(cal: Calibration, points: int, runs: int, families: int) -> None:
    """Write :mod:`sluice.control.eta_calibration_data` with ``cal``."""
    fields = "".join(f"    {k}=" + pprint.pformat(getattr(cal, k), width=100, compact=True).replace("\n", "\n    ")
                     + ",\n" for k in ("curve_coef", "past_coef", "curve_residuals", "past_residuals",
                                       "curve_counts", "past_counts"))
    DATA_MODULE.write_text(
        '"""The calibration :class:`sluice.control.eta.Estimator` ships with, written by ``bench/eta.py --ship``:\n'
        f'fitted on {points} estimates of {runs} runs that met their target, in {families} job families."""\n\n'
        "from sluice.control.eta_calibration import Calibration\n\nDEFAULT = Calibration(\n" + fields + ")\n",
        encoding="utf-8")

NAMES = {"sluice": "Sluice", "raw": "power-law futures (before)", "again": "as many again",
         "linear": "linear extrapolation", "ensemble": "LC ensemble (Domhan)", "oracle": "cross-seed oracle"}


def _pct(v: float) -> str:
    return f"{v:.0%}" if math.isfinite(v) else "—"


def write(results: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    lines = ["# Remaining-iteration estimates, each job family held out in turn", "",
             f"Command: `{results['command']}`. {results['traces']} runs in {results['families']} families, "
             f"{results['runs']} run–target pairs ({results['met']} met their target within the budget); "
             f"{results['points']} estimates; scoring took {results['seconds']:.0f} s. One estimate, as a run asks "
             f"for it after every evaluation: {results['estimate_ms']:.3f} ms on average.", "",
             "Median absolute relative error of the remaining iterations (no point estimate: infinite), and "
             "Sluice's 80 % interval coverage (iterations, seconds):", "",
             "| history | at | points | " + " | ".join(NAMES.values()) + " | covers | covers (s) | no point |",
             "|---|---|---|" + "---|" * (len(NAMES) + 3)]
    for key, v in results["scores"].items():
        tag, at = key.rsplit(" ", 1)
        cells = " | ".join(_pct(v["median_error"][k]) for k in NAMES)
        lines.append(f"| {tag} | {at} | {v['points']} | {cells} | {v['coverage']:.0%} | "
                     f"{v['seconds_coverage']:.0%} | {v['no_point']} |")
    rels = results["reliability"]
    lines += ["", "Probability of meeting the target within a horizon `h`, at every evaluation of every run where "
              "the outcome is known (censored runs included where their budget reaches past `h`): mean predicted / "
              "share met (estimates) per bin of the prediction.", "",
              "| probability | " + " | ".join(rels) + " |", "|---|" + "---|" * len(rels)]
    for j, b in enumerate(BINS[1:]):
        cells = []
        for rel in rels.values():
            row = rel["bins"][j]
            cells.append("—" if row["mean_predicted"] is None else
                         f"{row['mean_predicted']:.2f} / {row['observed']:.2f} ({row['points']})")
        lines.append(f"| {BINS[j]:.1f}–{b:.1f} | " + " | ".join(cells) + " |")
    lines.append("| Brier (constant predictor) | " + " | ".join(
        f"{r['brier']:.3f} ({r['brier_constant']:.3f})" for r in rels.values()) + " |")
    lines.append("| smallest probability given; met at ≤ 0.01 | " + " | ".join(
        f"{r['min_probability']:.3f}; {r['met_at_or_below_0.01']}" for r in rels.values()) + " |")
    lines += ["", "| target | threshold | stops (censored: —) |", "|---|---|---|"]
    for tid, (thr, stops) in results["targets"].items():
        lines.append(f"| {tid} | {thr:g} | {', '.join('—' if s is None else str(s) for s in stops)} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regenerate", action="store_true", help="run the jobs first (bench/eta_traces.py)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--ship", action="store_true", help="write the calibration fitted on every run")
    ap.add_argument("--out", type=Path, default=RESULTS / "eta")
    args = ap.parse_args(argv)
    traces = eta_traces.generate(args.jobs) if args.regenerate else eta_traces.load()
    t0 = time.perf_counter()
    runs = runs_with_targets(traces)
    pts = {i: points_of(r) for i, r in enumerate(runs)}
    results = evaluate(runs, pts)
    results["estimate_ms"] = 1e3 * estimate_cost(runs)
    if args.ship:
        cal = calibrate(runs, pts)
        ship(cal, sum(len(pts[i]) for i, r in enumerate(runs) if r["stop"]), sum(bool(r["stop"]) for r in runs),
             len({r["family"] for r in runs}))
    targets: dict[str, tuple[float, list]] = {}
    for r in runs:
        targets.setdefault(r["target_id"], (abs(r["target"]), []))[1].append(r["stop"])
    write({"command": "python bench/eta.py" + " --regenerate" * args.regenerate + " --ship" * args.ship,
           "traces": len(traces), "families": len({t["family"] for t in traces}), "runs": len(runs),
           "met": sum(bool(r["stop"]) for r in runs), "points": sum(len(v) for v in pts.values()),
           "interval": INTERVAL, "seconds": time.perf_counter() - t0, **results, "targets": targets}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
