"""Feasibility before training (R3): refuse hopeless training early, without training.

:func:`preflight` is the one check, used by :class:`sluice.control.TrainingProcess` before its first
iteration and by :meth:`sluice.roles.Producer.assess` before a request is accepted. It judges from what
the producer knows before it trains, and prepares the engine for the requirements. With ``S`` samples
held, requirement bounds ``[min, max]`` and wanted amount ``D``; ``L`` model layers and ``l`` layers to
train; ``t`` seconds per iteration, ``N`` iterations expected and a time limit ``T``:

* ``S < max(min, D)``: when the process can take more data (``wait_for_data``: it waits for data a
  while or has a data provider) and the engine can wait for it (``set_min_samples``), the engine is told
  to wait for ``max(min, D)`` samples, so training reports ``INADEQUATE_TRAINING_DATA`` and waits (T6);
  otherwise → ``INSUFFICIENT_TRAINING_SAMPLES``;
* else the engine uses ``min(D or S, max)`` samples (``limit_samples``) when that is fewer than ``S``;
* ``l > L`` → the request is invalid for this model (:class:`NegotiationError`); else only the last
  ``l`` layers train (``set_trainable_layers``);
* ``t · N > T`` (or ``t > T`` when ``N`` is unknown) → ``INSUFFICIENT_COMPUTE`` (``t`` from ``probe``; not
  judged while the engine waits for data).

A requirement the engine cannot honour (it cannot count its samples or layers, limit its samples or
freeze layers) is refused with a :class:`NegotiationError` naming the requirement to drop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.control.params import Cause, Requirements
from sluice.errors import NegotiationError

DATA_KEYS = ("data_amount", "min_data_amount", "max_data_amount")
"""The requirements on the amount of training data."""


@dataclass(frozen=True)
class Feasibility:
    """Verdict: ``feasible``, else the failure ``cause`` and a ``detail`` with the numbers.

    ``samples_to_use``: the samples the engine was limited to; ``awaits_samples``: the samples the engine
    was told to wait for (training starts by waiting for data)."""

    feasible: bool
    cause: Cause | None = None
    detail: str = ""
    samples_to_use: int | None = None
    awaits_samples: int | None = None

    @staticmethod
    def ok(samples_to_use: int | None = None, detail: str = "") -> Feasibility:
        return Feasibility(True, None, detail, samples_to_use)


def preflight(
    engine: Any,
    requirements: Requirements | None,
    expected_iterations: int | None = None,
    probe_iterations: int = 2,
    *,
    wait_for_data: bool = False,
) -> Feasibility:
    """Judge whether ``engine`` (started) can meet ``requirements`` and set it up for them (see the module
    docstring); ``expected_iterations`` is ``N``, ``probe_iterations`` the iterations ``probe`` times,
    ``wait_for_data`` whether the process can take more data while training waits."""
    r = requirements
    if r is None:
        return Feasibility.ok()
    name = type(engine).__name__
    check_layers(r, getattr(engine, "num_layers", None) if r.layers is not None else None)
    if r.layers is not None and not hasattr(engine, "set_trainable_layers"):
        raise NegotiationError(f"the requirement asks to train the last {r.layers} layers but {name} cannot "
                               "freeze layers; drop requirements.layers")
    verdict = _plan_data(engine, r, wait_for_data)
    if not verdict.feasible:
        return verdict
    if r.layers is not None:
        engine.set_trainable_layers(r.layers)
    if r.max_training_time_s is None or not hasattr(engine, "probe") or verdict.awaits_samples is not None:
        return verdict
    compute = check_compute(r, float(engine.probe(max(1, probe_iterations))), expected_iterations)
    return compute if not compute.feasible else verdict


def _plan_data(engine: Any, r: Requirements, wait_for_data: bool) -> Feasibility:
    asked = [k for k in DATA_KEYS if getattr(r, k) is not None]
    if not asked:
        return Feasibility.ok()
    name = type(engine).__name__
    held = getattr(engine, "num_samples", None)
    if held is None:
        raise NegotiationError(f"the requirement sets {', '.join(asked)} but {name} cannot say how many "
                               f"training samples it holds; drop requirements.{asked[0]}")
    verdict = check_data(r, int(held))
    if not verdict.feasible:
        need = max(r.min_data_amount or 0, r.data_amount or 0)
        if not wait_for_data or not hasattr(engine, "set_min_samples"):
            return verdict
        engine.set_min_samples(need)
        return Feasibility(True, None, f"{held} training samples held, {need} needed: training waits for more "
                           "data", awaits_samples=need)
    use = verdict.samples_to_use
    if use is not None:
        if not hasattr(engine, "limit_samples"):
            raise NegotiationError(f"the requirement asks to train on {use} of the {held} samples held but "
                                   f"{name} cannot limit its training samples; drop requirements.data_amount "
                                   "and requirements.max_data_amount")
        engine.limit_samples(use)
    return verdict


def check_data(requirements: Requirements, available_samples: int) -> Feasibility:
    """Data amount vs requirement; ``samples_to_use`` = min(D or S, max) when feasible and fewer than S."""
    r = requirements
    s = available_samples
    if r.min_data_amount is not None and s < r.min_data_amount:
        return Feasibility(False, Cause.INSUFFICIENT_TRAINING_SAMPLES,
                           f"{s} training samples available, the requirement asks for at least "
                           f"{r.min_data_amount}")
    if r.data_amount is not None and s < r.data_amount:
        return Feasibility(False, Cause.INSUFFICIENT_TRAINING_SAMPLES,
                           f"{s} training samples available, the requirement asks for {r.data_amount}")
    use = r.data_amount if r.data_amount is not None else s
    if r.max_data_amount is not None:
        use = min(use, r.max_data_amount)
    return Feasibility.ok(use if use != s else None)


def check_layers(requirements: Requirements, num_layers: int | None) -> None:
    """Raise :class:`NegotiationError` when more layers are asked for than the model has."""
    layers = requirements.layers
    if layers is None:
        return
    if num_layers is None:
        raise NegotiationError(
            f"the requirement asks to train {layers} layers but this engine cannot say how many layers "
            "its model has; drop requirements.layers"
        )
    if layers > num_layers:
        raise NegotiationError(
            f"the requirement asks to train {layers} layers but the model has {num_layers}; "
            f"allowed: 1..{num_layers}"
        )


def check_compute(
    requirements: Requirements, seconds_per_iteration: float | None, expected_iterations: int | None
) -> Feasibility:
    """Projected training time vs the maximum training time."""
    limit = requirements.max_training_time_s
    if limit is None or seconds_per_iteration is None:
        return Feasibility.ok()
    t = seconds_per_iteration
    if expected_iterations is not None:
        projected = t * expected_iterations
        if projected > limit:
            return Feasibility(False, Cause.INSUFFICIENT_COMPUTE,
                               f"{expected_iterations} iterations at {t:.3g} s each need about "
                               f"{projected:.3g} s, more than the maximum training time {limit:g} s")
        return Feasibility.ok(detail=f"projected {projected:.3g} s of {limit:g} s")
    if t > limit:
        return Feasibility(False, Cause.INSUFFICIENT_COMPUTE,
                           f"one iteration takes {t:.3g} s, more than the maximum training time {limit:g} s")
    return Feasibility.ok()
