"""The one small protocol every training engine speaks.

Control (``sluice.control``) drives engines only through this module: it never imports engine
internals, and no engine imports control. An engine runs one *iteration* at a time (a round in
horizontal FL, a step in split training, a step or epoch in local training) and reports it as an
:class:`IterationEvent`.

Besides the methods of :class:`Engine`, an engine may offer these capabilities, which the control plane
uses when present and refuses requirements for when absent:

* ``num_samples`` (int): training samples in use; ``limit_samples(n)``: use only ``n`` of them;
* ``num_layers`` (int): trainable layers of the model; ``set_trainable_layers(l)``: train only the last
  ``l`` of them;
* ``probe(k) -> float``: seconds per iteration, timed on ``k`` iterations without changing the model;
* ``default_iterations`` (int): the iteration limit its configuration implies (``train.rounds``...),
  used when the termination parameters give none;
* ``check_data(data)``: raise :class:`sluice.errors.DataError` when ``data`` cannot be added.
* ``set_min_samples(n)``: while it holds fewer than ``n`` samples, an iteration trains nothing and reports
  the anomaly ``INADEQUATE_TRAINING_DATA`` (the engine can wait for data: SPEC T6);
* ``checkpoint() -> bytes`` / ``restore(bytes)``: the whole training state as bytes and back.
* ``evaluate() -> dict``: metrics of the model as it is, without training it (before the first
  iteration: the initial losses that divergence is measured against).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sluice.metrics import MetricSpec


@dataclass
class ClientRound:
    """One client's part in one iteration of a federated engine (one per client the iteration sampled).

    ``client`` is its id (the terminal, in horizontal FL); ``samples`` the training samples it trained on,
    ``seconds`` its local training time and ``started_at`` when that training began (``time.time()`` of the
    host that trained: the client's own clock); ``metrics`` what it reported beside its upload
    (``train_loss``...). ``dropped``: it received the server's message (or was sampled and could not be
    reached) and uploaded nothing; then it trained on nothing (``samples`` 0, no metrics). ``resynced``: its
    message was a dense resynchronisation (it rejoined, or what it held was unknown).
    """

    client: int
    samples: int = 0
    seconds: float = 0.0
    started_at: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    dropped: bool = False
    resynced: bool = False


@dataclass
class IterationEvent:
    """What an engine reports after each iteration.

    ``metrics`` holds whatever the engine measured (``train_loss``, ``test_loss``, ``test_accuracy``,
    ``precision``, ``f1``...). Byte counts are lengths of encoded wire messages for this iteration.
    ``anomaly`` is set when the engine cannot go on as it is (``"INADEQUATE_TRAINING_DATA"``,
    ``"DIVERGED"``), with a human-readable ``detail``. A federated engine lists in ``clients`` the part each
    sampled client took (:class:`ClientRound`, in client order); the others leave it empty.
    """

    iteration: int
    metrics: dict[str, float] = field(default_factory=dict)
    bytes_up: int = 0
    bytes_down: int = 0
    seconds: float = 0.0
    anomaly: str | None = None
    detail: str = ""
    clients: list[ClientRound] = field(default_factory=list)


@runtime_checkable
class Engine(Protocol):
    """Lifecycle of a training engine.

    ``start`` prepares state (idempotent); ``iterate`` runs exactly one iteration and returns its event;
    ``stop`` releases resources; ``suspend``/``resume`` pause and continue without losing state;
    ``add_data`` hands the engine more training data (the inadequate-data loop);
    ``save`` writes the trained model and returns its path.

    ``metrics`` declares every metric the engine reports (name → :class:`sluice.metrics.MetricSpec`);
    ``counts_bytes`` says whether its events carry the bytes it sent and received.

    An engine made of parts that end on their own (a chain of producers) may also offer
    ``outcome() -> str``: how each part ended, read after ``save`` and added to the report's detail, so
    the report says it whichever criterion ended the training first.
    """

    @property
    def metrics(self) -> Mapping[str, MetricSpec]: ...

    @property
    def counts_bytes(self) -> bool: ...

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
