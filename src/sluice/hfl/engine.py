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

Data requirements: :meth:`HFLEngine.limit_samples` keeps the first ``m_c`` samples of each client with
``Σ m_c = n`` (see there); :meth:`HFLEngine.set_min_samples` makes a round with fewer samples than
asked report ``INADEQUATE_TRAINING_DATA`` instead of training.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sluice.data import FederatedData, load_federated
from sluice.engine import IterationEvent, Suspendable
from sluice.errors import ConfigError, DataError, TrainingError
from sluice.hfl.client import Client, build_model
from sluice.hfl.config import HFLConfig
from sluice.hfl.server import Server
from sluice.hfl.state import field, pack, unpack
from sluice.metrics import CLASSIFICATION, MetricSpec, declare
from sluice.models import get_flat, num_params, output_layer, set_flat


class ServerModel:
    """``save``, ``params``, ``num_params`` and the round's event of an HFL engine, whose server half holds
    the model: the engine's ``start`` builds ``server`` (its ``params`` and ``round``), ``model`` (a scratch
    module of the architecture) and ``data``, ``cfg`` is its :class:`HFLConfig`, and ``_evaluate()`` gives
    the server model's test metrics."""

    def save(self, path: str | Path) -> str:
        """The server model with what rebuilds it (architecture, feature and class counts, round), by
        ``torch.save``."""
        self.start()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"params": torch.from_numpy(self.server.params.copy()), "hidden": list(self.cfg.model.hidden),
                    "num_features": self.data.num_features, "num_classes": self.data.num_classes,
                    "round": self.server.round}, path)
        return str(path)

    @property
    def params(self) -> np.ndarray:
        """The server model."""
        self.start()
        return self.server.params

    @property
    def num_params(self) -> int:
        self.start()
        return num_params(self.model)

    def _round_event(self, rnd: int, metrics: dict[str, float], losses: list[float], weights: list[float],
                     bytes_up: int, bytes_down: int, t0: float) -> IterationEvent:
        """Round ``rnd``'s event: ``metrics`` plus the clients' train loss (weighted by ``weights``) and,
        every ``train.eval_every`` rounds, the engine's ``_evaluate()``; DIVERGED when a loss is not
        finite."""
        if losses and sum(weights) > 0:
            metrics["train_loss"] = float(np.average(losses, weights=weights))
        if rnd % self.cfg.train.eval_every == 0:
            metrics.update(self._evaluate())
        anomaly, detail = None, ""
        bad = [k for k in ("train_loss", "test_loss") if k in metrics and not math.isfinite(metrics[k])]
        if bad:
            anomaly, detail = "DIVERGED", f"{bad[0]} is {metrics[bad[0]]} at round {rnd}"
        return IterationEvent(iteration=rnd, metrics=metrics, bytes_up=bytes_up, bytes_down=bytes_down,
                              seconds=time.perf_counter() - t0, anomaly=anomaly, detail=detail)


