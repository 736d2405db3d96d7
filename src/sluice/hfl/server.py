"""Server half of horizontal FL: top-k selection with error feedback (SPEC C2–C3), bytes in, bytes out.

:class:`Server` is what a runtime (the simulator, a networked deployment) talks to: the downlink message
for client c, client c's upload, the close of a round. Its algorithm is made of pure functions,
``(ServerState, inputs) -> (ServerState, outputs)`` (:func:`aggregate`, :func:`server_step`,
:func:`replay_step`); nothing is hidden in globals. Why each part is there, and what it costs and buys on
the benchmark federations, is in ``docs/explanation/compression.md``.

Notation per round t, over the d model coordinates, in a round that aggregates M uploads of N clients:

* ``g_t = Σ_c w_c·ĝ_c / Σ_c w_c``: weighted average of the clients' unbiased update estimates ĝ_c
  (zeros where a client sent nothing; rand-k and sample estimates carry their ``1/p`` scales).
* accumulated: ``a_t = g_t + e_{t−1}``. The residual ``e`` is zero at the coordinates applied last round
  (up to rounding), so there ``a_t`` is the aggregate alone, and elsewhere the aggregate plus what earlier
  rounds left in the residual.
* selected: ``I_t = topk(a_t)`` with ``k = down_ratio·d`` per round or, by default,
  ``k = down_budget·(M/N)·d``. k grows with M: the server passes on a fixed share of what it received, so
  the residual (and the clients' lag behind the aggregate) does not grow with the uploads. k shrinks with N:
  every step reaches every one of the N clients in time (a client gets all the steps since it last synced),
  so the downlink costs about N·k a round where dense FedAvg sends M models, and k ∝ M/N keeps that ratio,
  and with it the reduction, the same at any N and q.
* applied: ``s_t[i] = round(η·G_t·a_t[i] + ρ·v_{t−1}[i])`` on ``I_t`` and 0 elsewhere, rounded to the
  downlink value type (fp32, fp16, int8, or signs with one float32 scale per step); the model moves
  ``θ_{t+1} = θ_t + s_t`` in float32, a step that travels to the clients exactly, so a client that adds the
  same steps in the same order holds the same model bit for bit.
* sparse heavy ball (ρ > 0): the velocity is the applied step less what the gain added to it,
  ``v_t[i] = ρ·v_{t−1}[i] + (s_t[i] − ρ·v_{t−1}[i])/G_t`` on ``I_t`` (the applied step itself at a gain of 1),
  decaying as ``ρ·v`` elsewhere. A coordinate selected round after round moves as under dense momentum
  (``v_t = η·g_t + ρ·v_{t−1}``, FedAvgM); one left out keeps no pending velocity to burst with later. The
  gain sizes each step's gradient part and the velocity carries that part at the configured step: were the
  gained step the velocity, momentum would multiply the gain again, to ``G/(1 − ρ)`` on a coordinate
  selected every round where FedAvgM moves ``1/(1 − ρ)``. Momentum is applied only where the step goes, so
  the step stays sparse, and it never enters the residual. (SPEC C2 puts the momentum on the aggregate
  before the selection, ``g_t = ρ·g_{t−1} + g_t``; under top-k that fills the residual with
  momentum-amplified mass, released in bursts against a model that lags the dense one. Masking the momentum
  at the applied coordinates, as DGC does, stops exactly the coordinates that matter from accelerating.)
* adaptive step (``compression.down_adapt`` = β > 0, top-k only): the gradient part of the step is
  ``η·G_t·a_t``, with a gain ``G_t`` tuned from what the clients answer to the last step. ``A_t`` is the
  share of the n coordinates applied last round where this round's aggregate has the sign of that step
  (coordinates where nothing arrived do not count), and ``G_t = clip(G_{t−1}·exp(β·(A_t − ½)), 1, 10)``
  (:data:`GAIN_BOUNDS`), starting at 1. Aggregates that keep pointing the way the last step went (it fell
  short) raise the gain; aggregates that turn back (it overshot) lower it. This is delta-bar-delta's rule
  (R. A. Jacobs, Neural Networks 1988) and Rprop's (Riedmiller and Braun, ICNN 1993) for one global step,
  which is all a step of one scale can carry; FedExP (Jhunjhunwala, Wang and Joshi, ICLR 2023) makes the
  same case for FedAvg's server step. The gain costs no bytes: it is inside the step's scale. Guards:

  - it never goes below 1, the configured server step (FedExP's ``max(1, ·)``). A turn-back is not only
    overshoot: the top-k picks the stiffest coordinates, which turn back at steps the rest of the model
    needs, and label-sharded clients disagree with the last round's clients at any step;
  - it moves only on evidence: while ``|A_t − ½|`` is within one standard error of a fair coin over the n
    coordinates (``½/√n``), it stays, so that it does not integrate noise;
  - it decides on the answers of at least :data:`GAIN_UPLOADS` uploads and :data:`GAIN_EVIDENCE` heard
    coordinates: a round with fewer adds its counts to the next ones' (``ServerState.evidence``), and A is
    the share over the pooled rounds. The coordinates one upload answers with are one client's answer, not
    independent coin flips. A round of the default federation (5 uploads, 8 to 35 coordinates heard)
    decides on its own.
* error feedback: ``e_t = a_t − (s_t − ρ·v_{t−1})/(η·G_t)`` on ``I_t`` and ``a_t`` elsewhere: the gradient
  part of the step leaves the residual, with its rounding error kept, so
  ``Σ_t (s_t − ρ·v_{t−1})/(η·G_t) + e_T = Σ_t g_t`` and nothing aggregated is ever lost, only delayed.
* replayed momentum (ρ > 0 and ``compression.momentum_replay`` = r > 0, r = 0.4 by default; top-k only;
  :func:`replay_step`): the output layer, the model's last block ``[lo, d)``, leaves the step above and takes
  FedAvgM's heavy ball, replayed by every client. Its accumulated aggregate ``a = e + η·g`` sends its top
  ``r·(M/N)·(d − lo)`` coordinates (10 % of the layer for the default's 5 uploads of 20 clients; signs with
  one scale) as the innovation ``c_t``; error feedback keeps the rest, and server and clients alike move the
  whole block every round: ``v_t = r_t·v_{t−1} + c_t``, ``θ[lo:] += v_t`` (float32, one function on both
  sides, :func:`sluice.wire.vector.replay_block`). A client keeps its velocity and replays the innovations
  of the rounds it missed, a few dozen bytes each with their decays ``r_t`` (:mod:`sluice.hfl.downlink`);
  the share scales with M/N as the step's k does. The sparse heavy ball cannot give the output layer what
  FedAvgM's velocity gives it, a move every round that averages about ten rounds of clients; at a share near
  1 − ρ error feedback returns what it holds within the momentum's time constant. The whole model is not
  replayed: at 0.5 % of d a round a coordinate is stepped about once in 200 rounds, and momentum would
  amplify mass that error feedback held back that long.

  Where FedAvgM itself diverges the replay must not follow it. One factor ``f ∈ (0, 1]``, starting at 1
  (FedAvgM on the output layer), follows the clients' answers: A is the share of the block's coordinates
  where the aggregate has the velocity's sign, and outside the ``½/√n`` dead zone
  ``f ← clip(f·exp(β·(A − ½)), 0, 1)``, with β :data:`REPLAY_FALL` times larger when A < ½. From 1 down to
  1 − ρ, ``f`` scales the innovation (the layer's step for a steady aggregate falls from FedAvgM's
  1/(1 − ρ) to FedAvg's 1); below, the innovation keeps the scale 1 − ρ and the momentum itself fades,
  ``r_t = ρ·f/(1 − ρ)``, down to none. Both halves are needed: scaling the innovation alone leaves the heavy
  ball's ringing (its roots have modulus √ρ ≈ 0.95), fading the momentum alone gives up most of what the
  replay gains. The asymmetry is a trust region's: shrink fast on evidence of overshoot, grow back slowly
  (a symmetric rule lets ``f`` random-walk back to 1 during a growing oscillation).

With ρ = 0 and β = 0 this is top-k with error feedback. ``ratio = 1`` (``compression.down = "dense"``)
applies the whole aggregate with the gain left at 1: plain FedAvg, and with ρ > 0 FedAvgM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from sluice.compress import topk_indices, value_type
from sluice.compress.estimate import add_estimate, decode_estimate, to_dense
from sluice.compress.values import QUANTIZERS, VALUE_TYPES, ValueType
from sluice.errors import ConfigError, DataError, TrainingError, WireError
from sluice.hfl.config import HFLConfig
from sluice.hfl.downlink import Downlink
from sluice.wire import dtypes
from sluice.wire.buffers import split_buffers, with_buffers
from sluice.wire.state import field, pack, unpack
from sluice.wire.vector import SparsePayload, float_values, replay_block

GAIN_BOUNDS = (1.0, 10.0)
"""The adaptive step's gain stays within once and ten times the configured server step."""

