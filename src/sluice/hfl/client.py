"""Client half of horizontal FL: server bytes + local data → upload bytes (SPEC C1, C4).

A :class:`Client` holds one client's state: the model it holds (θ after its last downlink message; the
initial model θ_0 before any), in the ``initial`` and ``anchor`` downlink modes the model that patches
apply to (θ_0, or its copy of the last anchor), with replayed server momentum the velocity it replays on
the output layer (and its anchor's), and its uplink compressor's state. Each round it is in,
it rebuilds the server model from the downlink message, trains locally from it and uploads its
compressed update Δ = θ_local − θ. Every seed it needs comes from (config seed ``s``, round ``t``, client
id ``c``): the batch order from ``s·1000003 + t·1009 + c`` and the compressor's randomness from
``numpy.random.default_rng([s, t, c])``. The round travels beside the bytes, never inside them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils.data import Dataset

from sluice.compress import make_uplink
from sluice.compress.device import to_host
from sluice.errors import WireError
from sluice.hfl.config import HFLConfig
from sluice.hfl.downlink import apply_downlink
from sluice.hfl.learner import Learner
from sluice.wire.buffers import split_buffers, with_buffers
from sluice.wire.state import field, pack, unpack


class Client:
    """One client: ``train(server message, data, round) -> upload``; its state saves as bytes.

    ``learner`` holds the task's scratch module, θ_0 and local training (:class:`~sluice.hfl.learner.Learner`;
    a simulator passes one learner to all its clients). ``train_loss`` is the mean loss of the last local
    training, reported beside the upload (as a runtime's metrics travel beside the parameters). A model
    with floating-point buffers (BatchNorm) gets the server's buffers with every message and uploads its own
    after training (:mod:`sluice.wire.buffers`).
    """

    carries_buffers = True
    updates_on_device = True
    """Δ stays on the learner's GPU for the uplink compressor (:mod:`sluice.compress.device`)."""

    def __init__(self, cfg: HFLConfig, client_id: int, learner: Learner) -> None:
        self.cfg = cfg
        self.client_id = int(client_id)
        self.learner = learner
        self.theta0 = learner.theta0
        self.buffers: np.ndarray | None = None
        self.uplink = make_uplink(cfg.compression)
        self.uplink_state = None
        self.trainable_layers: int | None = None
        self.train_loss: float | None = None
        self._held: np.ndarray | None = None
        self._anchor: np.ndarray | None = None
        self._velocity: np.ndarray | None = None
        self._anchor_velocity: np.ndarray | None = None
        self._trained_buffers: np.ndarray | None = None

    @property
    def params(self) -> np.ndarray:
        """The model the client holds: the server model of its last downlink message (θ_0 before any)."""
        return self.theta0 if self._held is None else self._held

    @property
    def anchor(self) -> np.ndarray:
        """What downlink patches apply to in the ``initial`` and ``anchor`` modes (θ_0 or the last anchor)."""
        return self.theta0 if self._anchor is None else self._anchor

    def set_trainable_layers(self, layers: int | None) -> None:
        """Train only the last ``layers`` layers of the model (None: all)."""
        self.trainable_layers = self.learner.check_layers(layers)

    def sync(self, server_message: bytes) -> np.ndarray:
        """Apply a downlink message: the client now holds the server model (and buffers); returns it."""
        server_message, buffers = split_buffers(server_message, self.learner.num_buffers)
        if buffers is not None:
            self.buffers = buffers
        if self.cfg.compression.downlink in ("initial", "anchor"):
            self._held, self._velocity = apply_downlink(self.anchor, self._anchor_velocity, server_message)
        else:
            self._held, self._velocity = apply_downlink(self.params, self._velocity, server_message)
        return self._held

    def receive_anchor(self, broadcast: bytes) -> None:
        """Anchor mode: patch the client's copy of the anchor with the server's anchor broadcast."""
        if self.cfg.compression.downlink != "anchor":
            raise WireError(f"an anchor broadcast arrived but the downlink mode is "
                            f"{self.cfg.compression.downlink!r}")
        self._anchor, self._anchor_velocity = apply_downlink(self.anchor, self._anchor_velocity, broadcast)

    def train(self, server_message: bytes, data: Dataset, round: int, up_ratio: float | None = None) -> bytes:
        """Sync to the server model, train on ``data`` and return the encoded upload of round ``round``, of
        ``up_ratio`` (k/d the server gave this upload, :meth:`CompressionConfig.up_shares`; None:
        ``compression.up_ratio``)."""
        return self.upload(self.local_update(self.sync(server_message), data, round), round, up_ratio)

    def upload(self, delta: Any, round: int, up_ratio: float | None = None) -> bytes:
        """The encoded upload of the update ``delta`` of round ``round`` (what :meth:`train` returns after local
        training; a simulator that trains its clients together calls it with each client's Δ)."""
        uplink = self.uplink
        if up_ratio is not None and up_ratio != self.cfg.compression.up_ratio:
            uplink = make_uplink(self.cfg.compression.model_copy(update={"up_ratio": float(up_ratio)}))
        state = self.uplink_state if self.uplink_state is not None else uplink.init(delta.shape[0])
        rng = np.random.default_rng([self.cfg.seed, round, self.client_id])
        buf, self.uplink_state = uplink.encode(delta, state, rng)
        return with_buffers(buf, self._trained_buffers)

    def local_update(self, held: np.ndarray, data: Dataset, round: int) -> Any:
        """Train from the model ``held`` on ``data`` in round ``round``; return the update Δ (float64: numpy, or a
        tensor left on the learner's GPU for the compressor) and keep the mean training loss in
        :attr:`train_loss`. The batch order is seeded by :meth:`batch_seed`."""
        tr = self.cfg.train
        delta, self.train_loss, self._trained_buffers = self.learner.fit(
            held, self.buffers, data, epochs=tr.local_epochs, batch_size=tr.batch_size, lr=tr.lr,
            seed=self.batch_seed(round), trainable=self.trainable_layers,
            on_device=self.updates_on_device and self.learner.device.type != "cpu")
        return delta

    def batch_seed(self, round: int) -> int:
        """The seed of the client's batch order in round ``round``: ``s·1000003 + t·1009 + c``."""
        return self.cfg.seed * 1_000_003 + round * 1009 + self.client_id

    # -- state as bytes -----------------------------------------------------------------------
    def state_bytes(self) -> bytes:
        """The client's state (held model and buffers, anchor copy, replayed velocity, compressor state,
        trainable layers) as bytes."""
        return pack({"kind": "client", "client_id": self.client_id, "buffers": self.buffers,
                     "held": self._held, "anchor": self._anchor,
                     "velocity": self._velocity, "anchor_velocity": self._anchor_velocity,
                     "uplink": to_host(self.uplink_state), "trainable_layers": self.trainable_layers,
                     "train_loss": self.train_loss})

    @classmethod
    def from_state_bytes(cls, cfg: HFLConfig, buf: bytes, learner: Learner) -> Client:
        """The client :meth:`state_bytes` saved, under configuration ``cfg``, training with ``learner``."""
        tree = unpack(buf)
        cid, buffers, held, anchor, uplink, layers, loss = field(
            tree, "client", "client_id", "buffers", "held", "anchor", "uplink", "trainable_layers", "train_loss")
        out = cls(cfg, cid, learner)
        if buffers is not None and buffers.shape != (learner.num_buffers,):
            raise WireError(f"client state: {buffers.shape} buffers, the model has {learner.num_buffers}")
        out.buffers = buffers
        for name, arr in (("held", held), ("anchor", anchor)):
            if arr is not None and arr.shape != out.theta0.shape:
                raise WireError(f"client state: {name} model has shape {arr.shape}, expected {out.theta0.shape}")
        out._held, out._anchor, out.uplink_state = held, anchor, uplink
        out._velocity, out._anchor_velocity = (  # states saved before replayed momentum have none
            None if (v := tree.get(key)) is None else np.asarray(v, dtype=np.float32)
            for key in ("velocity", "anchor_velocity"))
        out.set_trainable_layers(layers)
        out.train_loss = loss
        return out
