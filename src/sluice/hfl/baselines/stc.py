"""STC, sparse ternary compression with error feedback both ways, on Sluice's HFL engine
(:mod:`sluice.hfl.baselines`).

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import Dataset

from sluice.compress.estimate import topk_indices
from sluice.errors import WireError
from sluice.hfl.baselines._common import _ChainClient, _count, _down_share, _PeerServer, _UpdateCache, _vector_state
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.wire.updates import TAG_TERNARY, pack_updates, read_ternary, ternary_entry, unpack_updates

__all__ = ["STCClient", "STCParams", "STCServer"]


@dataclass(frozen=True)
class STCParams:
    """STC's own settings (p_up, p_down: ``compression.up_ratio`` / ``down_ratio``; the paper uses 1/400).

    ``cache_rounds`` is τ, the number of past server updates kept for clients that missed rounds. None
    keeps as many recent updates as are together smaller than the dense model: a longer chain would never
    be sent (the full model would be cheaper), so this is the τ the paper's rule "or the full model if
    cheaper" needs, with memory bounded by one model.
    """

    cache_rounds: int | None = None


def _ternarise(a: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.float32, np.ndarray]:
    """STC_k(a): (sorted positions, negative signs, μ as fp32, the fp32 values ±μ) of the top-k of |a|."""
    idx = topk_indices(a, k)
    kept = a[idx]
    mu = np.float32(np.mean(np.abs(kept))) if idx.size else np.float32(0.0)
    neg = kept < 0
    return idx, neg, mu, np.where(neg, -mu, mu).astype(np.float32)


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