GAIN_EVIDENCE = 8
"""The adaptive step's gain decides on at least this many heard coordinates, pooling rounds until then."""

GAIN_UPLOADS = 4
"""The adaptive step's gain decides on the answers of at least this many uploads, pooling rounds until then."""

REPLAY_FALL = 4.0
"""Replayed momentum's ``f`` falls this many times faster than it rises (:func:`replay_step`)."""


@dataclass
class ServerState:
    """What the server carries between rounds. ``params`` is float32 (the model clients hold); ``gain``
    is the adaptive step's gain and ``last_idx``/``last_sign`` the coordinates and signs of the last
    step, which the next aggregate is compared with, and ``evidence`` the (agreeing, heard, uploads) counts of
    those comparisons pooled since the gain last decided (:data:`GAIN_EVIDENCE`, :data:`GAIN_UPLOADS`);
    ``replay_gain`` is the factor f of replayed momentum (:func:`replay_step`)."""

    params: np.ndarray
    residual: np.ndarray
    momentum: np.ndarray
    round: int = 0
    gain: float = 1.0
    last_idx: np.ndarray | None = None
    last_sign: np.ndarray | None = None
    replay_gain: float = 1.0
    evidence: tuple[int, int, int] = (0, 0, 0)


def init_server(params: np.ndarray) -> ServerState:
    d = params.shape[0]
    return ServerState(
        params=params.astype(np.float32).copy(),
        residual=np.zeros(d, dtype=np.float64),
        momentum=np.zeros(d, dtype=np.float64),
    )