class HFLEngine(ServerModel, Suspendable):
    """Implements :class:`sluice.engine.Engine` for horizontal FL; one iteration is one round.

    ``server_cls`` and ``client_cls`` are the two halves it drives (Sluice's :class:`Server` and
    :class:`Client` by default). Any pair with the same constructors, ``message``/``receive``/``close_round``
    and ``sync``/``train``/``receive_anchor``/``train_loss``, and ``state_bytes``/``from_state_bytes`` runs
    under the same sampling, data and byte accounting: that is how other compression methods are compared
    with Sluice's on equal terms (:mod:`sluice.hfl.peers`).
    """

    def __init__(self, cfg: HFLConfig, data: FederatedData | None = None, *,
                 server_cls: type = Server, client_cls: type = Client) -> None:
        self.cfg = cfg
        self.data = data
        self.server_cls, self.client_cls = server_cls, client_cls
        self.server: Server | None = None
        self.clients: list[Client] = []
        self._min_samples = 0
        self._trainable: int | None = None
        self._suspended = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self.server is not None:
            return
        cfg = self.cfg
        torch.set_num_threads(1)
        if self.data is None:
            self.data = load_federated(cfg.data, seed=cfg.seed)
        data = self.data
        self.model = build_model(cfg, data.num_features, data.num_classes)  # scratch for training and tests
        self.theta0 = get_flat(self.model)
        self.server = self.server_cls(cfg, self.theta0, len(data.clients), output_layer=output_layer(self.model))
        self.clients = [self.client_cls(cfg, c, data.num_features, data.num_classes, model=self.model,
                                        theta0=self.theta0) for c in range(len(data.clients))]
        for client in self.clients:
            client.set_trainable_layers(self._trainable)
        self._rng = np.random.default_rng(cfg.seed)

    @property
    def metrics(self) -> dict[str, MetricSpec]:
        """``train_loss``, the test metrics of the task and, for a scenario, its type-specific errors (the
        scenario's data is loaded to know them), plus ``participants`` and ``dropped``."""
        extra = [MetricSpec("participants", True, 0.0), MetricSpec("dropped", False, 0.0)]
        if self.data is None and self.cfg.data.is_scenario:
            self.data = load_federated(self.cfg.data, seed=self.cfg.seed)
        if self.data is None:
            return declare(("train_loss", *CLASSIFICATION), extra)
        return self.data.declared_metrics(extra)

    counts_bytes = True

    # -- data ---------------------------------------------------------------------------------
    @property
    def num_samples(self) -> int:
        """Training samples held by all clients together."""
        self.start()
        return sum(len(y) for _, y in self.data.clients)

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
        clients = [(X[:k], y[:k]) for (X, y), k in zip(self.data.clients, keep, strict=True)]
        self.data = dataclasses.replace(self.data, clients=clients)

    def set_min_samples(self, n: int) -> None:
        """While the clients together hold fewer than ``n`` samples, a round trains nothing and reports
        ``INADEQUATE_TRAINING_DATA`` (:meth:`add_data` lifts it)."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
            raise ConfigError(f"minimum sample count must be an integer >= 0, got {n!r}")
        self._min_samples = int(n)

    def check_data(self, data: Any) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """Check data for :meth:`add_data` — ``(client, X, y)`` or a list of such triples — and return it
        as (client id, float32 ``X`` of shape (k, features), int64 ``y`` of shape (k,)) triples; for a
        regression scenario ``y`` holds the targets, ``(k, targets)`` (1-D with one target), and both are
        given in natural units and returned standardised as the model takes them.

        Raises :class:`DataError` saying what is wrong: a client id outside ``[0, num_clients)``, ``X`` not
        2-D with the model's feature count (one 1-D sample of that length is accepted), ``y`` not 1-D or
        not integers in ``[0, num_classes)`` (regression: not one row of targets per sample), non-finite
        values, or ``X`` and ``y`` of different lengths.
        """
        self.start()
        n, nf, nc = len(self.data.clients), self.data.num_features, self.data.num_classes
        items = [data] if isinstance(data, tuple) else data
        if not isinstance(items, list) or not items:
            raise DataError("HFL data to add is a (client, X, y) triple or a non-empty list of them")
        out = []
        for item in items:
            if not isinstance(item, tuple | list) or len(item) != 3:
                raise DataError(f"HFL data to add is a (client, X, y) triple, got {type(item).__name__}")
            c, X, y = item
            if isinstance(c, bool) or not isinstance(c, numbers.Integral) or not 0 <= c < n:
                raise DataError(f"client must be an integer in [0, {n}), got {c!r}")
            try:
                X = np.asarray(X, dtype=np.float32)
                y_raw = np.asarray(y, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise DataError(f"X and y must be numeric arrays: {exc}") from None
            if X.ndim == 1 and X.shape[0] == nf:
                X = X.reshape(1, nf)
            if X.ndim != 2 or X.shape[1] != nf:
                raise DataError(f"X must have shape (samples, {nf}): the model takes {nf} features, got "
                                f"shape {X.shape}")
            if self.data.task == "regression":
                out.append((int(c), *self._check_targets(X, y_raw)))
                continue
            if y_raw.ndim != 1:
                raise DataError(f"y must be 1-D (one label per sample), got shape {y_raw.shape}")
            if len(X) != len(y_raw):
                raise DataError(f"X has {len(X)} rows but y has {len(y_raw)} labels")
            if not np.isfinite(X).all():
                raise DataError("X holds non-finite values (NaN or infinity); every feature must be finite")
            if not np.isfinite(y_raw).all():
                raise DataError("y holds non-finite values (NaN or infinity); labels are integers")
            if np.any(y_raw != np.round(y_raw)) or np.any((y_raw < 0) | (y_raw >= nc)):
                raise DataError(f"labels must be integers in [0, {nc}), got values from {y_raw.min():g} to "
                                f"{y_raw.max():g}")
            out.append((int(c), *self.data.to_model_space(X, y_raw.astype(np.int64))))
        return out

    def _check_targets(self, X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Regression rows ``(X, y)`` checked (one finite row of targets per sample) and standardised."""
        k = self.data.num_classes
        if y.ndim == 1 and k == 1:
            y = y.reshape(-1, 1)
        if y.ndim != 2 or y.shape[1] != k:
            raise DataError(f"y must have shape (samples, {k}): the model predicts {k} targets "
                            f"({', '.join(self.data.target_names)}), got shape {y.shape}")
        if len(X) != len(y):
            raise DataError(f"X has {len(X)} rows but y has {len(y)}")
        if not (np.isfinite(X).all() and np.isfinite(y).all()):
            raise DataError("X or y holds non-finite values (NaN or infinity); every value must be finite")
        return self.data.to_model_space(X, y)

    def add_data(self, data: Any) -> None:
        """Add samples to clients: ``(client, X, y)`` or a list of such triples (checked first: nothing is
        added when any of them is wrong)."""
        for c, X, y in self.check_data(data):
            X0, y0 = self.data.clients[c]
            self.data.clients[c] = (np.concatenate([X0, X]), np.concatenate([y0, y]))

    # -- requirements -----------------------------------------------------------------------------
    @property
    def default_iterations(self) -> int:
        """``train.rounds``: the round limit when the termination parameters give none (the engine itself
        never stops there)."""
        return self.cfg.train.rounds

    @property
    def num_layers(self) -> int:
        """Linear layers of the model."""
        return len(self.cfg.model.hidden) + 1

    def set_trainable_layers(self, layers: int) -> None:
        """Every client trains only the last ``layers`` linear layers; the earlier ones stay frozen in local
        training (their update is exactly zero, so the server never moves them)."""
        if isinstance(layers, bool) or not isinstance(layers, numbers.Integral) or not (
                1 <= layers <= self.num_layers):
            raise ConfigError(f"layers to train must be in 1..{self.num_layers}, got {layers!r}")
        self._trainable = int(layers)
        for client in self.clients:
            client.set_trainable_layers(self._trainable)

    def probe(self, iterations: int = 2) -> float:
        """Seconds per round, timed on a copy of this engine (this engine is left untouched)."""
        self.start()
        scratch = HFLEngine(self.cfg, self.data, server_cls=self.server_cls, client_cls=self.client_cls)
        scratch.restore(self.checkpoint())
        t0 = time.perf_counter()
        for _ in range(max(1, iterations)):
            scratch.iterate()
        return (time.perf_counter() - t0) / max(1, iterations)

    # -- one round ---------------------------------------------------------------------------
    def iterate(self) -> IterationEvent:
        self.start()
        if self._suspended:
            raise TrainingError("the engine is suspended: resume() it before the next round")
        tr, data, server = self.cfg.train, self.data, self.server
        t0 = time.perf_counter()
        have = self.num_samples
        if have < self._min_samples:
            return IterationEvent(
                iteration=server.round, seconds=time.perf_counter() - t0, anomaly="INADEQUATE_TRAINING_DATA",
                detail=f"the clients hold {have} training samples, at least {self._min_samples} needed")
        rnd = server.round + 1
        n = len(data.clients)
        m = max(1, round(tr.participation * n))
        sampled = np.sort(self._rng.choice(n, size=m, replace=False))
        failed = self._rng.random(m) < tr.dropout
        bytes_up = bytes_down = 0
        weights, losses = [], []
        budget = {}  # k/d per upload, only when the budget follows the clients' weights
        if self.cfg.compression.weighted_uploads:
            shares = self.cfg.compression.up_shares([len(data.clients[c][1]) for c in sampled.tolist()])
            budget = {c: {"up_ratio": r} for c, r in zip(sampled.tolist(), shares, strict=True)}
        for c, fails in zip(sampled.tolist(), failed.tolist(), strict=True):
            msg = server.message(c)
            bytes_down += len(msg)
            client = self.clients[c]
            if fails:  # it received the model, then failed before uploading
                client.sync(msg)
                continue
            X, y = data.clients[c]
            upload = client.train(msg, X, y, rnd, **budget.get(c, {}))
            bytes_up += len(upload)
            server.receive(c, upload, float(len(y)))
            weights.append(float(len(y)))
            losses.append(client.train_loss)
        broadcast = server.close_round()
        if broadcast is not None:  # every client patches its copy of the last anchor
            for client in self.clients:
                client.receive_anchor(broadcast)
            bytes_down += n * len(broadcast)
        metrics: dict[str, float] = {"participants": float(len(losses)), "dropped": float(int(failed.sum()))}
        return self._round_event(rnd, metrics, losses, weights, bytes_up, bytes_down, t0)

    @torch.no_grad()
    def _evaluate(self) -> dict[str, float]:
        """Test metrics of the server model (:meth:`sluice.data.FederatedData.test_metrics`)."""
        set_flat(self.model, self.server.params)
        self.model.eval()
        return self.data.test_metrics(self.model(torch.from_numpy(self.data.X_test)))

    # -- checkpoint ---------------------------------------------------------------------------
    def checkpoint(self) -> bytes:
        """The whole simulation as bytes: the server's and every client's state, the sampling RNG, the
        clients' training data and the settings (:meth:`limit_samples`, :meth:`set_min_samples`,
        :meth:`set_trainable_layers`). The test set comes from the configuration."""
        self.start()
        return pack({"kind": "hfl-simulator", "server": self.server.state_bytes(),
                     "clients": [c.state_bytes() for c in self.clients], "rng": self._rng.bit_generator.state,
                     "data": [[X, y] for X, y in self.data.clients], "min_samples": self._min_samples,
                     "trainable_layers": self._trainable})

    def restore(self, buf: bytes) -> None:
        """Continue from a :meth:`checkpoint` taken under the same configuration."""
        server, clients, rng, data, min_samples, trainable = field(
            unpack(buf), "hfl-simulator", "server", "clients", "rng", "data", "min_samples", "trainable_layers")
        self.start()
        if len(clients) != len(self.clients):
            raise ConfigError(f"the checkpoint holds {len(clients)} clients, this federation has {len(self.clients)}")
        self.data = dataclasses.replace(self.data, clients=[(X, y) for X, y in data])
        self.server = self.server_cls.from_state_bytes(self.cfg, server)
        self.clients = [self.client_cls.from_state_bytes(self.cfg, b, model=self.model, theta0=self.theta0)
                        for b in clients]
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = rng
        self._min_samples, self._trainable = int(min_samples), trainable
