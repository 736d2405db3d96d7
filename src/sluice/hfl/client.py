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

import numpy as np
import torch
from torch import nn

from sluice.compress import make_uplink
from sluice.errors import ConfigError, WireError
from sluice.hfl.config import HFLConfig
from sluice.hfl.downlink import apply_downlink
from sluice.hfl.state import field, pack, unpack
from sluice.models import get_flat, mlp, set_flat


def build_model(cfg: HFLConfig, num_features: int, num_classes: int) -> nn.Module:
    """The model of the federation, initialised from ``cfg.seed``: its flat parameters are θ_0."""
    return mlp(num_features, list(cfg.model.hidden), num_classes, seed=cfg.seed)


def _freeze(model: nn.Module, trainable: int | None) -> list[nn.Parameter]:
    """Let only the last ``trainable`` linear layers (all when None) have gradients; return those params."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    keep = len(linears) if trainable is None else trainable
    for i, lin in enumerate(linears):
        for p in lin.parameters():
            p.requires_grad_(i >= len(linears) - keep)
    return [p for p in model.parameters() if p.requires_grad]


def local_train(
    model: nn.Module,
    params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    trainable: int | None = None,
) -> tuple[np.ndarray, float]:
    """Train ``model`` from ``params`` with plain SGD on (X, y); return (Δ = θ_local − θ, mean loss).

    The loss follows the targets: integer class ids ``y`` (classification) give the cross-entropy
    ``−(1/B) Σ log softmax(f(x))_y``, float targets ``y`` of shape ``(n, k)`` (regression) the mean squared
    error ``(1/B) Σ ‖f(x) − y‖²/k``. ``model`` is a scratch module whose parameters are overwritten; batches
    are shuffled with ``seed``.
    With ``trainable = l`` only the last ``l`` linear layers learn: the others are frozen and their
    coordinates of Δ are exactly zero.
    """
    set_flat(model, params)
    model.train()
    gen = torch.Generator().manual_seed(seed)
    Xt = torch.from_numpy(X)
    yt = torch.from_numpy(y)
    opt = torch.optim.SGD(_freeze(model, trainable), lr=lr)
    regression = y.dtype.kind == "f"
    loss_fn = nn.MSELoss() if regression else nn.CrossEntropyLoss()
    n = len(yt)
    total, count = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, batch_size):
            b = order[start : start + batch_size]
            opt.zero_grad(set_to_none=True)
            out = model(Xt[b])
            loss = loss_fn(out, yt[b].reshape(out.shape) if regression else yt[b])
            loss.backward()
            opt.step()
            total += loss.item() * len(b)
            count += len(b)
    delta = get_flat(model).astype(np.float64) - params.astype(np.float64)
    return delta, total / max(count, 1)


class Client:
    """One client: ``train(server message, X, y, round) -> upload``; its state saves as bytes.

    ``model`` is a scratch module to train in and ``theta0`` the initial model; both are built from
    ``cfg`` when not given (a simulator passes one scratch module and one θ_0 to all its clients, which
    only read θ_0). ``train_loss`` is the mean loss of the last local training, reported beside the
    upload (as a runtime's metrics travel beside the parameters).
    """

    def __init__(self, cfg: HFLConfig, client_id: int, num_features: int, num_classes: int, *,
                 model: nn.Module | None = None, theta0: np.ndarray | None = None) -> None:
        self.cfg = cfg
        self.client_id = int(client_id)
        self.num_features, self.num_classes = int(num_features), int(num_classes)
        fresh = build_model(cfg, num_features, num_classes) if model is None or theta0 is None else None
        self.model = model if model is not None else fresh
        self.theta0 = theta0 if theta0 is not None else get_flat(fresh)
        self.uplink = make_uplink(cfg.compression)
        self.uplink_state = None
        self.trainable_layers: int | None = None
        self.train_loss: float | None = None
        self._held: np.ndarray | None = None
        self._anchor: np.ndarray | None = None
        self._velocity: np.ndarray | None = None
        self._anchor_velocity: np.ndarray | None = None

    @property
    def params(self) -> np.ndarray:
        """The model the client holds: the server model of its last downlink message (θ_0 before any)."""
        return self.theta0 if self._held is None else self._held

    @property
    def anchor(self) -> np.ndarray:
        """What downlink patches apply to in the ``initial`` and ``anchor`` modes (θ_0 or the last anchor)."""
        return self.theta0 if self._anchor is None else self._anchor

    def set_trainable_layers(self, layers: int | None) -> None:
        """Train only the last ``layers`` linear layers (None: all)."""
        total = len(self.cfg.model.hidden) + 1
        if layers is not None and not 1 <= layers <= total:
            raise ConfigError(f"layers to train must be in 1..{total}, got {layers}")
        self.trainable_layers = layers

    def sync(self, server_message: bytes) -> np.ndarray:
        """Apply a downlink message: the client now holds the server model; returns it."""
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

    def train(self, server_message: bytes, X: np.ndarray, y: np.ndarray, round: int,
              up_ratio: float | None = None) -> bytes:
        """Sync to the server model, train on (X, y) and return the encoded upload of round ``round``, of
        ``up_ratio`` (k/d the server gave this upload, :meth:`CompressionConfig.up_shares`; None:
        ``compression.up_ratio``)."""
        delta = self.local_update(self.sync(server_message), X, y, round)
        uplink = self.uplink
        if up_ratio is not None and up_ratio != self.cfg.compression.up_ratio:
            uplink = make_uplink(self.cfg.compression.model_copy(update={"up_ratio": float(up_ratio)}))
        state = self.uplink_state if self.uplink_state is not None else uplink.init(delta.shape[0])
        rng = np.random.default_rng([self.cfg.seed, round, self.client_id])
        buf, self.uplink_state = uplink.encode(delta, state, rng)
        return buf

    def local_update(self, held: np.ndarray, X: np.ndarray, y: np.ndarray, round: int) -> np.ndarray:
        """Train from the model ``held`` on (X, y) in round ``round``; return the update Δ (float64) and keep
        the mean training loss in :attr:`train_loss`."""
        cfg, tr = self.cfg, self.cfg.train
        delta, self.train_loss = local_train(
            self.model, held, X, y, epochs=tr.local_epochs, batch_size=tr.batch_size, lr=tr.lr,
            seed=cfg.seed * 1_000_003 + round * 1009 + self.client_id, trainable=self.trainable_layers)
        return delta

    # -- state as bytes -----------------------------------------------------------------------
    def state_bytes(self) -> bytes:
        """The client's state (held model, anchor copy, replayed velocity, compressor state, trainable layers)
        as bytes."""
        return pack({"kind": "client", "client_id": self.client_id, "num_features": self.num_features,
                     "num_classes": self.num_classes, "held": self._held, "anchor": self._anchor,
                     "velocity": self._velocity, "anchor_velocity": self._anchor_velocity,
                     "uplink": self.uplink_state, "trainable_layers": self.trainable_layers,
                     "train_loss": self.train_loss})

    @classmethod
    def from_state_bytes(cls, cfg: HFLConfig, buf: bytes, *, model: nn.Module | None = None,
                         theta0: np.ndarray | None = None) -> Client:
        """The client :meth:`state_bytes` saved, under configuration ``cfg``."""
        tree = unpack(buf)
        cid, nf, nc, held, anchor, uplink, layers, loss = field(
            tree, "client", "client_id", "num_features", "num_classes", "held", "anchor", "uplink",
            "trainable_layers", "train_loss")
        out = cls(cfg, cid, nf, nc, model=model, theta0=theta0)
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