def aggregate(estimates: list[Any], weights: list[float], d: int, device: Any = None) -> np.ndarray:
    """Weighted average of update estimates (dense vectors, or decoded uploads whose entries alone are added:
    :func:`~sluice.compress.estimate.add_estimate`); zeros when nothing arrived. With a torch ``device`` the sum
    is made there (a GPU's), then returned as numpy."""
    if device is None:
        g = np.zeros(d, dtype=np.float64)
    else:
        import torch

        g = torch.zeros(d, dtype=torch.float64, device=device)
    total = float(sum(weights))
    if total > 0:
        for est, w in zip(estimates, weights, strict=True):
            add_estimate(g, est, w / total)
    return g if device is None else g.cpu().numpy()


def aggregation_device(spec: str) -> Any:
    """The torch device a server with ``train.device = spec`` aggregates on: None (numpy) for the CPU."""
    if spec == "cpu":
        return None
    from sluice.models.device import resolve_device

    device = resolve_device(spec)
    return None if device.type == "cpu" else device


def _counts(seen: np.ndarray, signs: np.ndarray) -> tuple[int, int]:
    """(agreeing, heard): of the n non-zero entries of ``seen``, how many have the sign of the matching entry of
    ``signs``, and n."""
    heard = seen != 0
    return int(np.sum(np.sign(seen[heard]) == signs[heard])), int(heard.sum())


