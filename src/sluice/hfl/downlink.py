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

With server momentum replayed on the output layer (:func:`sluice.hfl.server.replay_step`) every round moves
that whole block, and the client must also hold the velocity. The log keeps each round's innovation and decay
beside its step, and the message (:class:`sluice.wire.vector.ReplayChain`) brings the coordinates before the block
by the smallest of the three above and the block by the smaller of its innovations of rounds r+1..t, which
the client replays from the block and velocity it holds (in the ``initial`` and ``anchor`` modes: of θ_0 with
no velocity, or of its anchor), and its values with the velocity.

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
from sluice.wire.state import field
from sluice.wire.vector import (
    DensePayload,
    PatchChain,
    Payload,
    ReplayChain,
    SparsePayload,
    decode,
    encode,
    float_values,
    replay_block,
)

MODES = ("dense", "initial", "per-client", "anchor")


class Downlink:
    """Builds the encoded downlink message for a client and tracks who holds what."""

    def __init__(self, d: int, mode: str, anchor_every: int = 10, num_clients: int = 0,
                 replay: int | None = None) -> None:
        if mode not in MODES:
            raise ConfigError(f"compression.downlink must be one of {', '.join(MODES)}, got {mode!r}")
        self.d = d
        self.replay = replay
        self.mode = mode
        self.anchor_every = anchor_every
        self.num_clients = num_clients
        self.stamp = np.zeros(d, dtype=np.int32)
        self.round = 0
        self.anchor_round = 0
        self.synced: dict[int, int] = {}
        self.log: list[tuple[int, SparsePayload, tuple[SparsePayload, float] | None]] = []

    def record(self, step: SparsePayload | None, replayed: tuple[SparsePayload, float] | None = None) -> None:
        """Note that the server finished a round adding ``step`` (a sparse patch; None: nothing changed) and,
        with replay, replaying ``replayed`` = (innovation, decay)."""
        self.round += 1
        if step is None:
            return
        self.stamp[step.indices] = self.round
        if self.mode in ("per-client", "anchor"):
            self.log.append((self.round, step, replayed))
            self._prune()

    def _prune(self) -> None:
        """Forget steps no client can need: those at or before every client's base round."""
        if self.mode == "anchor":
            floor = self.anchor_round
        else:
            floor = min((self.synced.get(t, 0) for t in range(self.num_clients)), default=0)
        while self.log and self.log[0][0] <= floor:
            self.log.pop(0)

    def anchor_broadcast(self, params: np.ndarray, velocity: np.ndarray | None = None) -> bytes | None:
        """In anchor mode, every A rounds: make ``params`` (and, with replay, ``velocity``) the anchor and return
        the message every client receives (a patch against the previous anchor, or dense if smaller); otherwise
        None."""
        if self.mode != "anchor" or self.round % self.anchor_every or self.round == self.anchor_round:
            return None
        msg = self._message(params, velocity, self.anchor_round)
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

    def message(self, client: int, params: np.ndarray, velocity: np.ndarray | None = None) -> bytes:
        """The encoded message that brings ``client`` to ``params`` (the current server model) and, with
        replay, to the server's ``velocity``."""
        base = self._base_round(client)
        if self.mode == "per-client":
            self.synced[client] = self.round
        return self._message(params, velocity, base)

    def messages(self, clients: list[int], params: np.ndarray, velocity: np.ndarray | None = None) -> list[bytes]:
        """:meth:`message` for each of ``clients`` in turn (the same bytes), each different message encoded once:
        clients with the same base round get the same message (it depends only on the base, the server model,
        the velocity and the log, which giving messages leaves alone)."""
        made: dict[int | None, bytes] = {}
        out = []
        for c in clients:
            base = self._base_round(c)
            if self.mode == "per-client":
                self.synced[c] = self.round
            if base not in made:
                made[base] = self._message(params, velocity, base)
            out.append(made[base])
        return out

    def full_message(self, params: np.ndarray, velocity: np.ndarray | None = None) -> bytes:
        """The message that brings any client to ``params`` (and ``velocity``): the dense model, which a
        runtime sends a client whose model it cannot know."""
        return self._message(params, velocity, None)

    def _message(self, params: np.ndarray, velocity: np.ndarray | None, base: int | None) -> bytes:
        if self.replay is not None:
            return self._encode_replay(params, velocity, base)
        return self._encode(params, base)

    def to_tree(self) -> dict:
        """What the downlink carries between rounds, as a state tree (:mod:`sluice.wire.state`)."""
        return {"kind": "downlink", "d": self.d, "mode": self.mode, "anchor_every": self.anchor_every,
                "num_clients": self.num_clients, "stamp": self.stamp, "round": self.round,
                "anchor_round": self.anchor_round, "synced": [[c, r] for c, r in self.synced.items()],
                "replay": self.replay,
                "log": [[r, p.indices, p.values, p.vscale] + ([] if c is None else [c[0].indices, c[0].values,
                                                                                    c[0].vscale, c[1]])
                        for r, p, c in self.log]}

    @classmethod
    def from_tree(cls, tree: dict) -> Downlink:
        """The downlink :meth:`to_tree` described."""
        d, mode, every, n, stamp, rnd, anchor, synced, log = field(
            tree, "downlink", "d", "mode", "anchor_every", "num_clients", "stamp", "round", "anchor_round",
            "synced", "log")
        replay = tree.get("replay")
        out = cls(d, mode, every, num_clients=n, replay=None if replay is None else int(replay))
        if stamp.shape != (d,):
            raise WireError(f"downlink state: stamp has shape {stamp.shape}, expected ({d},)")
        out.stamp = stamp.astype(np.int32)
        out.round, out.anchor_round = int(rnd), int(anchor)
        out.synced = {int(c): int(r) for c, r in synced}
        block = None if out.replay is None else d - out.replay
        out.log = [(int(r), SparsePayload(d=d, values=e[1], indices=e[0], vscale=e[2]), None if len(e) == 3
                    else (SparsePayload(d=block, values=e[4], indices=e[3], vscale=e[5]), float(e[6])))
                   for r, *e in log]
        return out

    def _options(self, params: np.ndarray, base: int | None, n: int) -> list[Payload]:
        """The payloads that bring coordinates ``[0, n)`` from round ``base`` to ``params[:n]``: the dense vector,
        and with a base round the replacement patch and, when the log covers rounds base+1 .. now, the
        patch chain."""
        dense = DensePayload(values=params[:n].astype(np.float32))
        if base is None:
            return [dense]
        idx = np.flatnonzero(self.stamp[:n] > base)
        options: list[Payload] = [dense, SparsePayload(d=n, values=params[idx].astype(np.float32), indices=idx)]
        if self._covers(base):
            options.append(PatchChain(tuple(
                p if p.d == n else SparsePayload(d=n, values=p.values, indices=p.indices, vscale=p.vscale)
                for r, p, _ in self.log if r > base)))
        return options

    def _covers(self, base: int) -> bool:
        """Whether the log holds every step of rounds base+1 .. now (and some step)."""
        return bool(self.log) and self.log[0][0] <= base + 1

    def _encode(self, params: np.ndarray, base: int | None) -> bytes:
        """The changes since round ``base`` as the smallest of :meth:`_options`."""
        return min((encode(p) for p in self._options(params, base, self.d)), key=len)

    def _encode_replay(self, params: np.ndarray, velocity: np.ndarray | None, base: int | None) -> bytes:
        """With replay: the smallest of :meth:`_options` for the coordinates before the block, and for the
        block the innovations since ``base``, or its values and the velocity when that is smaller or the log
        does not cover them (``base`` None)."""
        assert self.replay is not None and velocity is not None
        lo = self.replay
        rest = min(self._options(params, base, lo), key=lambda p: len(encode(p)))
        options = [ReplayChain(self.d, lo, rest, base=(params[lo:], velocity))]
        if base is not None and (self.round == base or self._covers(base)):
            replayed = [c for r, _, c in self.log if r > base]
            options.append(ReplayChain(self.d, lo, rest, tuple(c for c, _ in replayed), tuple(r for _, r in replayed)))
        return min((encode(p) for p in options), key=len)


