"""What a :class:`sluice.control.TrainingProcess` aims at and how its run ends.

:func:`goal_of` names the result the parameters ask for, :func:`estimator_for` builds the estimator of what
reaching it still takes, :func:`expected_iterations` how many iterations to plan for, and :func:`cause_of`
says why a criterion ended training (the causes are listed in :mod:`sluice.control.process`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sluice.control.eta import Estimator
from sluice.control.monitor import Firing, Monitor
from sluice.control.params import Cause, Requirements, Termination, spec_of
from sluice.metrics import MetricSpec


def goal_of(
    termination: Termination, requirements: Requirements | None, error_metric: str,
    specs: Mapping[str, MetricSpec] | None = None,
) -> tuple[str, float, str, int] | None:
    """The result training aims at, as ``(metric, target, mode, patience)``: the first performance target
    of the termination parameters, else of the requirements, else the training error threshold. The
    target to reach is the threshold passed by its ``min_delta``; ``mode`` comes from the metric's spec in
    ``specs`` (the engine's declared metrics; default: Sluice's known metrics)."""
    if termination.performance:
        m, c = next(iter(termination.performance.items()))
        mode = spec_of(m, specs).mode
        return m, c.threshold + (c.min_delta if mode == "max" else -c.min_delta), mode, c.patience
    if requirements is not None and requirements.performance:
        m, v = next(iter(requirements.performance.items()))
        return m, v, spec_of(m, specs).mode, 1
    if termination.training_error is not None:
        c = termination.training_error
        return error_metric, c.threshold - c.min_delta, "min", c.patience
    return None


def estimator_for(
    termination: Termination, requirements: Requirements | None, monitor: Monitor,
    past: Iterable[int] = (), history: Iterable[tuple[int, dict[str, float], float]] = (),
) -> Estimator:
    """The estimator of the goal of ``termination`` and ``requirements`` (budgets: the iterations, and the
    shorter of the training time and the requirements' maximum), told the ``past`` runs' iterations and fed
    the ``history`` of ``(iteration, metrics, seconds)`` so far."""
    t, r = termination, requirements
    specs = monitor.specs
    goal = goal_of(t, r, monitor.error_metric, specs)
    times = [x for x in (t.training_time_s, r.max_training_time_s if r else None) if x]
    est = Estimator(
        metric=goal[0] if goal else None, target=goal[1] if goal else None,
        mode=goal[2] if goal else "max", patience=goal[3] if goal else 1, iteration_budget=t.iterations,
        time_budget_s=min(times) if times else None,
        bounds=(specs[goal[0]].low, specs[goal[0]].high) if goal else (None, None),
        past=past,
    )
    for n, metrics, secs in history:
        est.add(n, metrics, secs)
    return est


def expected_iterations(expected: int | None, termination: Termination, requirements: Requirements | None,
                        monitor: Monitor) -> int | None:
    """The iterations a run is expected to take: ``expected`` when given, else the iteration budget when the
    parameters name no result (then the budget is the request), else unknown (None)."""
    if expected is not None:
        return expected
    if goal_of(termination, requirements, monitor.error_metric, monitor.specs) is None:
        return termination.iterations
    return None


def requirements_met(requirements: Requirements | None, latest: Mapping[str, float],
                     specs: Mapping[str, MetricSpec]) -> bool | None:
    """Whether the ``latest`` metrics meet the performance requirements (None: no requirements)."""
    return requirements.met_by(latest, specs) if requirements else None


def cause_of(
    d: Firing, termination: Termination, requirements: Requirements | None, latest: Mapping[str, float],
    n: int, monitor: Monitor,
) -> tuple[Cause, str]:
    """The cause, and its detail, when rule ``d`` ended training at iteration ``n`` with the ``latest``
    metrics: PERFORMANCE_NOT_MET when a requirement is not met, CRITERION_MET when ``d`` reached a result or
    the parameters define none, else BUDGET_EXHAUSTED."""
    r = requirements
    if r is not None and requirements_met(r, latest, monitor.specs) is False:
        unmet = ", ".join(f"{k} {latest.get(k, float('nan')):.4g} (needs {v:g})"
                          for k, v in r.performance.items())
        return Cause.PERFORMANCE_NOT_MET, f"{d.rule} ended training; performance requirement not met: {unmet}"
    if d.success or not termination.defines_result():
        seen = "; ".join(f"{h.metric} {h.observed:.6g} against {h.threshold:g}" for h in d.hits
                         if h.metric and h.observed is not None and h.threshold is not None)
        return Cause.CRITERION_MET, f"{d.rule} met at iteration {n}" + (f" ({seen})" if seen else "")
    goal = goal_of(termination, None, monitor.error_metric, monitor.specs)
    where = ""
    if goal is not None:
        got = latest.get(goal[0])
        where = f": {goal[0]} is {'n/a' if got is None else f'{got:.4g}'}, the target {goal[1]:g}"
    return Cause.BUDGET_EXHAUSTED, (f"{d.rule} ended training at iteration {n} before the result "
                                    f"was reached{where}")