def _moved(value: float, agreeing: int, heard: int, beta: float, bounds: tuple[float, float],
           fall: float = 1.0) -> float:
    """``value·exp(β·(A − ½))`` clipped to ``bounds``, with ``A = agreeing/heard`` and β multiplied by ``fall``
    when ``A < ½``; ``value`` itself when ``beta`` is 0, nothing was heard or ``|A − ½| ≤ ½/√n`` (no evidence
    beyond a fair coin's standard error)."""
    if beta <= 0 or not heard:
        return value
    agree = agreeing / heard
    if abs(agree - 0.5) <= 0.5 / math.sqrt(heard):
        return value
    rate = beta * (fall if agree < 0.5 else 1.0)
    return float(np.clip(value * math.exp(rate * (agree - 0.5)), *bounds))


def _pooled(state: ServerState, g: np.ndarray, uploads: int) -> tuple[int, int, int]:
    """The gain's evidence: ``state.evidence`` plus the (agreeing, heard) counts of ``g``, the aggregate of
    ``uploads`` uploads, at the last step's coordinates against the step's signs, and ``uploads``."""
    if state.last_idx is None or state.last_sign is None:
        return state.evidence
    agreeing, heard = _counts(g[state.last_idx], state.last_sign)
    a, n, u = state.evidence
    return a + agreeing, n + heard, u + uploads


def _decides(evidence: tuple[int, int, int]) -> bool:
    return evidence[1] >= GAIN_EVIDENCE and evidence[2] >= GAIN_UPLOADS


def _gain(gain: float, evidence: tuple[int, int, int], beta: float) -> float:
    return _moved(gain, evidence[0], evidence[1], beta, GAIN_BOUNDS) if _decides(evidence) else gain


def adapt_gain(state: ServerState, g: np.ndarray, beta: float, uploads: int = GAIN_UPLOADS) -> float:
    """The adaptive step's gain for this round (module docstring): ``G·exp(β·(A − ½))`` clipped to
    :data:`GAIN_BOUNDS`, with ``A`` the share of the last step's coordinates where the aggregate ``g``
    has the step's sign, counting only the n coordinates where ``g`` (the aggregate of ``uploads`` uploads) is
    not 0, pooled with the rounds since the gain last decided (``state.evidence``). The gain is unchanged when
    ``beta`` is 0, while fewer than :data:`GAIN_EVIDENCE` coordinates or :data:`GAIN_UPLOADS` uploads were
    heard, and when ``|A − ½| ≤ ½/√n`` (no evidence beyond a fair coin's standard error)."""
    return _gain(state.gain, _pooled(state, g, uploads), beta)


def _payload(d: int, idx: np.ndarray, want: np.ndarray, values: ValueType) -> SparsePayload:
    """``want`` at ``idx`` as a sparse step of value type ``values``."""
    if values in QUANTIZERS:
        q, vscale = QUANTIZERS[values](want)
        return SparsePayload(d=d, values=q, indices=idx, vscale=vscale)
    if values == "fp16":
        want = np.clip(want, -dtypes.FP16_MAX, dtypes.FP16_MAX)
        return SparsePayload(d=d, values=want.astype(dtypes.FP16.numpy), indices=idx)
    if values == "fp32":
        return SparsePayload(d=d, values=want.astype(dtypes.FP32.numpy), indices=idx)
    raise ConfigError(f"server step values must be one of {', '.join(VALUE_TYPES)}; got {values!r}")


