"""Past training runs, and which of them say how many iterations a new request needs.

A producer that decides the termination parameters itself (``decided_by = "producer"`` or
``"negotiated"``) sets the iteration budget from past runs (:meth:`RunHistory.evidence`). A past run says
something about a new request only when both:

* train **the same job shape** (:func:`job_shape`): the engine kind and every setting of the job that
  changes how many iterations a target takes — the task and model architecture, the data and its split, the
  optimiser settings, compression, the requirements that narrow training (``layers``, ``data_amount``,
  ``max_data_amount``). Left out are the model identity (``id``, ``version``, ``type``), the seed, iteration
  budgets (``train.iterations``, ``rounds``, ``epochs``, ``steps``), the device, and a chain's service
  settings (endpoints, polling, timeouts). A job that writes a default out and one that leaves it out are
  different shapes: the producer then proposes its default rather than guess. Without a shape (a
  :class:`~sluice.roles.producer.Producer` used as a library, whose engine belongs to one model id) runs
  of the same model id count;
* aim at **a compatible target**: the new request's goal (:func:`target_of`: its first performance target,
  else the requirements' first performance threshold, else its training error threshold) is a metric and a
  threshold; a past run counts when a result criterion on that metric fired with a threshold at least as
  strict (≥ it for a metric to maximise, ≤ it for one to minimise): a run that reached accuracy 0.95 in
  ``N`` iterations passed 0.9 by then, one that stopped at 0.8 says nothing about 0.9. A request with no
  goal learns nothing from the past (its iterations are its budget).

The reason given names the runs used, by id. The same runs teach the estimate of a running job's remaining
iterations (:func:`past_iterations`); the command line finds them in the runs directory
(:func:`runs_dir_history`: every run directory there with a ``report.json`` and a ``config.toml``).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from sluice.control.monitor import RESULT_KINDS, effective_error_metric
from sluice.control.params import Cause, ModelIdentity, Requirements, Termination
from sluice.control.process import goal_of
from sluice.metrics import MetricSpec

IDENTITY = ("id", "version", "type")
BUDGETS = ("iterations", "rounds", "epochs", "steps", "device")
SERVICE_KEYS = ("seed", "engine", "endpoints", "chain_id", "poll_interval_s", "producer_timeout_s", "request",
                "termination", "requirements")
SHAPE_REQUIREMENTS = ("layers", "data_amount", "max_data_amount")
SHOWN_IDS = 10


def _strip(kind: str | None, job: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in job.items():
        if k in SERVICE_KEYS:
            continue
        if k == "model" and isinstance(v, Mapping):
            v = {m: x for m, x in v.items() if m not in IDENTITY}
        elif k == "train" and isinstance(v, Mapping):
            v = {t: x for t, x in v.items() if t not in BUDGETS}
        elif kind == "chain" and k == "job" and isinstance(v, Mapping):
            v = _strip(v.get("engine"), v) | {"engine": v.get("engine")}
        elif kind == "chain" and k == "overrides" and isinstance(v, Mapping):
            v = {name: _strip(None, o) if isinstance(o, Mapping) else o for name, o in v.items()}
        out[k] = v
    return out


def job_shape(kind: str | None, job: Mapping[str, Any] | None,
              requirements: Mapping[str, Any] | None = None) -> str:
    """A short fingerprint of what in a job changes the iterations a target needs (module docstring):
    ``kind`` the engine kind, ``job`` its configuration sections (``[model]`` with the identity),
    ``requirements`` the training requirements (a dict, as sent)."""
    shaped: dict[str, Any] = {"engine": kind, "job": _strip(kind, job or {})}
    req = {k: v for k, v in (requirements or {}).items() if k in SHAPE_REQUIREMENTS and v is not None}
    if req:
        shaped["requirements"] = req
    text = json.dumps(shaped, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Target:
    """What a run aims at: ``metric`` reaching ``threshold`` (``mode`` ``max``: at least, ``min``: at most)."""

    metric: str
    threshold: float
    mode: str

    def met_by(self, reached: float) -> bool:
        """Whether a run that reached ``reached`` on this metric also passed this target."""
        return reached >= self.threshold if self.mode == "max" else reached <= self.threshold

    def __str__(self) -> str:
        return f"{self.metric} {'≥' if self.mode == 'max' else '≤'} {self.threshold:g}"


def target_of(termination: Termination, requirements: Requirements | None, model: ModelIdentity | None,
              specs: Mapping[str, MetricSpec] | None = None) -> Target | None:
    """The goal of a run with these parameters (module docstring), or None when it has none; ``specs``: the
    engine's declared metrics (default: Sluice's known metrics)."""
    goal = goal_of(termination, requirements, effective_error_metric(termination, model), specs)
    return None if goal is None else Target(goal[0], float(goal[1]), goal[2])


def reached_of(criterion: Any) -> dict[str, float]:
    """Metric → threshold of each result criterion in a fired rule (a ``Firing`` or its JSON)."""
    if criterion is None:
        return {}
    data = criterion.model_dump(mode="json") if hasattr(criterion, "model_dump") else dict(criterion)
    out: dict[str, float] = {}
    for hit in data.get("hits") or []:
        metric, thr = hit.get("metric"), hit.get("threshold")
        if hit.get("kind") in RESULT_KINDS and metric and isinstance(thr, int | float):
            out[str(metric)] = float(thr)
    return out


class RunRecord(BaseModel):
    """One past training run, as the producer remembers it."""

    model_id: str
    model_type: str | None
    version: str
    cause: Cause
    fired: str | None
    iterations: int
    duration_s: float
    performance: dict[str, float]
    trigger: str = "CONSUMER_REQUEST"
    run_id: str | None = Field(None, description="the run's process id")
    shape: str | None = Field(None, description="job_shape() of the run's job; None: unknown")
    reached: dict[str, float] = Field(default_factory=dict, description="metric → threshold of each result "
                                      "criterion that fired (a record without it teaches nothing)")


@dataclass(frozen=True)
class Evidence:
    """What the history says about a new request: the most iterations a matching run needed (None: no
    matching run), the runs used and a sentence saying so."""

    iterations: int | None
    run_ids: tuple[str, ...]
    text: str


class RunHistory:
    """Past runs, in memory and optionally appended to a JSON-lines file."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = None if path is None else Path(path)
        self.records: list[RunRecord] = []
        if self.path is not None and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    self.records.append(RunRecord.model_validate_json(line))

    def add(self, record: RunRecord) -> None:
        self.records.append(record)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(record.model_dump_json() + "\n")

    def matching(self, model: ModelIdentity, target: Target | None, shape: str | None = None) -> list[RunRecord]:
        """Runs that met a target compatible with ``target`` on the same job shape (module docstring)."""
        if target is None:
            return []
        out = []
        for r in self.records:
            if r.cause != Cause.CRITERION_MET or target.metric not in r.reached:
                continue
            if (r.shape != shape) if shape is not None else (r.model_id != model.id):
                continue
            if target.met_by(r.reached[target.metric]):
                out.append(r)
        return out

    def evidence(self, model: ModelIdentity, target: Target | None, shape: str | None = None) -> Evidence:
        """The most iterations a matching run needed, the runs used and why (module docstring)."""
        if target is None:
            return Evidence(None, (), "no target to reach, so no past run to learn from")
        same = "this job shape" if shape is not None else f"model {model.id}"
        runs = self.matching(model, target, shape)
        if not runs:
            return Evidence(None, (), f"no past run of {same} reached {target}")
        ids = tuple(r.run_id or "unnamed" for r in runs)
        shown = ", ".join(ids[:SHOWN_IDS]) + (f" and {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else "")
        need = max(r.iterations for r in runs)
        return Evidence(need, ids, f"{need} needed by {len(runs)} past run(s) of {same} that reached {target} "
                                   f"or better: {shown}")

    def iterations_needed(self, model: ModelIdentity, target: Target | None = None,
                          shape: str | None = None) -> tuple[int | None, str]:
        """``(most iterations a matching run needed or None, why)``; see :meth:`evidence`."""
        ev = self.evidence(model, target, shape)
        return ev.iterations, ev.text


def past_iterations(history: RunHistory, model: ModelIdentity, target: Target | None,
                    shape: str | None) -> list[int]:
    """The iterations at which the matching past runs (:meth:`RunHistory.matching`) met their target."""
    return [r.iterations for r in history.matching(model, target, shape)]


def runs_dir_history(runs_dir: str | Path, kind: str, exclude: str | Path | None = None) -> RunHistory:
    """The runs of a runs directory as a history (in memory): each subdirectory (but ``exclude``) with a
    ``report.json`` and a ``config.toml``, its shape :func:`job_shape` of ``kind`` and that config. Unreadable
    ones are left out."""
    hist, root = RunHistory(), Path(runs_dir)
    skip = None if exclude is None else Path(exclude).resolve()
    if not root.is_dir():
        return hist
    for d in sorted(root.iterdir()):
        rep, cfg = d / "report.json", d / "config.toml"
        if d.resolve() == skip or not rep.is_file() or not cfg.is_file():
            continue
        try:
            r = json.loads(rep.read_text(encoding="utf-8"))
            m = r.get("model") or {}
            hist.add(RunRecord(model_id=str(m.get("id", "model")), model_type=m.get("type"),
                               version=str(m.get("version", "1")), cause=r["cause"], fired=None,
                               iterations=int(r["iterations"]), duration_s=float(r.get("duration_s") or 0.0),
                               performance={}, run_id=d.name,
                               shape=job_shape(kind, tomllib.loads(cfg.read_text(encoding="utf-8"))),
                               reached=reached_of(r.get("criterion"))))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return hist
