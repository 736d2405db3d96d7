"""FetchSGD, count sketches with momentum and error accumulation in sketch space, on Sluice's HFL engine
(:mod:`sluice.hfl.baselines`).

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from torch.utils.data import Dataset

from sluice.compress.estimate import sketch_hashes, topk_indices
from sluice.compress.stages import count_sketch
from sluice.errors import WireError
from sluice.hfl.baselines._common import _count, _down_share, _PeerClient, _PeerServer, _SyncTracker, _vector_state
from sluice.hfl.config import HFLConfig
from sluice.wire.vector import SketchPayload, decode, encode

__all__ = ["FetchSGDClient", "FetchSGDParams", "FetchSGDServer"]


@dataclass(frozen=True)
class FetchSGDParams:
    """FetchSGD's own settings (sketch shape, k, ρ: from the configuration, see the module docstring).

    ``unsketch``: the median over rows (the count-sketch heavy-hitter estimate, as in the paper).
    ``values``: the sketch table's wire type (fp32 in the paper).
    """

    unsketch: Literal["median", "mean"] = "median"
    values: Literal["fp32", "fp16"] = "fp32"


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
