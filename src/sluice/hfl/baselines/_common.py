"""What the published methods of :mod:`sluice.hfl.baselines` share: the server and client halves they build
on, the server's record of what each client holds (:class:`_SyncTracker`, :class:`_UpdateCache`) and the budget
helpers. Private to :mod:`sluice.hfl.baselines`."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from sluice.errors import WireError
from sluice.hfl.client import Client
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.hfl.server import UploadInbox
from sluice.wire.state import field, pack, unpack
from sluice.wire.updates import is_update_message, pack_updates, unpack_updates
from sluice.wire.vector import DensePayload, SparsePayload, decode, encode


# ---------------------------------------------------------------------------------------------- helpers
def _down_share(cfg: HFLConfig, num_clients: int) -> float:
    """The share the server applies per round: ``compression.down_ratio``, or when unset Sluice's share for
    the uploads a round expects, ``round(q·n)`` of ``n``, so peers get the budget Sluice gets."""
    return cfg.compression.down_share(max(1, round(cfg.train.participation * num_clients)), num_clients)


def _count(ratio: float, d: int) -> int:
    """``k = max(1, round(ratio·d))``, at most ``d``."""
    return min(d, max(1, round(ratio * d)))


class _SyncTracker:
    """Who holds what, without a model copy per client: the round each coordinate last changed and the
    round each client last synced (O(d + clients) memory).

    :meth:`message` is the smaller of the dense fp32 model and the sparse patch of the coordinates changed
    since the client's sync, with their current fp32 values (the client overwrites them): either way the
    client then holds the server model bit for bit.
    """

    def __init__(self, d: int) -> None:
        self.d = d
        self.stamp = np.zeros(d, dtype=np.int32)
        self.round = 0
        self.synced: dict[int, int] = {}

    def record(self, changed: np.ndarray) -> None:
        """The server finished a round changing the coordinates ``changed``."""
        self.round += 1
        self.stamp[changed] = self.round

    def message(self, client: int, params: np.ndarray) -> bytes:
        """The message that brings ``client`` to ``params``; it counts as synced from now on."""
        base = self.synced.get(client, 0)
        self.synced[client] = self.round
        dense = encode(DensePayload(params.astype(np.float32)))
        idx = np.flatnonzero(self.stamp > base)
        if 4 * idx.size >= len(dense):
            return dense
        return min(dense, encode(SparsePayload(d=self.d, values=params[idx].astype(np.float32), indices=idx)),
                   key=len)

    def to_tree(self) -> dict:
        return {"kind": "sync-tracker", "d": self.d, "stamp": self.stamp, "round": self.round,
                "synced": [[c, r] for c, r in sorted(self.synced.items())]}

    def load(self, tree: Any) -> None:
        d, stamp, rnd, synced = field(tree, "sync-tracker", "d", "stamp", "round", "synced")
        if d != self.d or not isinstance(stamp, np.ndarray) or stamp.shape != (self.d,):
            raise WireError(f"sync tracker state: expected {self.d} coordinate stamps")
        self.stamp = stamp.astype(np.int32)
        self.round = int(rnd)
        self.synced = {int(c): int(r) for c, r in synced}


def _apply_vector_message(model: np.ndarray, buf: bytes) -> np.ndarray:
    """Client side of :meth:`_SyncTracker.message`: the dense model, or ``model`` with a patch written in."""
    p = decode(buf)
    if not isinstance(p, DensePayload | SparsePayload) or p.d != model.shape[0]:
        raise WireError(f"a downlink message is a dense model or a sparse patch of all {model.shape[0]} "
                        f"coordinates, got a {type(p).__name__}")
    if isinstance(p, DensePayload):
        return p.values.astype(np.float32)
    if p.indices is None:
        raise WireError("a sparse downlink patch needs explicit indices")
    out = model.copy()
    out[p.indices] = p.values.astype(np.float32)
    return out


class _UpdateCache:
    """The server's cache of its last per-round updates (encoded) beside a :class:`_SyncTracker`.

    :meth:`message` returns the smallest of the tracker's messages (dense model, changed coordinates) and
    the chain of the encoded updates the client missed, when the cache still holds them all.
    """

    def __init__(self, d: int, tag: bytes, rounds: int | None) -> None:
        self.d, self.tag, self.rounds = d, tag, rounds
        self.tracker = _SyncTracker(d)
        self.entries: list[tuple[int, bytes]] = []
        self.budget = len(encode(DensePayload(np.zeros(d, dtype=np.float32))))

    def record(self, changed: np.ndarray, entry: bytes) -> None:
        """The server finished a round changing ``changed`` by the update ``entry`` (b"" for none)."""
        self.tracker.record(changed)
        self.entries.append((self.tracker.round, entry))
        if self.rounds is not None:
            self.entries = self.entries[-self.rounds:] if self.rounds > 0 else []
        else:
            while self.entries and sum(len(e) for _, e in self.entries) > self.budget:
                self.entries.pop(0)

    def message(self, client: int, params: np.ndarray) -> bytes:
        base = self.tracker.synced.get(client, 0)
        out = self.tracker.message(client, params)
        if base == self.tracker.round or (self.entries and self.entries[0][0] <= base + 1):
            chain = pack_updates(self.tag, self.d, [e for r, e in self.entries if r > base])
            if len(chain) < len(out):
                return chain
        return out

    def to_tree(self) -> dict:
        return {"kind": "update-cache", "tracker": self.tracker.to_tree(),
                "entries": [[r, e] for r, e in self.entries]}

    def load(self, tree: Any) -> None:
        tracker, entries = field(tree, "update-cache", "tracker", "entries")
        self.tracker.load(tracker)
        self.entries = [(int(r), bytes(e)) for r, e in entries]


# ------------------------------------------------------------------------------------------------ halves
class _PeerServer(UploadInbox):
    """What every peer server shares: the model, the round, checked uploads, the weighted average.

    Subclasses decode uploads (:meth:`_decode_upload`), take a step from the weighted average of the
    decoded uploads (:meth:`_step`; :meth:`_idle` when nothing arrived: the round passes, nothing changes),
    build downlink messages (:meth:`message`) and name their extra state (:meth:`_extra`, :meth:`_load`).
    """

    STATE_KIND: ClassVar[str] = "peer-server"

    def __init__(self, cfg: HFLConfig, params: np.ndarray, num_clients: int, *, output_layer: int = 0) -> None:
        """``output_layer`` is taken as Sluice's :class:`Server` takes it and not used: peers treat every layer
        alike."""
        self.cfg = cfg
        self.num_clients = int(num_clients)
        self._params = np.asarray(params, dtype=np.float32).copy()
        self.d = int(self._params.shape[0])
        self._round = 0
        self._uploads: dict[int, tuple[np.ndarray, float]] = {}

    @property
    def params(self) -> np.ndarray:
        """The current server model (float32)."""
        return self._params

    @property
    def round(self) -> int:
        """Rounds closed so far."""
        return self._round

    def message(self, client_id: int) -> bytes:  # pragma: no cover - every peer defines it
        raise NotImplementedError

    def _step(self, avg: np.ndarray) -> None:  # pragma: no cover - every peer defines it
        raise NotImplementedError

    def _idle(self) -> None:
        """A round in which nothing arrived."""

    def close_round(self) -> bytes | None:
        """Average the uploads (weights ∝ sample counts, client-id order) and step; peers send no anchor
        broadcast, so this returns None."""
        total = sum(w for _, w in self._uploads.values())
        if self._uploads and total > 0:
            avg = None
            for c in sorted(self._uploads):
                est, w = self._uploads[c]
                avg = (w / total) * est if avg is None else avg + (w / total) * est
            self._step(avg)
        else:
            self._idle()
        self._uploads.clear()
        self._round += 1
        return None

    def _extra(self) -> dict[str, Any]:
        return {}

    def _load(self, tree: dict) -> None:
        pass

    def state_bytes(self) -> bytes:
        """The model, round, open uploads and the method's own state as bytes (:mod:`sluice.wire.state`)."""
        return pack({"kind": self.STATE_KIND, "num_clients": self.num_clients, "params": self._params,
                     "round": self._round, "uploads": [[i, e, w] for i, (e, w) in sorted(self._uploads.items())],
                     **self._extra()})

    @classmethod
    def from_state_bytes(cls, cfg: HFLConfig, buf: bytes) -> _PeerServer:
        """The server :meth:`state_bytes` saved, under the configuration it ran with."""
        tree = unpack(buf)
        n, params, rnd, uploads = field(tree, cls.STATE_KIND, "num_clients", "params", "round", "uploads")
        out = cls(cfg, params, n)
        out._round = int(rnd)
        out._uploads = {int(i): (e, float(w)) for i, e, w in uploads}
        out._load(tree)
        return out


