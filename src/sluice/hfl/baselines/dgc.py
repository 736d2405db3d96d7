"""DGC, Deep Gradient Compression (top-k with momentum correction and warm-up), on Sluice's HFL engine
(:mod:`sluice.hfl.baselines`).

**DGC** — Deep Gradient Compression (Lin, Han, Mao, Wang, Dally, ICLR 2018), on the client update Δ in
place of the gradient. Momentum correction: ``u ← m·u + Δ``, ``v ← v + u``; the client sends the top-k of
``|v|`` (fp32 values and positions, the index block coded as the smallest of Golomb-Rice, bitmap and raw)
and zeroes ``v`` and ``u`` there (momentum factor masking). Warm-up training: the density falls
exponentially, 25%, 6.25%, 1.5625%, ... over the first ``warmup_rounds`` rounds (the paper does it over its
first four epochs) and is ``up_ratio`` afterwards. The server averages the sparse uploads and applies them.
DGC does not compress the downlink: every client gets the dense fp32 model. Not carried over: local
gradient clipping (the paper uses it for its RNNs; local training here is Sluice's, unclipped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from torch.utils.data import Dataset

from sluice.compress.estimate import to_dense, topk_indices
from sluice.errors import WireError
from sluice.hfl.baselines._common import _count, _PeerClient, _PeerServer, _vector_state
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.wire.vector import DensePayload, SparsePayload, decode, encode

__all__ = ["DGCClient", "DGCParams", "DGCServer"]


@dataclass(frozen=True)
class DGCParams:
    """DGC's own settings (the density after warm-up is ``compression.up_ratio``).

    ``momentum`` m = 0.9 (the paper's momentum SGD). ``warmup_rounds``: rounds over which the density
    falls exponentially (by 4 per stage, four stages, as in the paper's four warm-up epochs) before it
    reaches ``up_ratio``; 0 disables warm-up.
    """

    momentum: float = 0.9
    warmup_rounds: int = 4


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
