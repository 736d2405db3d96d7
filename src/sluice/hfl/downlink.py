"""Downlink: what each terminal receives so that it holds the server model exactly (SPEC C4).

The server never keeps a model copy per terminal. It keeps one round stamp per coordinate,
``stamp[i]`` = the last round in which coordinate i changed — the compacted log of its sparse updates
(O(d) memory whatever the number of rounds or terminals) — and, per terminal, the round it last synced.
A terminal that synced at round r holds θ_r, which equals θ_t on every coordinate not changed since r, so
the message for it is the *changed* coordinates ``{i : stamp[i] > r}`` with their current values. The
terminal overwrites those coordinates and holds θ_t bit for bit. Whenever the dense model encodes
smaller, it is sent dense instead.

Modes (``compression.downlink``):

* ``dense``: the whole model, every time.
* ``initial``: changes relative to the initial model θ_0 (terminals keep θ_0 and the message replaces the
  changed coordinates): ``r = 0`` for everyone.
* ``per-client``: changes since that terminal's last synced round.
* ``anchor``: every A rounds the current model becomes the anchor and is broadcast to every terminal as a
  patch against the previous anchor (counted once per terminal); a sampled terminal then gets the changes
  since the anchor round. The server keeps no state per terminal at all, only the anchor round.
"""

from __future__ import annotations

import numpy as np

from sluice.compress.wire import DensePayload, SparsePayload, decode, encode
from sluice.errors import ConfigError, WireError

MODES = ("dense", "initial", "per-client", "anchor")


class Downlink:
    """Builds the encoded downlink message for a terminal and tracks who holds what."""

    def __init__(self, d: int, mode: str, anchor_every: int = 10) -> None:
        if mode not in MODES:
            raise ConfigError(f"compression.downlink must be one of {', '.join(MODES)}, got {mode!r}")
        self.d = d
        self.mode = mode
        self.anchor_every = anchor_every
        self.stamp = np.zeros(d, dtype=np.int32)
        self.round = 0
        self.anchor_round = 0
        self.synced: dict[int, int] = {}

    def record(self, changed: np.ndarray) -> None:
        """Note that the server finished a round changing coordinates ``changed``."""
        self.round += 1
        self.stamp[changed] = self.round

    def anchor_broadcast(self, params: np.ndarray) -> bytes | None:
        """In anchor mode, every A rounds: make ``params`` the anchor and return the message every terminal
        receives (a patch against the previous anchor, or dense if smaller); otherwise None."""
        if self.mode != "anchor" or self.round % self.anchor_every or self.round == self.anchor_round:
            return None
        msg = self._encode(params, self.anchor_round)
        self.anchor_round = self.round
        return msg

    def _base_round(self, terminal: int) -> int | None:
        """The round whose model the terminal can patch, or None when it must get the model dense."""
        if self.mode == "initial":
            return 0
        if self.mode == "per-client":
            return self.synced.get(terminal, 0)
        if self.mode == "anchor":
            return self.anchor_round
        return None

    def message(self, terminal: int, params: np.ndarray) -> bytes:
        """The encoded message that brings ``terminal`` to ``params`` (the current server model)."""
        base = self._base_round(terminal)
        if self.mode == "per-client":
            self.synced[terminal] = self.round
        return self._encode(params, base)

    def _encode(self, params: np.ndarray, base: int | None) -> bytes:
        """The changes since round ``base`` as a sparse patch, or the dense model when that is smaller."""
        dense = encode(DensePayload(values=params.astype(np.float32)))
        if base is None:
            return dense
        idx = np.flatnonzero(self.stamp > base)
        sparse = encode(SparsePayload(d=self.d, values=params[idx].astype(np.float32), indices=idx, seed=None))
        return sparse if len(sparse) < len(dense) else dense


def apply_message(model: np.ndarray | None, buf: bytes) -> np.ndarray:
    """Terminal side: the model after applying a downlink message to what it held (θ_0 at first)."""
    payload = decode(buf)
    if isinstance(payload, DensePayload):
        return payload.values.astype(np.float32).copy()
    if not isinstance(payload, SparsePayload) or payload.indices is None:
        raise WireError("a downlink message must be a dense model or a sparse patch with explicit indices")
    if model is None:
        raise WireError("a sparse downlink patch needs the model the terminal already holds")
    out = model.copy()
    out[payload.indices] = payload.values.astype(np.float32)
    return out
