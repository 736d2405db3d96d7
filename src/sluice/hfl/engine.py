"""Horizontal FL simulator: one :class:`Server`, many :class:`Client` objects, bytes between them (SPEC C1–C5).

The simulator owns no part of the algorithm. Every round it samples a fraction q of the clients (with
``numpy.random.default_rng(seed)``: ``choice`` of ``m = max(1, round(q·n))`` clients, then ``m`` uniform
draws, a client failing mid-round when its draw is below ``dropout``), hands each sampled client the
server's message for it (with ``compression.up_by_weight``, also its upload's k/d, from the sample
counts of the round's sampled clients), maps the client half over them (a failed client receives its
message and uploads nothing), passes the uploads to the server with the client's sample count as weight,
closes the round, delivers the anchor broadcast to every client when there is one, and evaluates the
server model on the test set. Bytes counted are ``len()`` of the messages exchanged (an anchor broadcast
once per client). A networked runtime drives the same two halves; only the transport differs.

With ``train.batched_clients`` the clients of a round that do not fail train together
(:mod:`sluice.hfl.batched`): every sampled client still gets its message and syncs in client order (with
Sluice's server the round's messages are made by :meth:`Server.messages`, which encodes each different one once:
the same bytes, and clients given the same bytes object decode it once), then one batched computation trains them
all, then each encodes its upload with its own compressor and the server
receives them in client order; on the CPU the bytes and the accuracy are those of one by one. A task that
cannot train together trains one by one, with a note said once.

Each round's event lists every sampled client's part (:class:`sluice.engine.ClientRound`, in client order):
its sample count, local training time (``client.train``, timed; trained together: its share of the batched
training plus its own encoding) and train loss, or ``dropped`` for a client
that failed; the control plane adds them up into the report's ``clients``.

Data requirements: :meth:`HFLEngine.limit_samples` keeps the first ``m_c`` samples of each client with
``Σ m_c = n`` (see there); :meth:`HFLEngine.set_min_samples` makes a round with fewer samples than
asked report ``INADEQUATE_TRAINING_DATA`` instead of training.
"""

from __future__ import annotations

import numbers
import time
from typing import Any

import numpy as np
import torch

from sluice.engine import ClientRound, Suspendable
from sluice.errors import ConfigError, DataError, TaskError
from sluice.hfl.batched import Batching
from sluice.hfl.client import Client
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.hfl.rounds import Exchanged, ServerModel, client_metrics
from sluice.hfl.server import Server
from sluice.metrics import MetricSpec
from sluice.tasks import Task, client_datasets, load_task
from sluice.tasks.resolve import Federation
from sluice.tasks.task import batch, sample_shape
from sluice.wire.state import field, pack, unpack


