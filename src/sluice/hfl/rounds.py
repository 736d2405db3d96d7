"""The round of horizontal FL, written once for every runtime, and what an HFL engine whose server half holds the
model has in common.

:meth:`ServerModel.iterate` is the round: the engine samples the round's clients (``numpy.random.default_rng(seed)``:
``choice`` of ``m = max(1, round(q·n))`` of the ``n`` clients, sorted, then ``m`` uniform draws, a client failing
mid-round when its draw is below ``train.dropout``), exchanges messages with them (:meth:`ServerModel._exchange`:
the one part each runtime does its own way — in process one by one or trained together, :mod:`sluice.hfl.engine`;
over Flower's grid on a deployment or on the Simulation Engine, :mod:`sluice.runtimes.flower.engine`), closes the
round on the server, delivers the anchor broadcast when the server made one (:meth:`ServerModel._broadcast`, counted
once per client), and returns the round's event: ``participants``, ``dropped`` and the exchange's own metrics, the
uploads' weighted train loss and, every ``train.eval_every`` rounds, the server model's test metrics.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from sluice.engine import ClientRound, IterationEvent
from sluice.errors import TrainingError
from sluice.hfl.config import HFLConfig
from sluice.hfl.fit import StallWatch, fit_compression
from sluice.hfl.learner import Learner
from sluice.models import num_params

if TYPE_CHECKING:
    from sluice.tasks import Task


@dataclass
class Exchanged:
    """What a round's exchange brought back: Sluice's bytes up and down, the uploads' weights and train losses,
    every sampled client's part (in client order), how many dropped, and the runtime's own metrics."""

    bytes_up: int = 0
    bytes_down: int = 0
    weights: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    parts: list[ClientRound] = field(default_factory=list)
    dropped: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


def client_metrics(train_loss: float | None) -> dict[str, float]:
    """What a client reports beside its upload, as its :class:`~sluice.engine.ClientRound` metrics."""
    return {} if train_loss is None else {"train_loss": float(train_loss)}


class ServerModel:
    """The round (:meth:`iterate`), ``save``, ``params`` and ``num_params`` of an HFL engine whose server half holds
    the model: the engine's ``start`` builds ``server`` (its ``params``, ``buffers`` and ``round``), ``learner``
    (the task's model on the device, :class:`~sluice.hfl.learner.Learner`) and ``data``, ``cfg`` is its
    :class:`HFLConfig`, ``_rng`` samples the rounds, ``_population()`` is the number of clients, ``_exchange``
    and ``_broadcast`` move the round's messages, and ``_evaluate()`` gives the server model's test metrics."""

    _notes: list[str]
    _watch: StallWatch | None = None

    # -- the round -----------------------------------------------------------------------------
    def iterate(self) -> IterationEvent:
        """One round (see the module docstring): the round's event, with the uploads' train loss (weighted by
        their sample counts), every ``train.eval_every`` rounds the server model's test metrics, each sampled
        client's part, and DIVERGED when a loss is not finite."""
        self.start()
        if self._suspended:
            raise TrainingError("the engine is suspended: resume() it before the next round")
        t0 = time.perf_counter()
        refused = self._refusal()
        if refused is not None:
            return IterationEvent(iteration=self.server.round, seconds=time.perf_counter() - t0,
                                  anomaly=refused[0], detail=refused[1])
        rnd = self.server.round + 1
        tr = self.cfg.train
        m = max(1, round(tr.participation * self._population()))
        sampled = np.sort(self._rng.choice(self._population(), size=m, replace=False))
        failed = self._rng.random(m) < tr.dropout
        got = self._exchange(rnd, sampled, failed)
        broadcast = self.server.close_round()
        if broadcast is not None:
            got.bytes_down += self._broadcast(broadcast)
        metrics = {"participants": float(len(got.losses)), "dropped": float(got.dropped), **got.metrics}
        if got.losses and sum(got.weights) > 0:
            metrics["train_loss"] = float(np.average(got.losses, weights=got.weights))
        if rnd % tr.eval_every == 0:
            metrics.update(self._evaluate())
            note = self._watch.observe(rnd, metrics) if self._watch is not None else None
            if note:
                self._notes.append(note)
        anomaly, detail = None, ""
        bad = [k for k in ("train_loss", "test_loss") if k in metrics and not math.isfinite(metrics[k])]
        if bad:
            anomaly, detail = "DIVERGED", f"{bad[0]} is {metrics[bad[0]]} at round {rnd}"
        return IterationEvent(iteration=rnd, metrics=metrics, bytes_up=got.bytes_up, bytes_down=got.bytes_down,
                              seconds=time.perf_counter() - t0, anomaly=anomaly, detail=detail, clients=got.parts)

    def _refusal(self) -> tuple[str, str] | None:
        """``(anomaly, detail)`` when the round cannot train (it is then no iteration), else None."""
        return None

    def _population(self) -> int:
        """The number of clients a round samples from."""
        raise NotImplementedError

    def _exchange(self, rnd: int, sampled: np.ndarray, failed: np.ndarray) -> Exchanged:
        """Round ``rnd``'s messages to the clients ``sampled`` (``failed``: which of them fail mid-round) and
        their uploads handed to the server."""
        raise NotImplementedError

    def _broadcast(self, anchor: bytes) -> int:
        """Deliver the round's anchor broadcast to every client; the bytes down it costs."""
        raise NotImplementedError

    def _fit(self, task: Task, learner: Learner) -> HFLConfig:
        """The configuration with the compression fitted to ``task`` (:func:`sluice.hfl.fit.fit_compression`),
        which becomes the engine's; starts the run's notes and its :class:`~sluice.hfl.fit.StallWatch`."""
        self.cfg, self._notes = fit_compression(self.cfg, task, learner.model)
        c = self.cfg.compression
        self._watch = StallWatch(task, compressed=c.up != "dense" or c.down != "dense")
        return self.cfg

    def notes(self) -> list[str]:
        """What the engine chose for this task, or noticed while training, in the order it said it."""
        return list(getattr(self, "_notes", []))

    def save(self, path: str | Path) -> str:
        """The server model as a CPU ``state_dict`` (loads into the task's model on any device), with its flat
        parameters, the task's name and the round, by ``torch.save``."""
        self.start()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.learner.load(self.server.params, self.server.buffers)
        state = {k: v.detach().cpu().clone() for k, v in self.learner.model.state_dict().items()}
        torch.save({"state_dict": state, "params": torch.from_numpy(self.server.params.copy()),
                    "task": self.data.name, "round": self.server.round}, path)
        return str(path)

    @property
    def params(self) -> np.ndarray:
        """The server model."""
        self.start()
        return self.server.params

    @property
    def num_params(self) -> int:
        self.start()
        return num_params(self.learner.model)

    @property
    def default_iterations(self) -> int:
        """``train.rounds``: the round limit when the termination parameters give none (the engine itself
        never stops there)."""
        return self.cfg.train.rounds

    @property
    def num_layers(self) -> int:
        """Layers of the model that hold parameters (:func:`sluice.models.layers`)."""
        self.start()
        return self.learner.num_layers
