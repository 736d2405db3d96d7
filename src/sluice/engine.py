"""The one small protocol every training engine speaks.

Control (``sluice.control``) drives engines only through this module: it never imports engine
internals. An engine runs one *iteration* at a time (a round in horizontal FL, a step in split
training, a step or epoch in local training) and reports it as an :class:`IterationEvent`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class IterationEvent:
    """What an engine reports after each iteration.

    ``metrics`` holds whatever the engine measured (``train_loss``, ``test_loss``, ``test_accuracy``,
    ``precision``, ``f1``...). Byte counts are lengths of encoded wire messages for this iteration.
    ``anomaly`` is set when the engine cannot go on as it is (``"INADEQUATE_TRAINING_DATA"``,
    ``"DIVERGED"``), with a human-readable ``detail``.
    """

    iteration: int
    metrics: dict[str, float] = field(default_factory=dict)
    bytes_up: int = 0
    bytes_down: int = 0
    seconds: float = 0.0
    anomaly: str | None = None
    detail: str = ""


@runtime_checkable
class Engine(Protocol):
    """Lifecycle of a training engine.

    ``start`` prepares state (idempotent); ``iterate`` runs exactly one iteration and returns its event;
    ``stop`` releases resources; ``suspend``/``resume`` pause and continue without losing state;
    ``add_data`` hands the engine more training data (the inadequate-data loop);
    ``save`` writes the trained model and returns its path.
    """

    def start(self) -> None: ...

    def iterate(self) -> IterationEvent: ...

    def stop(self) -> None: ...

    def suspend(self) -> None: ...

    def resume(self) -> None: ...

    def add_data(self, data: Any) -> None: ...

    def save(self, path: str) -> str: ...


class Suspendable:
    """The suspend/resume/stop part of :class:`Engine` for engines whose pause is just a flag."""

    _suspended: bool = False

    def stop(self) -> None:
        self._suspended = False

    def suspend(self) -> None:
        self._suspended = True

    def resume(self) -> None:
        self._suspended = False