def server_step(
    state: ServerState, g: np.ndarray, *, ratio: float, rho: float = 0.0, lr: float = 1.0,
    values: ValueType = "fp32", adapt: float = 0.0, uploads: int = GAIN_UPLOADS,
) -> tuple[ServerState, np.ndarray, SparsePayload]:
    """Apply the top-k of (aggregate + residual) with the sparse heavy ball and the adaptive step of rate
    ``adapt`` (module docstring); return the new state, the applied indices and the step. ``g`` aggregates
    ``uploads`` uploads.

    ``idx`` is the top-k of ``acc`` less the coordinates with nothing to move (zero accumulated and zero
    velocity, e.g. frozen layers). The step ``s = round(lr·G·acc[idx] + rho·velocity[idx])`` is a sparse
    payload of value type ``values`` (fp16 values are clipped to its range; int8 values and signs carry a
    per-step scale, :func:`sluice.compress.values.quantize_int8`, :func:`sluice.compress.values.quantize_sign`)
    and
    ``params[idx] += float_values(s)`` in float32: a client that adds the same steps in the same order
    holds the same model bit for bit. ``state.momentum`` holds the velocity (the last applied step of each
    coordinate less what the gain added to it, decayed by ``rho`` every round).
    """
    d = g.shape[0]
    evidence = _pooled(state, g, uploads)
    gain = _gain(state.gain, evidence, adapt)
    acc = g.astype(np.float64) + state.residual
    velocity = rho * state.momentum if rho > 0 else np.zeros(d, dtype=np.float64)
    k = max(1, int(round(ratio * d)))
    idx = np.arange(d, dtype=np.int64) if k >= d else topk_indices(acc, k)
    idx = idx[(acc[idx] != 0) | (velocity[idx] != 0)]  # nothing to move there (and a sign cannot say 0)
    carried = velocity[idx]
    step = _payload(d, idx, lr * gain * acc[idx] + carried, values)
    moved = float_values(step)
    gradient_part = moved.astype(np.float64) - carried
    residual = acc
    residual[idx] -= gradient_part / (lr * gain)
    if rho > 0:
        velocity[idx] = carried + gradient_part / gain
    params = state.params.copy()
    params[idx] += moved
    went = np.isfinite(moved) & (moved != 0)
    return ServerState(params=params, residual=residual, momentum=velocity, round=state.round + 1, gain=gain,
                       last_idx=idx[went], last_sign=np.sign(moved[went]).astype(np.int8),
                       evidence=(0, 0, 0) if _decides(evidence) else evidence), idx, step


def replay_step(
    state: ServerState, g: np.ndarray, *, lo: int, share: float, rho: float, lr: float = 1.0,
    values: ValueType = "sign", adapt: float = 0.0,
) -> tuple[ServerState, SparsePayload, float]:
    """Server momentum replayed by the clients on the block ``[lo, d)`` (module docstring, "replayed
    momentum"); the rest of ``state`` is left as it is.

    The block's accumulated aggregate ``a = e + η·g`` sends its top ``share·(d − lo)`` coordinates, times
    ``max(f, 1 − ρ)``, as the innovation ``c`` (value type ``values``, over the block's coordinates), error
    feedback keeps what ``c`` did not carry, and :func:`sluice.wire.vector.replay_block` moves the block:
    ``v ← r·v + c``, ``θ[lo:] += v`` in float32 with the decay ``r = float32(ρ·min(1, f/(1 − ρ)))``, as every
    client replays it. ``f`` follows the clients' answers as the gain does, and falls :data:`REPLAY_FALL` times
    faster than it rises: ``A`` is the share of the block's coordinates where the aggregate has the velocity's
    sign, ``f ← clip(f·exp(β·(A − ½)), 0, 1)``, β times :data:`REPLAY_FALL` when ``A < ½``. Returns the state
    after the round, ``c`` and ``r``."""
    acc = state.residual[lo:] + lr * g[lo:].astype(np.float64)
    v = state.momentum[lo:].astype(np.float32)
    f = _moved(state.replay_gain, *_counts(np.where(v != 0, g[lo:], 0.0), np.sign(v)), adapt, (0.0, 1.0),
               REPLAY_FALL)
    scale, decay = max(f, 1.0 - rho), float(np.float32(rho * min(1.0, f / (1.0 - rho))))
    sel = topk_indices(acc, max(1, int(round(share * acc.shape[0]))))
    sel = sel[acc[sel] != 0]
    innovation = _payload(acc.shape[0], sel, scale * acc[sel], values)
    acc[sel] -= float_values(innovation).astype(np.float64) / scale
    block, v = replay_block(state.params[lo:], v, (innovation,), (decay,))
    params, residual, momentum = state.params.copy(), state.residual.copy(), state.momentum.copy()
    params[lo:], residual[lo:], momentum[lo:] = block, acc, v
    return replace(state, params=params, residual=residual, momentum=momentum, replay_gain=f), innovation, decay