_last_decoded: tuple[bytes | None, Payload | None] = (None, None)
"""The last message :func:`apply_downlink` decoded and its payload: a simulator hands the clients of a round that
share a base round the same bytes object (:meth:`Downlink.messages`), decoded once. Payloads are never changed."""


def _decoded(buf: bytes) -> Payload:
    """``decode(buf)``, reusing the last payload when ``buf`` is the very object decoded last."""
    global _last_decoded
    last, payload = _last_decoded
    if last is buf and payload is not None:
        return payload
    payload = decode(buf)
    _last_decoded = (buf, payload) if isinstance(buf, bytes) else (None, None)
    return payload


def apply_downlink(model: np.ndarray, velocity: np.ndarray | None, buf: bytes) -> tuple[np.ndarray, np.ndarray | None]:
    """Client side: the (model, replayed velocity) after a downlink message, from the model it held (θ_0 at
    first) and its velocity (None before any replay: zero). Messages without replay leave the velocity."""
    payload = _decoded(buf)
    if not isinstance(payload, ReplayChain):
        return _apply(model, payload), velocity
    lo = payload.lo
    if model.shape != (payload.d,):
        raise WireError(f"a replay chain over {payload.d} coordinates cannot apply to a model of {model.shape[0]}")
    out = np.empty(payload.d, dtype=np.float32)
    out[:lo] = _apply(model[:lo], payload.rest)
    held = velocity if velocity is not None else np.zeros(payload.d - lo, dtype=np.float32)
    out[lo:], v = replay_block(*(payload.base or (model[lo:], held)), payload.innovations, payload.decays)
    return out, v


def apply_message(model: np.ndarray | None, buf: bytes) -> np.ndarray:
    """Client side: the model after applying a downlink message to what it held (θ_0 at first)."""
    return _apply(model, decode(buf))


def _apply(model: np.ndarray | None, payload: Payload) -> np.ndarray:
    if isinstance(payload, ReplayChain):
        raise WireError("a replay chain needs the velocity the client keeps (apply_downlink)")
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
