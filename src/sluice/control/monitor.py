"""Evaluate termination criteria after every iteration, from one observation.

The monitor is pure bookkeeping: it is handed an :class:`Observation` (metrics of the iteration just
done, active training time, sampled resources, cumulative wire bytes) and answers whether training must
stop *now*: a :class:`Firing` naming the rule and the criteria that hold with their observed values, an
anomaly, or ``None``. Because it is called once per iteration and the driver stops as soon as it
answers, training never runs an iteration after a criterion holds.

A monitor is built for the metrics an engine declares (name → :class:`sluice.metrics.MetricSpec`):
:func:`check_criteria` refuses a criterion on a metric the engine does not report, a threshold outside the
metric's range, a training error that is not a metric to minimise, and a ``network_bytes`` threshold for
an engine that counts no bytes. Whether higher or lower is better comes from the spec.

Divergence (anomaly ``DIVERGED``), like Lightning's ``check_finite`` and ``divergence_threshold``:
a non-finite metric (``check_finite``); a metric past its absolute bound in the bad direction
(``divergence``); a loss ``L`` (a metric to minimise named ``*_loss``) with ``L > f · L₀`` where ``L₀ > 0`` is
its value for the untrained model (given by :meth:`Monitor.set_reference` when the engine can evaluate it)
and ``f`` is ``divergence_factor``. The first *reported* value is no reference: after one iteration a loss
may already be tiny (then noise looks like a blow-up) or already blown up (then nothing would look wrong).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from sluice.control.params import (
    ERROR_METRIC,
    Cause,
    CriteriaSet,
    Criterion,
    ModelIdentity,
    Plateau,
    Requirements,
    Termination,
    spec_of,
)
from sluice.errors import ConfigError
from sluice.metrics import KNOWN, MetricSpec

RESULT_KINDS = ("performance", "training_error", "requirements")
"""Criteria that say a result was reached; every other kind (iterations, training time, resource,
plateau) is a budget."""


@dataclass
class Observation:
    """Everything a criterion may look at after iteration ``n`` (1-based count of iterations done)."""

    n: int
    metrics: dict[str, float]
    elapsed_s: float
    resources: dict[str, float] = field(default_factory=dict)


class Hit(BaseModel):
    """One criterion that holds: what it compares, the threshold and the value observed."""

    name: str
    kind: str
    threshold: float | None = None
    observed: float | None = None
    iteration: int
    metric: str | None = None
    """The metric a metric criterion compares (``coverage_error`` for a training error threshold...)."""


class Firing(BaseModel):
    """A rule that fired: a single criterion (any-of) or an all-of group, with every hit in it."""

    rule: str
    kind: str
    iteration: int
    hits: list[Hit]
    also: list[str] = []

    @property
    def success(self) -> bool:
        """True when the rule reached a result (a performance target or the training error threshold)
        rather than spent a budget (iterations, time, a resource, a plateau)."""
        return any(h.kind in RESULT_KINDS for h in self.hits)


@dataclass
class Anomaly:
    cause: Cause
    detail: str
    iteration: int


class _Condition:
    """One criterion with its warm-up and patience bookkeeping.

    ``check`` returns ``(holds, observed)`` or ``None`` when the observation does not carry the value
    (for example a metric only evaluated every few rounds): then the state is left as it was.
    """

    def __init__(self, name: str, kind: str, threshold: float | None, patience: int, warmup: int) -> None:
        self.name, self.kind, self.threshold = name, kind, threshold
        self.patience, self.warmup = patience, warmup
        self.streak = 0
        self.observed: float | None = None

    def spec(self) -> tuple[Any, ...]:
        """What defines the criterion; equal specs may share state across parameter updates."""
        return (type(self).__name__, self.name, self.threshold, self.patience, self.warmup,
                getattr(self, "metric", None), getattr(self, "delta", None), getattr(self, "resource", None))

    def check(self, obs: Observation) -> tuple[bool, float] | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def step(self, obs: Observation) -> bool | None:
        """Update with ``obs``; True/False = satisfied or not now; None = not evaluated this iteration."""
        r = self.check(obs)
        if r is None:
            return None
        holds, self.observed = r
        if obs.n <= self.warmup:
            self.streak = 0
            return False
        self.streak = self.streak + 1 if holds else 0
        return self.streak >= self.patience

    @property
    def satisfied(self) -> bool:
        return self.streak >= self.patience

    def hit(self, n: int) -> Hit:
        return Hit(name=self.name, kind=self.kind, threshold=self.threshold, observed=self.observed, iteration=n,
                   metric=getattr(self, "metric", None))


class _Metric(_Condition):
    def __init__(self, name: str, kind: str, spec: MetricSpec, c: Criterion) -> None:
        super().__init__(name, kind, c.threshold, c.patience, c.warmup)
        self.metric, self.mode, self.delta = spec.name, spec.mode, c.min_delta

    def check(self, obs: Observation) -> tuple[bool, float] | None:
        v = obs.metrics.get(self.metric)
        if v is None or not math.isfinite(v):
            return None
        thr = self.threshold
        assert thr is not None
        return (v >= thr + self.delta if self.mode == "max" else v <= thr - self.delta), v


class _Plateau(_Condition):
    def __init__(self, spec: MetricSpec, p: Plateau) -> None:
        super().__init__(f"plateau.{spec.name}", "plateau", None, p.patience, p.warmup)
        self.metric, self.mode, self.delta = spec.name, spec.mode, p.min_delta
        self.best: float | None = None

    def check(self, obs: Observation) -> tuple[bool, float] | None:
        v = obs.metrics.get(self.metric)
        if v is None or not math.isfinite(v):
            return None
        sign = 1.0 if self.mode == "max" else -1.0
        improved = self.best is None or sign * (v - self.best) > self.delta
        if improved:
            self.best = v
        return (not improved), v


class _Count(_Condition):
    def __init__(self, name: str, limit: int) -> None:
        super().__init__(name, "iterations", float(limit), 1, 0)

    def check(self, obs: Observation) -> tuple[bool, float]:
        assert self.threshold is not None
        return obs.n >= self.threshold, float(obs.n)


class _Time(_Condition):
    def __init__(self, name: str, limit: float, kind: str = "training_time") -> None:
        super().__init__(name, kind, limit, 1, 0)

    def check(self, obs: Observation) -> tuple[bool, float]:
        assert self.threshold is not None
        return obs.elapsed_s >= self.threshold, obs.elapsed_s


class _Resource(_Condition):
    def __init__(self, resource: str, c: Criterion) -> None:
        super().__init__(f"resources.{resource}", "resource", c.threshold, c.patience, c.warmup)
        self.resource, self.delta = resource, c.min_delta

    def check(self, obs: Observation) -> tuple[bool, float] | None:
        v = obs.resources.get(self.resource)
        if v is None:
            return None
        assert self.threshold is not None
        return v >= self.threshold + self.delta, v


def _conditions(cs: CriteriaSet, prefix: str, error_metric: str, specs: Mapping[str, MetricSpec]) -> list[_Condition]:
    out: list[_Condition] = []
    if cs.training_error is not None:
        spec = spec_of(cs.error_metric or error_metric, specs)
        out.append(_Metric(f"{prefix}training_error", "training_error", spec, cs.training_error))
    if cs.iterations is not None:
        out.append(_Count(f"{prefix}iterations", cs.iterations))
    if cs.training_time_s is not None:
        out.append(_Time(f"{prefix}training_time_s", cs.training_time_s))
    for name, c in cs.resources.items():
        r = _Resource(name, c)
        r.name = prefix + r.name
        out.append(r)
    for metric, c in cs.performance.items():
        out.append(_Metric(f"{prefix}performance.{metric}", "performance", spec_of(metric, specs), c))
    for metric, p in cs.plateau.items():
        pl = _Plateau(spec_of(metric, specs), p)
        pl.name = prefix + pl.name
        out.append(pl)
    return out


class _Rule:
    def __init__(self, name: str, conditions: list[_Condition]) -> None:
        self.name, self.conditions = name, conditions
        self.key = (name, tuple(c.spec() for c in conditions))

    @property
    def kind(self) -> str:
        return self.conditions[0].kind if len(self.conditions) == 1 else "all_of"

    def step(self, obs: Observation) -> bool:
        changed = False
        for c in self.conditions:
            if c.step(obs) is not None:
                changed = True
        return changed and all(c.satisfied for c in self.conditions)


def effective_error_metric(termination: CriteriaSet, model: ModelIdentity | None) -> str:
    """The metric the training error criterion watches: explicit, else by model type (T4), else train_loss."""
    if termination.error_metric:
        return termination.error_metric
    mt = model.model_type if model else None
    return ERROR_METRIC.get(mt, "train_loss") if mt else "train_loss"


def build_rules(
    termination: Termination, requirements: Requirements | None, model: ModelIdentity | None,
    specs: Mapping[str, MetricSpec] | None = None,
) -> list[_Rule]:
    """Rules in evaluation order: top-level criteria (one rule each), all-of groups, then the rules the
    requirements imply: every performance threshold met (an all-of group; by default only when the
    termination parameters set no result criterion of their own) and the maximum training time.
    ``specs`` are the metrics the engine declares (default: :data:`sluice.metrics.KNOWN`)."""
    specs = KNOWN if specs is None else specs
    err = effective_error_metric(termination, model)
    rules: list[_Rule] = []
    for c in _conditions(termination, "", err, specs):
        rules.append(_Rule(c.name, [c]))
    for i, g in enumerate(termination.all_of):
        name = g.name or f"all_of[{i}]"
        conds = _conditions(g, f"{name}.", effective_error_metric(g, model) if g.error_metric else err, specs)
        rules.append(_Rule(name, conds))
    if requirements is not None:
        stop = requirements.stop_when_met
        if stop is None:
            stop = not termination.defines_result()
        if requirements.performance and stop:
            conds = [
                _Metric(f"requirements.performance.{m}", "requirements", spec_of(m, specs), Criterion(threshold=v))
                for m, v in requirements.performance.items()
            ]
            rules.append(_Rule("requirements.performance", conds))
        if requirements.max_training_time_s is not None:
            t = _Time("requirements.max_training_time_s", requirements.max_training_time_s, "training_time")
            rules.append(_Rule(t.name, [t]))
    return rules


def _is_loss(spec: MetricSpec) -> bool:
    return not spec.higher_is_better and spec.name.endswith("_loss")


def check_criteria(
    termination: Termination,
    requirements: Requirements | None,
    model: ModelIdentity | None,
    specs: Mapping[str, MetricSpec],
    *,
    counts_bytes: bool = True,
    reporter: str = "the engine",
) -> None:
    """Refuse (:class:`ConfigError`, every problem at once) parameters the engine cannot honour: a metric
    it does not report (performance targets, training error, plateau, all_of groups, divergence bounds,
    performance requirements), a threshold outside the metric's range, a training error that is not a
    metric to minimise, a ``network_bytes`` threshold when the engine counts no bytes."""
    problems: list[str] = []
    reports = ", ".join(sorted(specs)) or "no metrics"

    def spec(where: str, name: str) -> MetricSpec | None:
        s = specs.get(name)
        if s is None:
            problems.append(f"{where}: unknown metric {name!r}; {reporter} reports {reports}")
        return s

    def threshold(where: str, name: str, value: float, what: str) -> None:
        s = spec(where, name)
        if s is not None:
            try:
                s.check_threshold(value, what)
            except ValueError as exc:
                problems.append(f"{where}: {exc}")

    default_error = effective_error_metric(termination, model)
    groups: list[tuple[str, CriteriaSet]] = [("termination", termination)]
    groups += [(f"termination.all_of[{i}]", g) for i, g in enumerate(termination.all_of)]
    for where, cs in groups:
        for name, c in cs.performance.items():
            threshold(f"{where}.performance", name, c.threshold, "performance target")
        if cs.training_error is not None:
            name = cs.error_metric or default_error
            threshold(f"{where}.training_error", name, cs.training_error.threshold, "training error threshold")
            s = specs.get(name)
            if s is not None and s.higher_is_better:
                problems.append(f"{where}.error_metric: the training error must be a metric to minimise (a loss "
                                f"or an error), {name!r} is one to maximise")
        for name in cs.plateau:
            spec(f"{where}.plateau", name)
        if cs.resources.network_bytes is not None and not counts_bytes:
            problems.append(f"{where}.resources.network_bytes: {reporter} sends nothing over a network and counts "
                            "no bytes; measurable resources: cpu_percent, memory_percent, memory_bytes, "
                            "storage_bytes")
    for name, bound in termination.divergence.items():
        threshold("termination.divergence", name, bound, "divergence bound")
    if requirements is not None:
        for name, value in requirements.performance.items():
            threshold("requirements.performance", name, value, "performance requirement")
    if problems:
        raise ConfigError("the parameters do not fit the engine:\n  " + "\n  ".join(problems))


class Monitor:
    """Decides after each iteration whether training stops, and why.

    ``metrics`` are the engine's declared metrics (default :data:`sluice.metrics.KNOWN`); the parameters
    are checked against them (:func:`check_criteria`) when the monitor is built and when they change.
    """

    def __init__(
        self,
        termination: Termination,
        requirements: Requirements | None = None,
        model: ModelIdentity | None = None,
        metrics: Mapping[str, MetricSpec] | None = None,
        *,
        counts_bytes: bool = True,
        reporter: str = "the engine",
    ) -> None:
        self.specs: Mapping[str, MetricSpec] = KNOWN if metrics is None else metrics
        self.counts_bytes, self.reporter = counts_bytes, reporter
        check_criteria(termination, requirements, model, self.specs, counts_bytes=counts_bytes, reporter=reporter)
        self.model = model
        self.requirements = requirements
        self.termination = termination
        self.rules = build_rules(termination, requirements, model, self.specs)
        self.error_metric = effective_error_metric(termination, model)
        self.reference: dict[str, float] = {}

    @property
    def metrics_watched(self) -> set[str]:
        """Every metric some criterion or divergence check reads."""
        out = set(self.termination.divergence)
        for r in self.rules:
            for c in r.conditions:
                if isinstance(c, _Metric | _Plateau):
                    out.add(c.metric)
        return out

    @property
    def resources_watched(self) -> set[str]:
        return {c.resource for r in self.rules for c in r.conditions if isinstance(c, _Resource)}

    def update(self, termination: Termination, requirements: Requirements | None = None) -> None:
        """Install new parameters; criteria whose specification did not change keep their state."""
        reqs = self.requirements if requirements is None else requirements
        check_criteria(termination, reqs, self.model, self.specs, counts_bytes=self.counts_bytes,
                       reporter=self.reporter)
        old = {r.key: r for r in self.rules}
        self.termination = termination
        self.requirements = reqs
        rules = build_rules(termination, self.requirements, self.model, self.specs)
        self.rules = [old.get(r.key, r) for r in rules]
        self.error_metric = effective_error_metric(termination, self.model)

    def state(self) -> dict[str, Any]:
        """What the criteria have seen so far, JSON-ready: the loss references and, per rule, each
        condition's streak, last observed value and best value (plateaus); :meth:`load_state` takes it."""
        rules = [{"rule": r.name, "spec": repr(r.key),
                  "conditions": [{"streak": c.streak, "observed": c.observed, "best": getattr(c, "best", None)}
                                 for c in r.conditions]} for r in self.rules]
        return {"reference": dict(self.reference), "rules": rules}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state`: rules whose specification is unchanged take their saved conditions
        (as :meth:`update` keeps them across parameter updates); others start afresh."""
        self.reference = {str(k): float(v) for k, v in (state.get("reference") or {}).items()}
        saved = {(r["rule"], r["spec"]): r["conditions"] for r in state.get("rules") or []}
        for rule in self.rules:
            conds = saved.get((rule.name, repr(rule.key)))
            if conds is None or len(conds) != len(rule.conditions):
                continue
            for c, st in zip(rule.conditions, conds, strict=True):
                c.streak, c.observed = int(st["streak"]), st["observed"]
                if isinstance(c, _Plateau):
                    c.best = st["best"]

    def set_reference(self, metrics: Mapping[str, float]) -> None:
        """The initial value of each loss (``metrics`` of the untrained model), for ``divergence_factor``;
        the losses among ``metrics`` are those the engine declares to minimise and names ``*_loss``."""
        for k, v in metrics.items():
            s = self.specs.get(k)
            if s is not None and _is_loss(s) and math.isfinite(v):
                self.reference[k] = float(v)

    def anomaly(self, obs: Observation) -> Anomaly | None:
        """Non-finite metrics (when ``check_finite``), divergence bounds and losses that blew up past
        ``divergence_factor`` times their initial value."""
        t = self.termination
        if t.check_finite:
            bad = sorted(k for k, v in obs.metrics.items() if isinstance(v, float) and not math.isfinite(v))
            if bad:
                what = ", ".join(f"{k}={obs.metrics[k]}" for k in bad)
                return Anomaly(Cause.DIVERGED, f"non-finite metric at iteration {obs.n}: {what}", obs.n)
        for metric, bound in t.divergence.items():
            v = obs.metrics.get(metric)
            if v is None:
                continue
            higher = spec_of(metric, self.specs).higher_is_better
            if (v < bound) if higher else (v > bound):
                rel = "<" if higher else ">"
                return Anomaly(
                    Cause.DIVERGED, f"{metric}={v:.6g} {rel} divergence bound {bound:g} at iteration {obs.n}",
                    obs.n,
                )
        for metric, v in obs.metrics.items():
            ref = self.reference.get(metric)
            f = t.divergence_factor
            if f and ref is not None and ref > 0 and v > f * ref:
                return Anomaly(
                    Cause.DIVERGED, f"{metric}={v:.6g} is more than {f:g} times its initial value {ref:.6g} at "
                    f"iteration {obs.n}: the loss blew up (a learning rate too high?)", obs.n,
                )
        return None

    def observe(self, obs: Observation) -> Firing | Anomaly | None:
        """Evaluate every rule on ``obs`` (all of them, so patience counters stay exact).

        When several rules fire at the same iteration, the first one that reached a result (performance,
        training error, requirements) is reported, else the first in order; the names of the
        others are listed in ``also``.
        """
        a = self.anomaly(obs)
        if a is not None:
            return a
        fired = [
            Firing(rule=r.name, kind=r.kind, iteration=obs.n, hits=[c.hit(obs.n) for c in r.conditions])
            for r in self.rules
            if r.step(obs)
        ]
        if not fired:
            return None
        main = next((f for f in fired if f.success), fired[0])
        main.also = [f.rule for f in fired if f is not main]
        return main