def server_round(
    state: ServerState, g: np.ndarray, *, ratio: float, rho: float = 0.0, lr: float = 1.0,
    values: ValueType = "fp32", adapt: float = 0.0, replay: tuple[int, float] | None = None,
    uploads: int = GAIN_UPLOADS,
) -> tuple[ServerState, SparsePayload, tuple[SparsePayload, float] | None]:
    """One round of the server, on the aggregate ``g`` of ``uploads`` uploads: :func:`server_step`, and with
    ``replay = (lo, share)`` (and ``rho > 0``)
    :func:`replay_step` on the block ``[lo, d)``, which the step then leaves out. Returns the new state, the
    step and the innovation with its decay (None without replay)."""
    if replay is None or rho <= 0:
        new, _, step = server_step(state, g, ratio=ratio, rho=rho, lr=lr, values=values, adapt=adapt,
                                   uploads=uploads)
        return new, step, None
    lo, share = replay
    masked = state.residual.copy(), state.momentum.copy(), g.copy()
    for arr in masked:
        arr[lo:] = 0.0
    new, _, step = server_step(replace(state, residual=masked[0], momentum=masked[1]), masked[2], ratio=ratio,
                               rho=rho, lr=lr, values=values, adapt=adapt, uploads=uploads)
    new.residual[lo:], new.momentum[lo:] = state.residual[lo:], state.momentum[lo:]
    new, innovation, decay = replay_step(replace(new, replay_gain=state.replay_gain), g, lo=lo, share=share, rho=rho,
                                         lr=lr, values=values, adapt=adapt)
    return new, step, (innovation, decay)


def replayed_from(cfg: HFLConfig, d: int, output_layer: int) -> int | None:
    """Where the block ``[lo, d)`` whose momentum the clients replay starts (``lo = d − output_layer``), or None:
    no output layer given, no momentum, ``compression.momentum_replay`` 0 or a dense downlink step (FedAvgM
    moves every coordinate)."""
    c = cfg.compression
    if not 0 < output_layer <= d or c.momentum <= 0 or c.momentum_replay <= 0 or c.down == "dense":
        return None
    return d - output_layer


class UploadInbox:
    """The uploads of the open round, as every server (Sluice's and the peers') takes them: checked client
    ids, one upload per client a round, finite non-negative weights, bytes decoded by the subclass's
    :meth:`_decode_upload`. The subclass sets ``num_clients`` and ``_uploads`` and has a ``round``."""

    num_clients: int
    _uploads: dict[int, tuple[Any, float]]
    round: int
    buffers: np.ndarray | None = None
    _buffer_uploads: dict[int, np.ndarray]

    def _decode_upload(self, upload: bytes) -> np.ndarray:  # pragma: no cover - every server defines it
        raise NotImplementedError

    def _check_client(self, client_id: int) -> int:
        if isinstance(client_id, bool) or not isinstance(client_id, int | np.integer) or not (
                0 <= client_id < self.num_clients):
            raise DataError(f"client id must be an integer in [0, {self.num_clients}), got {client_id!r}")
        return int(client_id)

    def receive(self, client_id: int, upload: bytes, weight: float) -> None:
        """Take ``client_id``'s upload (the encoded update estimate) with its aggregation weight (its
        number of samples). Malformed bytes raise :class:`WireError`; a second upload in one round, a
        negative or non-finite weight, :class:`DataError`."""
        c = self._check_client(client_id)
        if c in self._uploads:
            raise DataError(f"client {c} already uploaded in round {self.round + 1}")
        w = float(weight)
        if not math.isfinite(w) or w < 0:
            raise DataError(f"the weight of client {c}'s upload must be a finite number >= 0, got {weight!r}")
        try:
            upload, buffers = split_buffers(upload, 0 if self.buffers is None else self.buffers.shape[0])
            estimate = self._decode_upload(upload)
        except WireError as exc:
            raise WireError(f"upload of client {c}: {exc}") from None
        self._uploads[c] = (estimate, w)
        if buffers is not None:
            self._buffer_uploads[c] = buffers

    def _average_buffers(self) -> None:
        """The buffers become the weighted average of the round's uploaded ones (FedAvg of the buffers)."""
        ids = [i for i in sorted(self._buffer_uploads) if self._uploads[i][1] > 0]
        if ids:
            w = np.asarray([self._uploads[i][1] for i in ids], dtype=np.float64)
            stacked = np.stack([self._buffer_uploads[i].astype(np.float64) for i in ids])
            self.buffers = (w @ stacked / w.sum()).astype(np.float32)
        self._buffer_uploads = {}

    @property
    def received(self) -> int:
        """Uploads taken in the open round."""
        return len(self._uploads)


