"""Published compression methods ("peers") on Sluice's own HFL engine, under Sluice's byte accounting.

Each peer is a server half and a client half with the constructors and methods of
:class:`sluice.hfl.server.Server` and :class:`sluice.hfl.client.Client`, so :class:`sluice.hfl.engine.HFLEngine`
drives it unchanged (``HFLEngine(cfg, server_cls=..., client_cls=...)``): the same client sampling, data,
local training (:meth:`sluice.hfl.client.Client.local_update`, the same seeds) and the same byte
count, ``len()`` of every encoded message. Only the compression differs. Every message is real bytes that
the other half decodes: vector payloads (:mod:`sluice.wire.vector`) or, for the ternary and quantised codes,
a raw frame of updates (:mod:`sluice.wire.updates`); either way it carries a CRC-32, and a corrupted message
raises :class:`WireError`. Nothing crosses between the halves beside the bytes except what Sluice's own
halves share: the configuration (its seed) and the round number.

:data:`PEERS` maps a display name to ``(server class, client class, config overrides)``. The ratios come
from the configuration where their meaning matches the method's, so a benchmark can put every method on the
same budget: ``compression.up_ratio`` is the share of coordinates a client sends (STC's p_up, DGC's
density), ``compression.down_ratio`` the share the server applies and sends (STC's p_down, FetchSGD's k/d;
when unset, the share Sluice's own server applies in a round where every sampled client uploads),
``compression.momentum`` FetchSGD's server momentum ρ, ``compression.sketch_rows`` /
``sketch_cols_ratio`` FetchSGD's sketch shape and ``train.server_lr`` the server step size (1 in every paper).
Each method's other hyper-parameters sit in a small frozen dataclass (the class attribute ``hparams``), set
to the values its paper recommends.

**FedAvg** (McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017). Sluice's own halves with everything dense: fp32 updates up, the fp32 model down, the plain
weighted average applied. It is the uncompressed reference.

**STC** — sparse ternary compression (Sattler, Wiedemann, Müller, Samek, "Robust and Communication-Efficient
Federated Learning from Non-IID Data", IEEE TNNLS 31(9), 2020). Both directions send
``STC_p(A) = μ·sign(A)`` on the ``k = max(1, round(p·d))`` largest ``|A_i|``, ``μ`` the mean magnitude of
the kept values, with error feedback on both sides: a client sends ``STC(R_i + Δ_i)`` and keeps
``R_i ← R_i + Δ_i − STC(R_i + Δ_i)``; the server averages the ternary uploads, applies
``T = STC(R + η·avg)`` and keeps ``R ← R + η·avg − T``. A ternary message holds k, μ (fp32), one sign bit
per kept value and the positions as Golomb-Rice coded gaps (Sluice's coder, which picks the exactly optimal
Rice parameter for the gaps, at least as good as the paper's parameter formula for geometric gaps).
Partial participation uses the paper's caching: the server keeps its last τ ternary updates (τ adaptive by
default: as many as are together smaller than the dense model; :class:`STCParams`), and a client that
missed rounds receives the cheapest of (a) the cached updates it missed, each in the ternary code, which it
adds in the server's order (the partial sum, sent as its summands), (b) the partial sum as a sparse patch
(the current fp32 values at the coordinates changed since its last sync) and (c) the full model. All three
make it hold the server model bit for bit. Paper setting: p_up = p_down = 1/400 (here
``compression.up_ratio`` / ``down_ratio``).

**FetchSGD** (Rothchild, Panda, Ullah, Ivkin, Stoica, Braverman, Gonzalez, Arora, "FetchSGD:
Communication-Efficient Federated Learning with Sketching", ICML 2020). A client sends a count sketch
(``compression.sketch_rows`` rows × ``round(sketch_cols_ratio·d)`` columns, fp32) of its update and keeps no
state. All sketches of a run use one set of hash functions, derived from the configuration seed (the
seed also travels in each sketch and the server checks it): momentum and error accumulation in sketch
space need the same hashes in every round. The server averages the sketches (a sketch is linear: the
average of sketches is the sketch of the average), then ``S_u ← ρ·S_u + S``, ``S_e ← S_e + η·S_u``,
unsketches ``S_e`` with the median over rows and applies the top-k (``k = down_ratio·d``) estimates; it
zeroes ``S_u`` and ``S_e`` at the buckets the applied coordinates hash to (error and momentum reset, as the
authors' code does; it notes that subtracting the sketch of the step instead diverges). Downlink, as in the
paper's setup: the coordinates changed since the client's last sync with their current fp32 values (or
the dense model when smaller), so the client holds the server model exactly. ρ = 0.9 (the paper's), set by
the registry's overrides.

**DGC** — Deep Gradient Compression (Lin, Han, Mao, Wang, Dally, ICLR 2018), on the client update Δ in
place of the gradient. Momentum correction: ``u ← m·u + Δ``, ``v ← v + u``; the client sends the top-k of
``|v|`` (fp32 values and positions, the index block coded as the smallest of Golomb-Rice, bitmap and raw)
and zeroes ``v`` and ``u`` there (momentum factor masking). Warm-up training: the density falls
exponentially, 25%, 6.25%, 1.5625%, ... over the first ``warmup_rounds`` rounds (the paper does it over its
first four epochs) and is ``up_ratio`` afterwards. The server averages the sparse uploads and applies them.
DGC does not compress the downlink: every client gets the dense fp32 model. Not carried over: local
gradient clipping (the paper uses it for its RNNs; local training here is Sluice's, unclipped).

**QSGD** (Alistarh, Grubic, Li, Tomioka, Vojnovic, "QSGD: Communication-Efficient SGD via Gradient
Quantization and Encoding", NeurIPS 2017), quantised FedAvg. Each value of a bucket of B coordinates
becomes ``‖v_bucket‖₂ · sign(v_i) · ξ_i / s`` with ``ξ_i`` the stochastic rounding of ``s·|v_i|/‖v‖₂`` to a
neighbouring integer level (unbiased). s = 127 so sign and level fit one signed byte: 8 bits per
coordinate plus one fp32 norm per bucket of B = 512 (bucketing as in the paper; the Elias coding of the
paper is optional and not used: a plain 8-bit packing, documented in :mod:`sluice.wire.updates`). QSGD has no
server (workers broadcast quantised gradients to each other, so nothing travels unquantised): here the
server quantises its averaged update the same way, applies the dequantised update and sends it; a client
that missed rounds gets the cached quantised updates it missed, or the dense fp32 model when that is
smaller. Clients rebuild the server model bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from torch.utils.data import Dataset

from sluice.compress.codecs import count_sketch, sketch_hashes, to_dense, topk_indices
from sluice.errors import TrainingError, WireError
from sluice.hfl.client import Client
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.hfl.server import Server, UploadInbox
from sluice.wire.state import field, pack, unpack
from sluice.wire.updates import (
    TAG_QSGD,
    TAG_TERNARY,
    is_update_message,
    pack_updates,
    qsgd_entry,
    read_qsgd,
    read_ternary,
    ternary_entry,
    unpack_updates,
)
from sluice.wire.vector import DensePayload, SketchPayload, SparsePayload, decode, encode

__all__ = [
    "PEERS",
    "DGCClient",
    "DGCParams",
    "DGCServer",
    "FetchSGDClient",
    "FetchSGDParams",
    "FetchSGDServer",
    "QSGDClient",
    "QSGDParams",
    "QSGDServer",
    "STCClient",
    "STCParams",
    "STCServer",
]


# -------------------------------------------------------------------------------------- hyper-parameters
@dataclass(frozen=True)
class STCParams:
    """STC's own settings (p_up, p_down: ``compression.up_ratio`` / ``down_ratio``; the paper uses 1/400).

    ``cache_rounds`` is τ, the number of past server updates kept for clients that missed rounds. None
    keeps as many recent updates as are together smaller than the dense model: a longer chain would never
    be sent (the full model would be cheaper), so this is the τ the paper's rule "or the full model if
    cheaper" needs, with memory bounded by one model.
    """

    cache_rounds: int | None = None


@dataclass(frozen=True)
class FetchSGDParams:
    """FetchSGD's own settings (sketch shape, k, ρ: from the configuration, see the module docstring).

    ``unsketch``: the median over rows (the count-sketch heavy-hitter estimate, as in the paper).
    ``values``: the sketch table's wire type (fp32 in the paper).
    """

    unsketch: Literal["median", "mean"] = "median"
    values: Literal["fp32", "fp16"] = "fp32"


@dataclass(frozen=True)
class DGCParams:
    """DGC's own settings (the density after warm-up is ``compression.up_ratio``).

    ``momentum`` m = 0.9 (the paper's momentum SGD). ``warmup_rounds``: rounds over which the density
    falls exponentially (by 4 per stage, four stages, as in the paper's four warm-up epochs) before it
    reaches ``up_ratio``; 0 disables warm-up.
    """

    momentum: float = 0.9
    warmup_rounds: int = 4


@dataclass(frozen=True)
class QSGDParams:
    """QSGD's own settings: ``levels`` s = 127 (8 bits with the sign), ``bucket`` B = 512 coordinates per
    norm, ``cache_rounds`` as :class:`STCParams` (None: as many as are smaller than the dense model)."""

    levels: int = 127
    bucket: int = 512
    cache_rounds: int | None = None


# ---------------------------------------------------------------------------------------------- helpers
def _down_share(cfg: HFLConfig, num_clients: int) -> float:
    """The share the server applies per round: ``compression.down_ratio``, or when unset Sluice's share for
    the uploads a round expects, ``round(q·n)`` of ``n``, so peers get the budget Sluice gets."""
    return cfg.compression.down_share(max(1, round(cfg.train.participation * num_clients)), num_clients)


def _count(ratio: float, d: int) -> int:
    """``k = max(1, round(ratio·d))``, at most ``d``."""
    return min(d, max(1, round(ratio * d)))


def _ternarise(a: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.float32, np.ndarray]:
    """STC_k(a): (sorted positions, negative signs, μ as fp32, the fp32 values ±μ) of the top-k of |a|."""
    idx = topk_indices(a, k)
    kept = a[idx]
    mu = np.float32(np.mean(np.abs(kept))) if idx.size else np.float32(0.0)
    neg = kept < 0
    return idx, neg, mu, np.where(neg, -mu, mu).astype(np.float32)


def _qsgd_dequantise(norms: np.ndarray, q: np.ndarray, levels: int, bucket: int) -> np.ndarray:
    """fp32 ``norm · q / s``, computed the same way on both sides (so both add the same fp32 values)."""
    return (np.repeat(norms.astype(np.float32), bucket)[: q.shape[0]] * q.astype(np.float32)) / np.float32(levels)


def _qsgd_quantise(v: np.ndarray, levels: int, bucket: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """QSGD's Q_s per bucket: (fp32 bucket norms, int8 signed levels).

    ``r = s·|v_i|/‖v‖`` is rounded up with probability ``r − ⌊r⌋``, so ``E[‖v‖·ξ/s] = |v_i|``. The norm is
    the fp32 norm rounded up (never below the exact one, so ``r ≤ s``), the one the receiver multiplies by.
    """
    d = v.shape[0]
    nb = -(-d // bucket)
    pad = np.zeros(nb * bucket, dtype=np.float64)
    pad[:d] = v
    blocks = pad.reshape(nb, bucket)
    exact = np.sqrt(np.sum(blocks * blocks, axis=1))
    norms = exact.astype(np.float32)
    low = norms.astype(np.float64) < exact
    norms[low] = np.nextafter(norms[low], np.float32(np.inf))
    n64 = norms.astype(np.float64)[:, None]
    r = np.divide(np.abs(blocks) * levels, n64, out=np.zeros_like(blocks), where=n64 > 0)
    r = np.minimum(r, levels)
    low_level = np.floor(r)
    xi = low_level + (rng.random(r.shape) < r - low_level)
    q = (np.sign(blocks) * xi).reshape(-1)[:d].astype(np.int8)
    return norms, q


def _read_qsgd(entry: bytes, d: int) -> np.ndarray:
    """The fp32 dequantised vector of a QSGD entry."""
    return _qsgd_dequantise(*read_qsgd(entry, d))


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


# --------------------------------------------------------------------------------------------------- STC
class STCServer(_PeerServer):
    """STC's server: average the ternary uploads, ternarise (residual + average) with error feedback, cache
    the update for clients that missed rounds (see the module docstring)."""

    STATE_KIND = "stc-server"
    hparams: ClassVar[STCParams] = STCParams()

    def __init__(self, cfg: HFLConfig, params: np.ndarray, num_clients: int, *, output_layer: int = 0) -> None:
        super().__init__(cfg, params, num_clients, output_layer=output_layer)
        self.k = _count(_down_share(cfg, num_clients), self.d)
        self.residual = np.zeros(self.d, dtype=np.float64)
        self.cache = _UpdateCache(self.d, TAG_TERNARY, self.hparams.cache_rounds)

    def message(self, client_id: int) -> bytes:
        return self.cache.message(self._check_client(client_id), self._params)

    def _decode_upload(self, upload: bytes) -> np.ndarray:
        entries = unpack_updates(upload, TAG_TERNARY, self.d)
        if len(entries) != 1:
            raise WireError(f"an STC upload holds one ternary update, got {len(entries)}")
        idx, vals = read_ternary(entries[0], self.d)
        est = np.zeros(self.d, dtype=np.float64)
        est[idx] = vals
        return est

    def _step(self, avg: np.ndarray) -> None:
        a = self.residual + self.cfg.train.server_lr * avg
        idx, neg, mu, vals = _ternarise(a, self.k)
        a[idx] -= vals
        self.residual = a
        self._params[idx] += vals
        self.cache.record(idx, ternary_entry(idx, neg, mu))

    def _idle(self) -> None:
        self.cache.record(np.zeros(0, dtype=np.int64), b"")

    def _extra(self) -> dict[str, Any]:
        return {"residual": self.residual, "cache": self.cache.to_tree()}

    def _load(self, tree: dict) -> None:
        self.residual = _vector_state(tree, "residual", (self.d,))
        self.cache.load(tree.get("cache"))


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


class STCClient(_ChainClient):
    """STC's client: ternarise (residual + Δ) with error feedback; applies the server's ternary updates."""

    STATE_KIND = "stc-client"
    TAG = TAG_TERNARY

    def __init__(self, cfg: HFLConfig, client_id: int, learner: Learner) -> None:
        super().__init__(cfg, client_id, learner)
        self.k = _count(cfg.compression.up_ratio, self.d)
        self.residual = np.zeros(self.d, dtype=np.float64)

    def _apply_entry(self, model: np.ndarray, entry: bytes) -> None:
        idx, vals = read_ternary(entry, self.d)
        model[idx] += vals

    def train(self, server_message: bytes, data: Dataset, round: int) -> bytes:
        held = self.sync(server_message)
        a = self.residual + self.local_update(held, data, round)
        idx, neg, mu, vals = _ternarise(a, self.k)
        a[idx] -= vals
        self.residual = a
        return pack_updates(TAG_TERNARY, self.d, [ternary_entry(idx, neg, mu)])

    def _extra(self) -> dict[str, Any]:
        return {"residual": self.residual}

    def _load(self, tree: dict) -> None:
        self.residual = _vector_state(tree, "residual", (self.d,))


# ---------------------------------------------------------------------------------------------- FetchSGD
def _sketch_seed(cfg: HFLConfig) -> int:
    """The hash seed of every sketch of a run, derived from the configuration seed (both halves know it)."""
    return int(np.random.default_rng([cfg.seed, 0xF37C]).integers(0, 2**63))


def _sketch_shape(cfg: HFLConfig, d: int) -> tuple[int, int]:
    c = cfg.compression
    return c.sketch_rows, max(1, round(c.sketch_cols_ratio * d))


class FetchSGDServer(_PeerServer):
    """FetchSGD's server: momentum and error accumulation in sketch space, top-k of the unsketched error
    applied; per-client downlink of the changed coordinates (see the module docstring)."""

    STATE_KIND = "fetchsgd-server"
    hparams: ClassVar[FetchSGDParams] = FetchSGDParams()

    def __init__(self, cfg: HFLConfig, params: np.ndarray, num_clients: int, *, output_layer: int = 0) -> None:
        super().__init__(cfg, params, num_clients, output_layer=output_layer)
        self.rows, self.cols = _sketch_shape(cfg, self.d)
        self.seed = _sketch_seed(cfg)
        self.k = _count(_down_share(cfg, num_clients), self.d)
        self.rho = cfg.compression.momentum
        self.momentum = np.zeros((self.rows, self.cols), dtype=np.float64)  # S_u
        self.error = np.zeros((self.rows, self.cols), dtype=np.float64)  # S_e
        self.downlink = _SyncTracker(self.d)
        self._hashes: tuple[np.ndarray, np.ndarray] | None = None

    def _hash_tables(self) -> tuple[np.ndarray, np.ndarray]:
        if self._hashes is None:
            self._hashes = sketch_hashes(self.d, self.rows, self.cols, self.seed)
        return self._hashes

    def message(self, client_id: int) -> bytes:
        return self.downlink.message(self._check_client(client_id), self._params)

    def _decode_upload(self, upload: bytes) -> np.ndarray:
        p = decode(upload)
        if not isinstance(p, SketchPayload):
            raise WireError(f"a FetchSGD upload is a count sketch, got a {type(p).__name__}")
        if (p.d, p.rows, p.cols, p.seed) != (self.d, self.rows, self.cols, self.seed):
            raise WireError(f"sketch of d={p.d} with {p.rows}x{p.cols} buckets and seed {p.seed}; this run "
                            f"sketches d={self.d} with {self.rows}x{self.cols} buckets and seed {self.seed}")
        return p.table.astype(np.float64)

    def _step(self, avg: np.ndarray) -> None:
        self.momentum = self.rho * self.momentum + avg
        self.error = self.error + self.cfg.train.server_lr * self.momentum
        buckets, signs = self._hash_tables()
        per_row = signs * np.take_along_axis(self.error, buckets, axis=1)
        est = np.median(per_row, axis=0) if self.hparams.unsketch == "median" else per_row.mean(axis=0)
        idx = topk_indices(est, self.k)
        step = est[idx].astype(np.float32)
        rows = np.arange(self.rows)[:, None]
        self.error[rows, buckets[:, idx]] = 0.0
        self.momentum[rows, buckets[:, idx]] = 0.0
        self._params[idx] += step
        self.downlink.record(idx)

    def _idle(self) -> None:
        self.downlink.record(np.zeros(0, dtype=np.int64))

    def _extra(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "error": self.error, "downlink": self.downlink.to_tree()}

    def _load(self, tree: dict) -> None:
        self.momentum = _vector_state(tree, "momentum", (self.rows, self.cols))
        self.error = _vector_state(tree, "error", (self.rows, self.cols))
        self.downlink.load(tree.get("downlink"))


class FetchSGDClient(_PeerClient):
    """FetchSGD's client: stateless; uploads the count sketch of its update (the run's hash functions)."""

    STATE_KIND = "fetchsgd-client"
    hparams: ClassVar[FetchSGDParams] = FetchSGDParams()

    def train(self, server_message: bytes, data: Dataset, round: int) -> bytes:
        held = self.sync(server_message)
        delta = self.local_update(held, data, round)
        rows, cols = _sketch_shape(self.cfg, self.d)
        payload, _ = count_sketch(rows, cols, seed=_sketch_seed(self.cfg)).update(delta, cols, self._rng(round))
        table = payload.table.astype(np.float16 if self.hparams.values == "fp16" else np.float32)
        return encode(SketchPayload(d=payload.d, seed=payload.seed, table=table))


# --------------------------------------------------------------------------------------------------- DGC
class DGCServer(_PeerServer):
    """DGC's server: average the sparse uploads and apply them; the downlink is the dense fp32 model."""

    STATE_KIND = "dgc-server"

    def message(self, client_id: int) -> bytes:
        self._check_client(client_id)
        return encode(DensePayload(self._params))

    def _decode_upload(self, upload: bytes) -> np.ndarray:
        p = decode(upload)
        if not isinstance(p, SparsePayload) or p.indices is None:
            raise WireError("a DGC upload is a sparse vector with explicit indices")
        return to_dense(p, self.d)

    def _step(self, avg: np.ndarray) -> None:
        self._params += (self.cfg.train.server_lr * avg).astype(np.float32)


class DGCClient(_PeerClient):
    """DGC's client: momentum correction, local accumulation, top-k with momentum factor masking, warm-up."""

    STATE_KIND = "dgc-client"
    hparams: ClassVar[DGCParams] = DGCParams()

    def __init__(self, cfg: HFLConfig, client_id: int, learner: Learner) -> None:
        super().__init__(cfg, client_id, learner)
        self.velocity = np.zeros(self.d, dtype=np.float64)  # u
        self.accumulated = np.zeros(self.d, dtype=np.float64)  # v

    def density(self, round: int) -> float:
        """The share of coordinates sent in round ``round``: 0.25^(stage+1) during warm-up (four stages over
        ``warmup_rounds`` rounds), never below ``up_ratio``; ``up_ratio`` afterwards."""
        final = self.cfg.compression.up_ratio
        w = self.hparams.warmup_rounds
        if w <= 0 or round > w:
            return final
        stage = (round - 1) * 4 // w
        return max(final, 0.25 ** (stage + 1))

    def train(self, server_message: bytes, data: Dataset, round: int) -> bytes:
        held = self.sync(server_message)
        delta = self.local_update(held, data, round)
        self.velocity = self.hparams.momentum * self.velocity + delta
        self.accumulated = self.accumulated + self.velocity
        idx = topk_indices(self.accumulated, _count(self.density(round), self.d))
        values = self.accumulated[idx].astype(np.float32)
        self.accumulated[idx] = 0.0
        self.velocity[idx] = 0.0
        return encode(SparsePayload(d=self.d, values=values, indices=idx))

    def _extra(self) -> dict[str, Any]:
        return {"velocity": self.velocity, "accumulated": self.accumulated}

    def _load(self, tree: dict) -> None:
        self.velocity = _vector_state(tree, "velocity", (self.d,))
        self.accumulated = _vector_state(tree, "accumulated", (self.d,))


# -------------------------------------------------------------------------------------------------- QSGD
class QSGDServer(_PeerServer):
    """QSGD's server: average the dequantised uploads, quantise the averaged update the same way, apply the
    dequantised update and send it (cached chain for clients that missed rounds, or the dense model)."""

    STATE_KIND = "qsgd-server"
    hparams: ClassVar[QSGDParams] = QSGDParams()

    def __init__(self, cfg: HFLConfig, params: np.ndarray, num_clients: int, *, output_layer: int = 0) -> None:
        super().__init__(cfg, params, num_clients, output_layer=output_layer)
        if not 1 <= self.hparams.levels <= 127 or self.hparams.bucket < 1:
            raise TrainingError(f"QSGD needs 1 <= s <= 127 and B >= 1, got {self.hparams}")
        self.cache = _UpdateCache(self.d, TAG_QSGD, self.hparams.cache_rounds)

    def message(self, client_id: int) -> bytes:
        return self.cache.message(self._check_client(client_id), self._params)

    def _decode_upload(self, upload: bytes) -> np.ndarray:
        entries = unpack_updates(upload, TAG_QSGD, self.d)
        if len(entries) != 1:
            raise WireError(f"a QSGD upload holds one quantised update, got {len(entries)}")
        return _read_qsgd(entries[0], self.d).astype(np.float64)

    def _step(self, avg: np.ndarray) -> None:
        s, b = self.hparams.levels, self.hparams.bucket
        # the server's randomness: seeded like a client's, with an id no client has
        rng = np.random.default_rng([self.cfg.seed, self._round + 1, self.num_clients])
        norms, q = _qsgd_quantise(self.cfg.train.server_lr * avg, s, b, rng)
        self._params += _qsgd_dequantise(norms, q, s, b)
        self.cache.record(np.flatnonzero(q), qsgd_entry(norms, q, s, b))

    def _idle(self) -> None:
        self.cache.record(np.zeros(0, dtype=np.int64), b"")

    def _extra(self) -> dict[str, Any]:
        return {"cache": self.cache.to_tree()}

    def _load(self, tree: dict) -> None:
        self.cache.load(tree.get("cache"))


class QSGDClient(_ChainClient):
    """QSGD's client: uploads its update quantised (unbiased, s levels, per-bucket norms); applies the
    server's quantised updates."""

    STATE_KIND = "qsgd-client"
    TAG = TAG_QSGD
    hparams: ClassVar[QSGDParams] = QSGDParams()

    def _apply_entry(self, model: np.ndarray, entry: bytes) -> None:
        model += _read_qsgd(entry, self.d)

    def train(self, server_message: bytes, data: Dataset, round: int) -> bytes:
        held = self.sync(server_message)
        delta = self.local_update(held, data, round)
        s, b = self.hparams.levels, self.hparams.bucket
        norms, q = _qsgd_quantise(delta, s, b, self._rng(round))
        return pack_updates(TAG_QSGD, self.d, [qsgd_entry(norms, q, s, b)])


# ---------------------------------------------------------------------------------------------- registry
PEERS: dict[str, tuple[type, type, list[str]]] = {
    "FedAvg": (Server, Client, ['compression.up="dense"', 'compression.down="dense"',
                                'compression.downlink="dense"']),
    "STC": (STCServer, STCClient, ['compression.up="topk"', "compression.up_by_weight=0", 'compression.down="topk"',
                                   'compression.downlink="per-client"']),
    "FetchSGD": (FetchSGDServer, FetchSGDClient, ['compression.up="sketch"', 'compression.up_values="fp32"',
                                                  'compression.down="topk"', 'compression.momentum=0.9',
                                                  'compression.downlink="per-client"']),
    "DGC": (DGCServer, DGCClient, ['compression.up="topk"', "compression.up_by_weight=0",
                                   'compression.up_values="fp32"', 'compression.down="dense"',
                                   'compression.downlink="dense"']),
    "QSGD 8-bit": (QSGDServer, QSGDClient, ['compression.up="dense"', 'compression.down="dense"',
                                            'compression.downlink="per-client"']),
}
"""Display name -> (server class, client class, configuration overrides the method needs or implies).

The overrides describe each method in Sluice's configuration terms (what travels up, whether the server
applies a sparse or dense step, which downlink; every upload of STC and DGC keeps the same share); the classes
read only the ratios, the sketch shape, the momentum (FetchSGD's ρ = 0.9 is set here) and the training settings
from the configuration."""
