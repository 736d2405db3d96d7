"""Feasibility before training (R3): refuse hopeless training early, without training.

Checked from what the producer knows before it trains: the training samples it holds, the layers of its
model, and the time one iteration takes (a short probe). With ``S`` samples available, requirement
bounds ``[min, max]`` and wanted amount ``D``; ``L`` model layers and ``l`` layers to train; ``t`` seconds
per iteration, ``N`` iterations expected and a time limit ``T``:

* ``S < min`` or ``S < D`` → ``INSUFFICIENT_TRAINING_SAMPLES``;
* ``l > L`` → the request is invalid for this model (:class:`NegotiationError`);
* ``t · N > T`` (or ``t > T`` when ``N`` is unknown) → ``INSUFFICIENT_COMPUTE``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.control.params import Cause, Requirements
from sluice.errors import NegotiationError


@dataclass(frozen=True)
class Feasibility:
    """Verdict: ``feasible``, else the failure ``cause`` and a ``detail`` with the numbers."""

    feasible: bool
    cause: Cause | None = None
    detail: str = ""
    samples_to_use: int | None = None

    @staticmethod
    def ok(samples_to_use: int | None = None, detail: str = "") -> Feasibility:
        return Feasibility(True, None, detail, samples_to_use)


def check_data(requirements: Requirements, available_samples: int | None) -> Feasibility:
    """Data amount vs requirement; ``samples_to_use`` = min(D or S, max) when feasible."""
    r = requirements
    if available_samples is None:
        return Feasibility.ok(detail="available samples unknown; data amount not checked")
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