class _PeerClient(Client):
    """What every peer client shares with Sluice's :class:`Client`: the scratch model, θ_0, the trainable
    layers, ``train_loss`` and local training (:meth:`Client.local_update`); the compression is the subclass's."""

    STATE_KIND: ClassVar[str] = "peer-client"
    carries_buffers = False
    updates_on_device = False  # the peers compress with numpy

    @property
    def d(self) -> int:
        return int(self.theta0.shape[0])

    def sync(self, server_message: bytes) -> np.ndarray:
        """Apply a downlink message (a dense model or a patch of changed coordinates); returns the model."""
        self._held = _apply_vector_message(self.params, server_message)
        return self._held

    def receive_anchor(self, broadcast: bytes) -> None:
        raise WireError(f"{type(self).__name__} receives no anchor broadcast")

    def _rng(self, round: int) -> np.random.Generator:
        """The client's randomness in round ``round``, seeded as :meth:`Client.train` seeds its compressor."""
        return np.random.default_rng([self.cfg.seed, round, self.client_id])

    def _extra(self) -> dict[str, Any]:
        return {}

    def _load(self, tree: dict) -> None:
        pass

    def state_bytes(self) -> bytes:
        """The held model, trainable layers, last loss and the method's own state as bytes."""
        return pack({"kind": self.STATE_KIND, "client_id": self.client_id, "held": self._held,
                     "trainable_layers": self.trainable_layers,
                     "train_loss": self.train_loss, **self._extra()})

    @classmethod
    def from_state_bytes(cls, cfg: HFLConfig, buf: bytes, learner: Learner) -> _PeerClient:
        """The client :meth:`state_bytes` saved, under configuration ``cfg``."""
        tree = unpack(buf)
        cid, held, layers, loss = field(tree, cls.STATE_KIND, "client_id", "held", "trainable_layers", "train_loss")
        out = cls(cfg, cid, learner)
        if held is not None and held.shape != out.theta0.shape:
            raise WireError(f"client state: held model has shape {held.shape}, expected {out.theta0.shape}")
        out._held = held
        out.set_trainable_layers(layers)
        out.train_loss = loss
        out._load(tree)
        return out


def _vector_state(tree: dict, name: str, shape: tuple[int, ...]) -> np.ndarray:
    arr = tree.get(name)
    if not isinstance(arr, np.ndarray) or arr.shape != shape:
        raise WireError(f"state: {name} must be an array of shape {shape}")
    return arr


class _ChainClient(_PeerClient):
    """A client whose downlink is a chain of cached updates (``TAG``) or one of Sluice's messages."""

    TAG: ClassVar[bytes] = b""

    def _apply_entry(self, model: np.ndarray, entry: bytes) -> None:  # pragma: no cover - subclasses
        raise NotImplementedError

    def sync(self, server_message: bytes) -> np.ndarray:
        if not is_update_message(server_message):
            return super().sync(server_message)
        entries = unpack_updates(server_message, self.TAG, self.d)
        held = self.params.copy()
        for entry in entries:
            if entry:
                self._apply_entry(held, entry)
        self._held = held
        return held
