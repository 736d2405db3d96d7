"""Downlink: what each client receives so that it holds the server model exactly (SPEC C4).

The server never keeps a model copy per client. It keeps the log of its sparse steps (indices and
values of every round since the oldest round some client still needs: O(rounds·k) memory), one round
stamp per coordinate (``stamp[i]`` = the last round coordinate i changed) and, per client, the round it
last synced. A client that synced at round r holds θ_r exactly, and the message for it is the smallest of

* the **patch chain**: the logged steps of rounds r+1..t, which the client adds in order, repeating the
  server's own float32 additions (cheap when steps travel as signs or int8: one compact frame, see
  :mod:`sluice.wire.vector`);
* the **replacement patch**: the coordinates changed since r, ``{i : stamp[i] > r}``, with their current
  fp32 values, which the client overwrites (cheap when the same coordinates changed several times);
* the dense model.

Either way the client holds θ_t bit for bit.

Modes (``compression.downlink``):

* ``dense``: the whole model, every time.
* ``initial``: changes relative to the initial model θ_0, which clients keep: ``r = 0`` for everyone.
* ``per-client``: changes since that client's last synced round.
* ``anchor``: every A rounds the current model becomes the anchor and is broadcast to every client as a
  patch against the previous anchor (counted once per client); clients keep the anchor, and a sampled
  client gets the changes since the anchor round to apply to it. The server keeps no state per client,
  only the anchor round and the steps since it.
"""

from __future__ import annotations

import numpy as np

from sluice.errors import ConfigError, WireError
from sluice.hfl.state import field
from sluice.wire.vector import DensePayload, PatchChain, SparsePayload, decode, encode, float_values

MODES = ("dense", "initial", "per-client", "anchor")


class Downlink:
    """Builds the encoded downlink message for a client and tracks who holds what."""

    def __init__(self, d: int, mode: str, anchor_every: int = 10, num_clients: int = 0) -> None:
        if mode not in MODES:
            raise ConfigError(f"compression.downlink must be one of {', '.join(MODES)}, got {mode!r}")
        self.d = d
        self.mode = mode
        self.anchor_every = anchor_every
        self.num_clients = num_clients
        self.stamp = np.zeros(d, dtype=np.int32)
        self.round = 0
        self.anchor_round = 0
        self.synced: dict[int, int] = {}
        self.log: list[tuple[int, SparsePayload]] = []

    def record(self, step: SparsePayload | None) -> None:
        """Note that the server finished a round adding ``step`` (a sparse patch; None: nothing changed)."""
        self.round += 1
        if step is None:
            return
        self.stamp[step.indices] = self.round
        if self.mode in ("per-client", "anchor"):
            self.log.append((self.round, step))
            self._prune()

    def _prune(self) -> None:
        """Forget steps no client can need: those at or before every client's base round."""
        if self.mode == "anchor":
            floor = self.anchor_round
        else:
            floor = min((self.synced.get(t, 0) for t in range(self.num_clients)), default=0)
        while self.log and self.log[0][0] <= floor:
            self.log.pop(0)

    def anchor_broadcast(self, params: np.ndarray) -> bytes | None:
        """In anchor mode, every A rounds: make ``params`` the anchor and return the message every client
        receives (a patch against the previous anchor, or dense if smaller); otherwise None."""
        if self.mode != "anchor" or self.round % self.anchor_every or self.round == self.anchor_round:
            return None
        msg = self._encode(params, self.anchor_round)
        self.anchor_round = self.round
        self._prune()
        return msg

    def _base_round(self, client: int) -> int | None:
        """The round whose model the client can patch, or None when it must get the model dense."""
        if self.mode == "initial":
            return 0
        if self.mode == "per-client":
            return self.synced.get(client, 0)
        if self.mode == "anchor":
            return self.anchor_round
        return None

    def message(self, client: int, params: np.ndarray) -> bytes:
        """The encoded message that brings ``client`` to ``params`` (the current server model)."""
        base = self._base_round(client)
        if self.mode == "per-client":
            self.synced[client] = self.round
        return self._encode(params, base)

    def to_tree(self) -> dict:
        """What the downlink carries between rounds, as a state tree (:mod:`sluice.hfl.state`)."""
        return {"kind": "downlink", "d": self.d, "mode": self.mode, "anchor_every": self.anchor_every,
                "num_clients": self.num_clients, "stamp": self.stamp, "round": self.round,
                "anchor_round": self.anchor_round, "synced": [[c, r] for c, r in self.synced.items()],
                "log": [[r, p.indices, p.values, p.vscale] for r, p in self.log]}

    @classmethod
    def from_tree(cls, tree: dict) -> Downlink:
        """The downlink :meth:`to_tree` described."""
        d, mode, every, n, stamp, rnd, anchor, synced, log = field(
            tree, "downlink", "d", "mode", "anchor_every", "num_clients", "stamp", "round", "anchor_round",
            "synced", "log")
        out = cls(d, mode, every, num_clients=n)
        if stamp.shape != (d,):
            raise WireError(f"downlink state: stamp has shape {stamp.shape}, expected ({d},)")
        out.stamp = stamp.astype(np.int32)
        out.round, out.anchor_round = int(rnd), int(anchor)
        out.synced = {int(c): int(r) for c, r in synced}
        out.log = [(int(r), SparsePayload(d=d, values=v, indices=i, vscale=s)) for r, i, v, s in log]
        return out

    def _encode(self, params: np.ndarray, base: int | None) -> bytes:
        """The changes since round ``base`` as a sparse patch, or the dense model when that is smaller."""
        dense = encode(DensePayload(values=params.astype(np.float32)))
        if base is None:
            return dense
        idx = np.flatnonzero(self.stamp > base)
        options = [dense, encode(SparsePayload(d=self.d, values=params[idx].astype(np.float32), indices=idx))]
        if self.log and self.log[0][0] <= base + 1:  # the log covers rounds base+1 .. now
            parts = [p for r, p in self.log if r > base]
            options.append(encode(PatchChain(tuple(parts))))
        return min(options, key=len)


def apply_message(model: np.ndarray | None, buf: bytes) -> np.ndarray:
    """Client side: the model after applying a downlink message to what it held (θ_0 at first)."""
    payload = decode(buf)
    if isinstance(payload, DensePayload):
        return float_values(payload).copy()
    if isinstance(payload, PatchChain):
        if model is None:
            raise WireError("a patch chain needs the model the client already holds")
        out = model.copy()
        for part in payload.parts:
            out[part.indices] += float_values(part)
        return out
    if not isinstance(payload, SparsePayload) or payload.indices is None:
        raise WireError("a downlink message must be a dense model or a sparse patch with explicit indices")
    if model is None:
        raise WireError("a sparse downlink patch needs the model the client already holds")
    out = model.copy()
    out[payload.indices] = float_values(payload)
    return out
