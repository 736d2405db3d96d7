"""What the dashboard shows of a process, whatever produced it: curve points and how close each
termination criterion is.

A point is one iteration: ``iteration``, the monitored metrics, ``cum_bytes_up``/``cum_bytes_down`` (bytes on
the wire so far, each the length of what was encoded, as the run counted them) and ``seconds``; the page
derives bytes per iteration from the cumulative counts, so points may skip iterations (the service reports
progress at most every ``progress_interval_s``) without inventing traffic.
"""

from __future__ import annotations

import math
from typing import Any

ITERATION_KEYS = ("round", "step", "iteration", "epoch")
# not curves of their own (nor is any ``remaining_*`` key: the estimate, shown beside the curves)
BOOKKEEPING = frozenset({
    "bytes_up", "bytes_down", "cum_bytes_up", "cum_bytes_down", "seconds", "remaining_iterations",
    "remaining_iterations_low", "remaining_iterations_high", "reach_probability", "progress_percent",
    "remaining_reason", *ITERATION_KEYS,
})

_KEPT = frozenset({"cum_bytes_up", "cum_bytes_down", "seconds"})


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def point_of_record(record: dict[str, Any]) -> dict[str, Any] | None:
    """A ``metrics.jsonl`` line as a point (None for a line without an iteration number)."""
    key = next((k for k in ITERATION_KEYS if _number(record.get(k))), None)
    if key is None:
        return None
    out = {k: v for k, v in record.items()
           if _number(v) and (k in _KEPT or (k not in BOOKKEEPING and not k.startswith("remaining_")))}
    out["iteration"] = record[key]
    return out


def point_of_status(status: dict[str, Any]) -> dict[str, Any] | None:
    """The service's ``sluice-status`` (the process's live status) as a point (None before any iteration)."""
    n = status.get("iterations")
    if not _number(n) or n <= 0:
        return None
    out = {k: v for k, v in (status.get("metrics") or {}).items() if _number(v)}
    out.update(iteration=n, cum_bytes_up=status.get("bytes_up") or 0, cum_bytes_down=status.get("bytes_down") or 0,
               seconds=status.get("elapsed_s") or 0.0)
    return out


def estimate_of(status: dict[str, Any]) -> dict[str, Any]:
    """The estimate of what remains, with its 80 % interval and why there is none."""
    return {"remaining_s": status.get("estimated_remaining_s"),
            "remaining_iterations": status.get("estimated_remaining_iterations"),
            "low": status.get("estimated_remaining_iterations_low"),
            "high": status.get("estimated_remaining_iterations_high"),
            "reach_probability": status.get("reach_probability"), "note": status.get("estimate_note")}


def _lower_is_better(metric: str) -> bool:
    return any(w in metric for w in ("loss", "error", "mse", "mae"))


def _closeness(observed: float | None, target: float, lower: bool) -> float | None:
    """How far along a criterion is, 0..1 (1: met)."""
    if observed is None or not _number(observed):
        return None
    if lower:
        return 1.0 if observed <= target else max(0.0, min(1.0, target / observed)) if observed > 0 else None
    return 1.0 if observed >= target else max(0.0, min(1.0, observed / target)) if target > 0 else None


def _threshold(c: Any) -> float | None:
    if _number(c):
        return float(c)
    if isinstance(c, dict) and _number(c.get("threshold")):
        return float(c["threshold"])
    return None


def criteria(termination: dict[str, Any] | None, iterations: int, elapsed_s: float,
             metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """Each criterion of ``termination`` in force: its name, target, what was observed and how close (0..1).
    Directly listed criteria are OR-ed (the first to reach 1 ends training)."""
    t = termination or {}
    out: list[dict[str, Any]] = []

    def add(name: str, observed: Any, target: float, lower: bool, unit: str = "") -> None:
        obs = observed if _number(observed) else None
        out.append({"name": name, "target": target, "observed": obs, "unit": unit,
                    "closeness": _closeness(obs, target, lower)})

    if _number(t.get("iterations")):
        add("iterations", iterations, float(t["iterations"]), False)
    if _number(t.get("training_time_s")):
        add("training time", elapsed_s, float(t["training_time_s"]), False, "s")
    te = _threshold(t.get("training_error"))
    if te is not None:
        metric = t.get("error_metric") or "train_loss"
        add(f"training error ({metric})", metrics.get(metric), te, True)
    for m, c in (t.get("performance") or {}).items():
        th = _threshold(c)
        if th is not None:
            add(m, metrics.get(m), th, _lower_is_better(m))
    for m, p in (t.get("plateau") or {}).items():
        out.append({"name": f"plateau of {m}", "target": (p or {}).get("patience", 5), "observed": None,
                    "unit": "checks", "closeness": None})
    return out



def _compact(v: Any) -> Any:
    return float(f"{v:.7g}") if isinstance(v, float) else v


class Columns:
    """A curve kept as one list per key (``None`` where a point lacks it), floats to 7 significant digits, built
    as points arrive: what the page loads for a whole curve, in a fraction of the size of the points."""

    def __init__(self) -> None:
        self.data: dict[str, list[Any]] = {}
        self.n = 0

    def append(self, point: dict[str, Any]) -> None:
        for k in point.keys() - self.data.keys():
            self.data[k] = [None] * self.n
        for k, col in self.data.items():
            col.append(_compact(point.get(k)))
        self.n += 1

    def drop_first(self, count: int) -> None:
        for col in self.data.values():
            del col[:count]
        self.n = max(0, self.n - count)

    def copy(self) -> dict[str, list[Any]]:
        return {k: list(v) for k, v in self.data.items()}


def budget_of(job: dict[str, Any]) -> dict[str, Any]:
    """The termination of a job that names none: its ``train`` section's rounds, iterations, steps or epochs."""
    train = job.get("train") or {}
    for key in ("rounds", "iterations", "steps", "epochs"):
        if isinstance(train.get(key), int):
            return {"iterations": train[key]}
    return {}