class Server(UploadInbox):
    """The server half: holds the server state and speaks bytes with the clients.

    A round is: :meth:`message` for every sampled client (each gets its own downlink message),
    :meth:`receive` for every upload that arrives, then :meth:`close_round`, which aggregates what
    arrived (weighted average, in client-id order, so arrival order does not matter), applies the top-k of
    (aggregate + residual) with error feedback and returns the anchor broadcast when the downlink mode
    sends one this round. A client that received its message but sends nothing (it failed) is simply
    absent from the aggregate. :meth:`state_bytes` / :meth:`from_state_bytes` save and restore everything.
    """

    carries_buffers = True

    def __init__(self, cfg: HFLConfig, params: np.ndarray, num_clients: int, *, output_layer: int = 0,
                 buffers: np.ndarray | None = None) -> None:
        c = cfg.compression
        self.cfg = cfg
        self.device = aggregation_device(cfg.train.device)
        self.num_clients = int(num_clients)
        self.state = init_server(np.asarray(params))
        self.d = self.state.params.shape[0]
        self.replay = replayed_from(cfg, self.d, output_layer)
        self.downlink = Downlink(self.d, c.downlink, c.anchor_every, num_clients=self.num_clients, replay=self.replay)
        self._uploads: dict[int, tuple[Any, float]] = {}
        self.buffers = None if buffers is None or buffers.size == 0 else np.asarray(buffers, dtype=np.float32)
        self._buffer_uploads: dict[int, np.ndarray] = {}

    @property
    def params(self) -> np.ndarray:
        """The current server model θ_t (float32)."""
        return self.state.params

    @property
    def round(self) -> int:
        """Rounds closed so far."""
        return self.state.round

    def message(self, client_id: int) -> bytes:
        """This round's downlink message for ``client_id``: it brings that client to θ_t exactly."""
        msg = self.downlink.message(self._check_client(client_id), self.state.params, self.replayed_velocity())
        return with_buffers(msg, self.buffers)

    def messages(self, client_ids: list[int]) -> list[bytes]:
        """:meth:`message` for each of ``client_ids`` in turn, with each different message encoded once (a
        simulator's round: clients with the same base round get the same bytes)."""
        ids = [self._check_client(c) for c in client_ids]
        return [with_buffers(m, self.buffers) for m in
                self.downlink.messages(ids, self.state.params, self.replayed_velocity())]

    def resync_message(self) -> bytes:
        """The message that brings a client holding anything (or nothing) to θ_t: the dense model, with the
        replayed velocity when momentum is replayed."""
        return with_buffers(self.downlink.full_message(self.state.params, self.replayed_velocity()), self.buffers)

    def replayed_velocity(self) -> np.ndarray | None:
        """The replayed velocity (float32), or None without replay."""
        return None if self.replay is None else self.state.momentum[self.replay:].astype(np.float32)

    def _decode_upload(self, upload: bytes) -> Any:
        return decode_estimate(upload, self.d)

    def close_round(self) -> bytes | None:
        """Aggregate, apply top-k with error feedback, record the step for the downlink; return the anchor
        broadcast every client must receive (anchor mode, every ``anchor_every`` rounds) or None."""
        c = self.cfg.compression
        self._average_buffers()
        if self._uploads:
            ids = sorted(self._uploads)
            g = aggregate([self._uploads[i][0] for i in ids], [self._uploads[i][1] for i in ids], self.d,
                          self.device)
            dense_down = c.down == "dense"
            self.state, step, replayed = server_round(
                self.state, g, ratio=1.0 if dense_down else c.down_share(len(ids), self.num_clients), rho=c.momentum,
                lr=self.cfg.train.server_lr, values=value_type(c.down_values, dense=dense_down, compressed="sign"),
                adapt=0.0 if dense_down else c.adapt,
                replay=None if self.replay is None else (self.replay, c.replay_share(len(ids), self.num_clients)),
                uploads=len(ids))
        else:
            self.state = replace(self.state, round=self.state.round + 1)
            step = replayed = None
        self._uploads.clear()
        self.downlink.record(step, replayed)
        return self.downlink.anchor_broadcast(self.state.params, self.replayed_velocity())

    # -- state as bytes -----------------------------------------------------------------------
    def state_bytes(self) -> bytes:
        """Everything the server carries (model, residual, momentum, round, downlink bookkeeping and the
        uploads of an open round) as bytes (:mod:`sluice.wire.state`)."""
        s = self.state
        return pack({"kind": "server", "num_clients": self.num_clients, "params": s.params,
                     "output_layer": 0 if self.replay is None else self.d - self.replay,
                     "residual": s.residual, "momentum": s.momentum, "round": s.round, "gain": s.gain,
                     "last_idx": s.last_idx, "last_sign": s.last_sign, "evidence": list(s.evidence),
                     "replay_gain": s.replay_gain, "buffers": self.buffers,
                     "downlink": self.downlink.to_tree(),
                     "uploads": [[i, est if isinstance(est, np.ndarray) else to_dense(est, self.d), w]
                                 for i, (est, w) in sorted(self._uploads.items())],
                     "buffer_uploads": [[i, b] for i, b in sorted(self._buffer_uploads.items())]})

    @classmethod
    def from_state_bytes(cls, cfg: HFLConfig, buf: bytes) -> Server:
        """The server :meth:`state_bytes` saved, under configuration ``cfg`` (the one it ran with)."""
        tree = unpack(buf)
        n, params, residual, momentum, rnd, down, uploads = field(
            tree, "server", "num_clients", "params", "residual", "momentum", "round", "downlink", "uploads")
        if down.get("mode") != cfg.compression.downlink:
            raise TrainingError(f"the saved server used downlink {down.get('mode')!r}, the configuration "
                                f"says {cfg.compression.downlink!r}")
        out = cls(cfg, params, n, output_layer=int(tree.get("output_layer", 0)), buffers=tree.get("buffers"))
        if residual.shape != (out.d,) or momentum.shape != (out.d,):
            raise WireError(f"server state: residual/momentum do not have the model's {out.d} coordinates")
        # a state without a gain starts it at 1
        last_idx, last_sign = tree.get("last_idx"), tree.get("last_sign")
        if (last_idx is None) != (last_sign is None) or last_idx is not None and (
                last_idx.shape != last_sign.shape or np.any((last_idx < 0) | (last_idx >= out.d))):
            raise WireError("server state: the last step's coordinates and signs do not fit the model")
        evidence = tree.get("evidence", [0, 0, 0])  # a state without evidence starts with none
        if not (isinstance(evidence, list) and len(evidence) == 3 and all(type(x) is int for x in evidence)
                and 0 <= evidence[0] <= evidence[1] and evidence[2] >= 0):
            raise WireError(f"server state: the gain's evidence must be three counts (agreeing <= heard, uploads): "
                            f"{evidence!r}")
        evidence = (evidence[0], evidence[1], evidence[2])
        out.state = ServerState(params.astype(np.float32), residual, momentum, int(rnd), float(tree.get("gain", 1.0)),
                                last_idx, last_sign, float(tree.get("replay_gain", 1.0)), evidence)
        out.downlink = Downlink.from_tree(down)
        out._uploads = {int(i): (est, float(w)) for i, est, w in uploads}
        out._buffer_uploads = {int(i): b for i, b in tree.get("buffer_uploads", [])}
        return out