class HFLEngine(ServerModel, Suspendable):
    """Implements :class:`sluice.engine.Engine` for horizontal FL; one iteration is one round.

    ``server_cls`` and ``client_cls`` are the two halves it drives (Sluice's :class:`Server` and
    :class:`Client` by default). Any pair with the same constructors, ``message``/``receive``/``close_round``
    and ``sync``/``train``/``receive_anchor``/``train_loss``, and ``state_bytes``/``from_state_bytes`` runs
    under the same sampling, data and byte accounting: that is how other compression methods are compared
    with Sluice's on equal terms (:mod:`sluice.hfl.baselines`).
    """

    def __init__(self, cfg: HFLConfig, task: Task | None = None, *,
                 server_cls: type = Server, client_cls: type = Client) -> None:
        self.cfg = cfg
        self.task = task
        self.data: Federation | None = None
        self.server_cls, self.client_cls = server_cls, client_cls
        self.server: Server | None = None
        self.clients: list[Client] = []
        self._min_samples = 0
        self._trainable: int | None = None
        self._suspended = False
        self._batching: Batching | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self.server is not None:
            return
        cfg = self.cfg
        torch.set_num_threads(1)
        task = self._task()
        learner = Learner(task, cfg.seed, cfg.train.device)
        cfg = self._fit(task, learner)
        extra = {}
        if learner.num_buffers:
            if not (getattr(self.server_cls, "carries_buffers", False) and getattr(self.client_cls, "carries_buffers",
                                                                                    False)):
                raise TaskError(f"task {task.name!r}: its model has buffers (BatchNorm statistics), which "
                                f"{self.server_cls.__name__} does not carry; use Sluice's server and client")
            extra["buffers"] = learner.buffers0
        self.data = Federation(task, learner.check(client_datasets(task, cfg.data, seed=cfg.seed)))
        self.learner, self.theta0 = learner, learner.theta0
        self.server = self.server_cls(cfg, self.theta0, len(self.data.clients), output_layer=learner.output_layer,
                                      **extra)
        self.clients = [self.client_cls(cfg, c, learner) for c in range(len(self.data.clients))]
        for client in self.clients:
            client.set_trainable_layers(self._trainable)
        self._rng = np.random.default_rng(cfg.seed)
        self._batching = Batching(learner, cfg, self.client_cls, self._notes, task.name)

    def _task(self) -> Task:
        """The task this engine trains (built from the configuration on first use)."""
        if self.task is None:
            cfg = self.cfg
            self.task = load_task(cfg.task, seed=cfg.seed, data=cfg.data, hidden=cfg.model.hidden)
        return self.task

    @property
    def metrics(self) -> dict[str, MetricSpec]:
        """``train_loss``, the test metrics of the task and its own metrics (a scenario's type-specific errors),
        plus ``participants`` and ``dropped``."""
        extra = [MetricSpec("participants", True, 0.0), MetricSpec("dropped", False, 0.0)]
        return self._task().declared_metrics(extra)

    counts_bytes = True

    # -- data ---------------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Training samples held by all clients together."""
        self.start()
        return sum(self.data.sizes)

    def limit_samples(self, n: int) -> None:
        """Use only ``n`` training samples in total, keeping every client's share.

        With ``N`` samples held and ``n_c`` by client c, client c keeps its first ``m_c`` samples:
        ``m_c = ⌊n·n_c/N⌋``, plus one for the ``n − Σ⌊n·n_c/N⌋`` clients with the largest remainders
        ``n·n_c/N − ⌊n·n_c/N⌋`` (ties to the lower id), so ``Σ m_c = n`` exactly. The samples left out
        are dropped (a later limit can only lower the total); data added afterwards is used in full.
        ``n ≥ N`` changes nothing.
        """
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ConfigError(f"sample limit must be an integer >= 1, got {n!r}")
        self.start()
        sizes = np.asarray(self.data.sizes, dtype=np.int64)
        total = int(sizes.sum())
        if n >= total:
            return
        exact = [int(n) * int(s) for s in sizes]  # n·n_c, divided by N below (integers: no rounding)
        keep = [e // total for e in exact]
        order = sorted(range(len(sizes)), key=lambda c: (-(exact[c] % total), c))
        for c in order[: int(n) - sum(keep)]:
            keep[c] += 1
        self.data.limit(keep)

    def set_min_samples(self, n: int) -> None:
        """While the clients together hold fewer than ``n`` samples, a round trains nothing and reports
        ``INADEQUATE_TRAINING_DATA`` (:meth:`add_data` lifts it)."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ConfigError(f"minimum sample count must be an integer >= 0, got {n!r}")
        self._min_samples = int(n)

    def check_data(self, data: Any) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Check data for :meth:`add_data` — ``(client, X, y)`` or a list of such triples — and return it
        as (client id, ``X`` of shape (k, *input shape), ``y``) triples: for classification int64 class ids
        ``(k,)``, for regression float32 targets ``(k, targets)`` (1-D with one target). Rows are given in
        natural units and returned as the model takes them (a built-in scenario standardises them).

        Raises :class:`DataError` saying what is wrong: a client id outside ``[0, num_clients)``, ``X`` whose
        samples do not have the task's input shape (one sample without the batch axis is accepted), ``y`` not
        one label (or row of targets) per sample, labels that are not integers in ``[0, num_classes)``,
        non-finite values, or ``X`` and ``y`` of different lengths.
        """
        self.start()
        items = [data] if isinstance(data, tuple) else data
        if not isinstance(items, list) or not items:
            raise DataError("HFL data to add is a (client, X, y) triple or a non-empty list of them")
        shape, target_dtype = sample_shape(self.data.clients[0])
        out = []
        for item in items:
            if not isinstance(item, tuple | list) or len(item) != 3:
                raise DataError(f"HFL data to add is a (client, X, y) triple, got {type(item).__name__}")
            c, X, y = item
            n = len(self.data.clients)
            if isinstance(c, bool) or not isinstance(c, numbers.Integral) or not 0 <= c < n:
                raise DataError(f"client must be an integer in [0, {n}), got {c!r}")
            try:
                X = np.asarray(X, dtype=np.float32)
                y_raw = np.asarray(y, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise DataError(f"X and y must be numeric arrays: {exc}") from None
            if X.shape == shape:
                X = X.reshape(1, *shape)
            if X.shape[1:] != shape:
                what = f"{shape[0]} features" if len(shape) == 1 else f"inputs of shape {shape}"
                raise DataError(f"X must have shape (samples, {', '.join(map(str, shape))}): the model takes "
                                f"{what}, got shape {X.shape}")
            if not np.isfinite(X).all():
                raise DataError("X holds non-finite values (NaN or infinity); every feature must be finite")
            y_out = _targets(X, y_raw, self.num_classes, self.data.task.target_names) if torch.is_floating_point(
                torch.empty(0, dtype=target_dtype)) else _labels(X, y_raw, self.num_classes)
            prepare = self.data.task.prepare
            out.append((int(c), *(prepare(X, y_out) if prepare is not None else (X, y_out))))
        return out

    @property
    def num_classes(self) -> int:
        """The model's output width: classes of a classifier, targets of a regression."""
        self.start()
        x, _ = batch(self.data.clients[0], torch.zeros(1, dtype=torch.int64))
        with torch.no_grad():
            self.learner.model.eval()
            out = self.learner.model(x.to(self.learner.device))
        return int(out.reshape(1, -1).shape[1])

    def add_data(self, data: Any) -> None:
        """Add samples to clients: ``(client, X, y)`` or a list of such triples (checked first: nothing is
        added when any of them is wrong)."""
        for c, X, y in self.check_data(data):
            self.data.add(c, X, y)

    # -- requirements -----------------------------------------------------------------------------
    def set_trainable_layers(self, layers: int) -> None:
        """Every client trains only the last ``layers`` layers; the earlier ones stay frozen in local
        training (their update is exactly zero, so the server never moves them)."""
        self.start()
        self._trainable = self.learner.check_layers(layers)
        for client in self.clients:
            client.set_trainable_layers(self._trainable)

    def probe(self, iterations: int = 2) -> float:
        """Seconds per round, timed on a copy of this engine (this engine is left untouched)."""
        self.start()
        scratch = HFLEngine(self.cfg, self.task, server_cls=self.server_cls, client_cls=self.client_cls)
        scratch.restore(self.checkpoint())
        t0 = time.perf_counter()
        for _ in range(max(1, iterations)):
            scratch.iterate()
        return (time.perf_counter() - t0) / max(1, iterations)

    # -- one round (the loop: sluice.hfl.rounds) ------------------------------------------------
    def _refusal(self) -> tuple[str, str] | None:
        have = self.num_samples
        if have < self._min_samples:
            return "INADEQUATE_TRAINING_DATA", (f"the clients hold {have} training samples, at least "
                                                f"{self._min_samples} needed")
        return None

    def _population(self) -> int:
        return len(self.data.clients)

    def _broadcast(self, anchor: bytes) -> int:
        for client in self.clients:  # every client patches its copy of the last anchor
            client.receive_anchor(anchor)
        return len(self.clients) * len(anchor)

    def _exchange(self, rnd: int, sampled: np.ndarray, failed: np.ndarray) -> Exchanged:
        """The sampled clients' part of round ``rnd``: each gets its message, trains (one by one, or together:
        :mod:`sluice.hfl.batched`) and uploads, in client order."""
        server, data, sizes = self.server, self.data, self.data.sizes
        got = Exchanged(dropped=int(failed.sum()))
        budget = {}  # k/d per upload, only when the budget follows the clients' weights
        if self.cfg.compression.weighted_uploads:
            shares = self.cfg.compression.up_shares([sizes[c] for c in sampled.tolist()])
            budget = {c: {"up_ratio": r} for c, r in zip(sampled.tolist(), shares, strict=True)}
        together = self._batching.together(sampled, failed, self.clients, data.clients)

        def take(c: int, upload: bytes, seconds: float, started: float) -> None:
            got.parts[slot[c]] = ClientRound(c, int(sizes[c]), seconds, started,
                                             client_metrics(self.clients[c].train_loss))
            got.bytes_up += len(upload)
            server.receive(c, upload, float(sizes[c]))
            got.weights.append(float(sizes[c]))
            got.losses.append(self.clients[c].train_loss)

        slot = {c: i for i, c in enumerate(sampled.tolist())}
        msgs = self._batching.messages(server, sampled.tolist()) if together is not None else None
        for i, (c, fails) in enumerate(zip(sampled.tolist(), failed.tolist(), strict=True)):
            msg = server.message(c) if msgs is None else msgs[i]
            got.bytes_down += len(msg)
            client = self.clients[c]
            got.parts.append(ClientRound(c, dropped=True))
            if fails:  # it received the model, then failed before uploading
                client.sync(msg)
            elif together is not None:  # it trains below, together with the round's other clients
                together.add(c, client.sync(msg))
            else:
                started, t_client = time.time(), time.perf_counter()
                upload = client.train(msg, data.clients[c], rnd, **budget.get(c, {}))
                take(c, upload, time.perf_counter() - t_client, started)
        if together is not None:  # uploads in client order, as one by one
            for c, upload, seconds, started in together.run(rnd, budget):
                take(c, upload, seconds, started)
        return got

    def _evaluate(self) -> dict[str, float]:
        """Test metrics of the server model (:meth:`sluice.hfl.learner.Learner.evaluate`)."""
        return self.learner.evaluate(self.server.params, self.server.buffers, self.data.task.test)

    # -- checkpoint ---------------------------------------------------------------------------
    def checkpoint(self) -> bytes:
        """The whole simulation as bytes: the server's and every client's state, the sampling RNG, the
        samples each client holds (how many of its own, and those added) and the settings
        (:meth:`limit_samples`, :meth:`set_min_samples`, :meth:`set_trainable_layers`). The task comes from
        the configuration."""
        self.start()
        return pack({"kind": "hfl-simulator", "server": self.server.state_bytes(),
                     "clients": [c.state_bytes() for c in self.clients], "rng": self._rng.bit_generator.state,
                     "data": self.data.tree(), "min_samples": self._min_samples,
                     "trainable_layers": self._trainable})

    def restore(self, buf: bytes) -> None:
        """Continue from a :meth:`checkpoint` taken under the same configuration."""
        server, clients, rng, data, min_samples, trainable = field(
            unpack(buf), "hfl-simulator", "server", "clients", "rng", "data", "min_samples", "trainable_layers")
        self.start()
        if len(clients) != len(self.clients):
            raise ConfigError(f"the checkpoint holds {len(clients)} clients, this federation has {len(self.clients)}")
        self.data = self.data.restored(data)
        self.server = self.server_cls.from_state_bytes(self.cfg, server)
        self.clients = [self.client_cls.from_state_bytes(self.cfg, b, self.learner) for b in clients]
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = rng
        self._min_samples, self._trainable = int(min_samples), trainable


def _labels(X: np.ndarray, y: np.ndarray, nc: int) -> np.ndarray:
    """Class ids checked (one finite integer in ``[0, nc)`` per sample) as int64."""
    if y.ndim != 1:
        raise DataError(f"y must be 1-D (one label per sample), got shape {y.shape}")
    if len(X) != len(y):
        raise DataError(f"X has {len(X)} rows but y has {len(y)} labels")
    if not np.isfinite(y).all():
        raise DataError("y holds non-finite values (NaN or infinity); labels are integers")
    if np.any(y != np.round(y)) or np.any((y < 0) | (y >= nc)):
        raise DataError(f"labels must be integers in [0, {nc}), got values from {y.min():g} to {y.max():g}")
    return y.astype(np.int64)


def _targets(X: np.ndarray, y: np.ndarray, k: int, target_names: list[str] | None) -> np.ndarray:
    """Regression targets checked (one finite row of ``k`` targets per sample) as float32."""
    if y.ndim == 1 and k == 1:
        y = y.reshape(-1, 1)
    if y.ndim != 2 or y.shape[1] != k:
        names = f" ({', '.join(target_names)})" if target_names else ""
        raise DataError(f"y must have shape (samples, {k}): the model predicts {k} targets{names}, got shape "
                        f"{y.shape}")
    if len(X) != len(y):
        raise DataError(f"X has {len(X)} rows but y has {len(y)}")
    if not np.isfinite(y).all():
        raise DataError("X or y holds non-finite values (NaN or infinity); every value must be finite")
    return y.astype(np.float32)
