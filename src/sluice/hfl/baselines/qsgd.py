"""QSGD, quantised FedAvg with stochastic rounding to 8-bit levels, on Sluice's HFL engine
(:mod:`sluice.hfl.baselines`).

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
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import Dataset

from sluice.errors import TrainingError, WireError
from sluice.hfl.baselines._common import _ChainClient, _PeerServer, _UpdateCache
from sluice.hfl.config import HFLConfig
from sluice.wire.updates import TAG_QSGD, pack_updates, qsgd_entry, read_qsgd, unpack_updates

__all__ = ["QSGDClient", "QSGDParams", "QSGDServer"]


@dataclass(frozen=True)
class QSGDParams:
    """QSGD's own settings: ``levels`` s = 127 (8 bits with the sign), ``bucket`` B = 512 coordinates per
    norm, ``cache_rounds`` as :class:`STCParams` (None: as many as are smaller than the dense model)."""

    levels: int = 127
    bucket: int = 512
    cache_rounds: int | None = None


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
