"""Replay a recorded metric stream as an engine: "when would these parameters have stopped that run?"

:class:`ReplayEngine` speaks :mod:`sluice.engine` and returns the recorded events one per iteration
(from a list of metric dicts, :class:`IterationEvent` s, or the ``metrics.jsonl`` of a run directory).
Its :attr:`clock` advances by each event's ``seconds``, so time criteria and estimates replay
deterministically when the process is given ``clock=engine.clock``.

``initial`` plays the metrics of the untrained model (:meth:`ReplayEngine.evaluate`). Like every engine
it declares the metrics it reports (:attr:`ReplayEngine.metrics`): those of the stream
that Sluice knows (:data:`sluice.metrics.KNOWN`), plus the specs passed as ``metrics`` for any other.
A metric of the stream that is neither is replayed but cannot be a criterion.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sluice.engine import IterationEvent
from sluice.errors import DataError, TrainingError
from sluice.metrics import KNOWN, MetricSpec

_EVENT_KEYS = {"iteration", "round", "step", "bytes_up", "bytes_down", "cum_bytes_up", "cum_bytes_down",
               "seconds", "anomaly", "detail"}


class ReplayClock:
    """A clock that only moves when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _event(i: int, item: Any, default_seconds: float) -> IterationEvent:
    if isinstance(item, IterationEvent):
        return item
    if not isinstance(item, Mapping):
        raise DataError(f"record {i} must be a metrics dict or an IterationEvent, not {type(item).__name__}")
    metrics = item.get("metrics")
    if metrics is None:
        metrics = {k: float(v) for k, v in item.items()
                   if k not in _EVENT_KEYS and isinstance(v, int | float) and not isinstance(v, bool)}
    return IterationEvent(
        iteration=int(item.get("iteration", item.get("round", i + 1))), metrics=dict(metrics),
        bytes_up=int(item.get("bytes_up", 0)), bytes_down=int(item.get("bytes_down", 0)),
        seconds=float(item.get("seconds", default_seconds)), anomaly=item.get("anomaly"),
        detail=str(item.get("detail", "")),
    )


class ReplayEngine:
    """Returns recorded events in order; ``add_data`` runs a callback (or is recorded) for data-loop tests."""

    def __init__(self, records: Iterable[Any], seconds_per_iteration: float = 1.0,
                 metrics: Iterable[MetricSpec] = (), counts_bytes: bool = True,
                 initial: Mapping[str, float] | None = None) -> None:
        self.events = [_event(i, r, seconds_per_iteration) for i, r in enumerate(records)]
        self.clock = ReplayClock()
        self.calls = 0
        self.started = self.stopped = False
        self.suspended = False
        self.data: list[Any] = []
        self.saved: list[str] = []
        names = {k for e in self.events for k in e.metrics}
        self.metrics: dict[str, MetricSpec] = {n: KNOWN[n] for n in sorted(names) if n in KNOWN}
        self.metrics.update({m.name: m for m in metrics})
        self.counts_bytes = counts_bytes
        self.initial = dict(initial or {})

    @classmethod
    def from_run(cls, run_dir: str | Path, metrics: Iterable[MetricSpec] = ()) -> ReplayEngine:
        """Replay the ``metrics.jsonl`` of a run directory (``metrics``: specs of metrics Sluice does not know)."""
        from sluice.runs import read_metrics

        path = Path(run_dir) / "metrics.jsonl"
        if not path.is_file():
            raise DataError(f"no metrics.jsonl in {run_dir}")
        return cls(read_metrics(path), metrics=metrics)

    def start(self) -> None:
        self.started = True

    def evaluate(self) -> dict[str, float]:
        """The metrics of the model before training, as given by ``initial`` (empty when not given)."""
        return dict(self.initial)

    def iterate(self) -> IterationEvent:
        if self.suspended:
            raise TrainingError("the engine is suspended: resume() it first")
        if self.calls >= len(self.events):
            raise TrainingError(f"the recorded stream has only {len(self.events)} iterations")
        ev = self.events[self.calls]
        self.calls += 1
        self.clock.advance(ev.seconds)
        return ev

    def stop(self) -> None:
        self.stopped = True

    def suspend(self) -> None:
        self.suspended = True

    def resume(self) -> None:
        self.suspended = False

    def add_data(self, data: Any) -> None:
        self.data.append(data)

    def save(self, path: str) -> str:
        self.saved.append(str(path))
        return str(path)
