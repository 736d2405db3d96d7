"""Horizontal FL simulator: many terminals, one server, compressed traffic both ways (SPEC C1–C5).

Every round: sample a fraction q of the terminals; each receives its downlink message and rebuilds the
server model from it, trains locally, compresses its update Δ and uploads it (a terminal may fail
mid-round with probability ``dropout``: it is skipped and the round completes). The server decodes the
uploads, aggregates them weighted by sample count and applies the top-k of (aggregate + residual).
Every byte counted is ``len()`` of a message actually encoded by :mod:`sluice.compress.wire`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sluice.compress import decode_to_dense, make_uplink
from sluice.config import RunConfig
from sluice.data import FederatedData, load_federated
from sluice.engine import IterationEvent, Suspendable
from sluice.errors import DataError, TrainingError
from sluice.hfl.client import evaluate, local_train
from sluice.hfl.downlink import Downlink, apply_message
from sluice.hfl.server import ServerState, aggregate, init_server, server_step
from sluice.models import get_flat, mlp, num_params


class HFLEngine(Suspendable):
    """Implements :class:`sluice.engine.Engine` for horizontal FL; one iteration is one round."""

    def __init__(self, cfg: RunConfig, data: FederatedData | None = None) -> None:
        self.cfg = cfg
        self.data = data
        self.server: ServerState | None = None
        self.terminal_models: dict[int, np.ndarray] = {}
        self._suspended = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self.server is not None:
            return
        cfg = self.cfg
        torch.set_num_threads(1)
        if self.data is None:
            self.data = load_federated(cfg.data, seed=cfg.seed)
        self.model = mlp(self.data.num_features, list(cfg.model.hidden), self.data.num_classes, seed=cfg.seed)
        self.theta0 = get_flat(self.model)
        self.reference = self.theta0  # the terminals' θ_0 (initial mode) or anchor copy (anchor mode)
        self.d = self.theta0.shape[0]
        self.server = init_server(self.theta0)
        self.downlink = Downlink(self.d, cfg.compression.downlink, cfg.compression.anchor_every,
                                 num_terminals=len(self.data.clients))
        self.uplink = make_uplink(cfg.compression)
        self.uplink_states: dict[int, Any] = {}
        self._rng = np.random.default_rng(cfg.seed)

    def add_data(self, data: Any) -> None:
        """Add samples to terminals: ``(terminal, X, y)`` or a list of such triples."""
        self.start()
        items = [data] if isinstance(data, tuple) else list(data)
        for item in items:
            terminal, X, y = item
            if not 0 <= terminal < len(self.data.clients):
                raise DataError(f"terminal must be in [0, {len(self.data.clients)}), got {terminal}")
            X0, y0 = self.data.clients[terminal]
            X = np.asarray(X, dtype=np.float32).reshape(-1, X0.shape[1])
            self.data.clients[terminal] = (np.concatenate([X0, X]), np.concatenate([y0, np.asarray(y, np.int64)]))

    def save(self, path: str | Path) -> str:
        self.start()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"params": torch.from_numpy(self.server.params.copy()), "hidden": list(self.cfg.model.hidden),
                    "num_features": self.data.num_features, "num_classes": self.data.num_classes,
                    "round": self.server.round}, path)
        return str(path)

    @property
    def num_params(self) -> int:
        self.start()
        return num_params(self.model)

    @property
    def num_samples(self) -> int:
        """Training samples held by all terminals together."""
        self.start()
        return sum(len(y) for _, y in self.data.clients)

    @property
    def num_layers(self) -> int:
        """Linear layers of the model."""
        return len(self.cfg.model.hidden) + 1

    @property
    def metric_names(self) -> list[str]:
        return ["train_loss", "test_loss", "test_accuracy", "test_precision", "test_recall", "test_f1",
                "participants", "dropped"]

    def probe(self, iterations: int = 2) -> float:
        """Seconds per round, timed on a scratch copy of the federation (this engine is left untouched)."""
        self.start()
        scratch = HFLEngine(self.cfg, self.data)
        scratch.start()
        t0 = time.perf_counter()
        for _ in range(max(1, iterations)):
            scratch.iterate()
        return (time.perf_counter() - t0) / max(1, iterations)

    @property
    def params(self) -> np.ndarray:
        self.start()
        return self.server.params

    # -- one round ---------------------------------------------------------------------------
    def iterate(self) -> IterationEvent:
        self.start()
        if self._suspended:
            raise TrainingError("the engine is suspended: resume() it before the next round")
        cfg, tr, data = self.cfg, self.cfg.train, self.data
        t0 = time.perf_counter()
        rnd = self.server.round + 1
        n = len(data.clients)
        m = max(1, round(tr.participation * n))
        sampled = np.sort(self._rng.choice(n, size=m, replace=False))
        failed = self._rng.random(m) < tr.dropout
        bytes_up = bytes_down = 0
        estimates, weights, losses = [], [], []
        for c, fails in zip(sampled.tolist(), failed.tolist(), strict=True):
            msg = self.downlink.message(c, self.server.params)
            bytes_down += len(msg)
            if cfg.compression.downlink in ("initial", "anchor"):  # patches apply to θ_0 / the anchor
                base = self.reference
            else:
                base = self.terminal_models.get(c, self.theta0)
            held = apply_message(base, msg)
            self.terminal_models[c] = held
            if fails:
                continue
            X, y = data.clients[c]
            delta, loss = local_train(self.model, held, X, y, epochs=tr.local_epochs, batch_size=tr.batch_size,
                                      lr=tr.lr, seed=cfg.seed * 1_000_003 + rnd * 1009 + c)
            state = self.uplink_states.get(c)
            if state is None:
                state = self.uplink.init(self.d)
            crng = np.random.default_rng([cfg.seed, rnd, c])
            buf, self.uplink_states[c] = self.uplink.encode(delta, state, crng)
            bytes_up += len(buf)
            estimates.append(decode_to_dense(buf))
            weights.append(float(len(y)))
            losses.append(loss)
        if estimates:
            g = aggregate(estimates, weights, self.d)
            dense_down = cfg.compression.down == "dense"
            values = cfg.compression.down_values
            if values == "auto":
                values = "fp32" if dense_down else "fp16"
            self.server, changed, step = server_step(
                self.server, g, ratio=1.0 if dense_down else cfg.compression.down_ratio,
                rho=cfg.compression.momentum, lr=tr.server_lr,
                value_dtype=np.float16 if values == "fp16" else np.float32)
        else:
            self.server = ServerState(self.server.params, self.server.residual, self.server.momentum, rnd)
            changed, step = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        self.downlink.record(changed, step)
        broadcast = self.downlink.anchor_broadcast(self.server.params)
        if broadcast is not None:  # every terminal receives the new anchor and patches its copy of the last one
            self.reference = apply_message(self.reference, broadcast)
            bytes_down += n * len(broadcast)
        metrics: dict[str, float] = {"participants": float(len(estimates)), "dropped": float(int(failed.sum()))}
        if losses:
            metrics["train_loss"] = float(np.average(losses, weights=weights))
        if rnd % tr.eval_every == 0 or rnd == tr.rounds:
            metrics.update(evaluate(self.model, self.server.params, data.X_test, data.y_test, data.num_classes))
        anomaly, detail = None, ""
        bad = [k for k in ("train_loss", "test_loss") if k in metrics and not math.isfinite(metrics[k])]
        if bad:
            anomaly, detail = "DIVERGED", f"{bad[0]} is {metrics[bad[0]]} at round {rnd}"
        return IterationEvent(iteration=rnd, metrics=metrics, bytes_up=bytes_up, bytes_down=bytes_down,
                              seconds=time.perf_counter() - t0, anomaly=anomaly, detail=detail)
