"""Server step of horizontal FL with top-k selection and error feedback (SPEC C2–C3).

Pure functions: ``(ServerState, inputs) -> (ServerState, outputs)``; nothing is hidden in globals.

Notation per round t, over the d model coordinates:

* ``g_t = Σ_c w_c·ĝ_c / Σ_c w_c``: weighted average of the terminals' unbiased update estimates ĝ_c
  (zeros where a terminal sent nothing; rand-k estimates carry the d/k scale).
* momentum (optional, ρ > 0): ``m_t = ρ·m_{t−1} + g_t``; with ρ = 0, ``m_t = g_t``.
* accumulated: ``a_t = m_t + e_{t−1}``. The residual ``e`` is zero at the coordinates applied last round,
  so at those coordinates ``a_t`` is the aggregate alone (the seed's "first gradients") and elsewhere the
  aggregate merged with the residual carried from earlier rounds (its "second gradients").
* applied: ``u_t = topk(a_t)``; the model moves ``θ_{t+1} = θ_t + η·u_t``.
* error feedback: ``e_t = a_t − u_t`` (exactly: Σ_t u_t + e_T = Σ_t m_t).
* momentum factor masking: the momentum is zeroed at the applied coordinates, ``m_t[idx] = 0``, so a
  coordinate's velocity is not applied again on top of the residual that already carries it (as in Deep
  Gradient Compression). With ρ = 0, or when everything is applied, this changes nothing / is skipped.

``ratio = 1`` (``compression.down = "dense"``) applies the whole aggregate: plain FedAvg.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sluice.compress import topk_indices


@dataclass
class ServerState:
    """What the server carries between rounds. ``params`` is float32 (the model terminals hold)."""

    params: np.ndarray
    residual: np.ndarray
    momentum: np.ndarray
    round: int = 0


def init_server(params: np.ndarray) -> ServerState:
    d = params.shape[0]
    return ServerState(
        params=params.astype(np.float32).copy(),
        residual=np.zeros(d, dtype=np.float64),
        momentum=np.zeros(d, dtype=np.float64),
    )


def aggregate(estimates: list[np.ndarray], weights: list[float], d: int) -> np.ndarray:
    """Weighted average of update estimates; zeros when nothing arrived."""
    g = np.zeros(d, dtype=np.float64)
    total = float(sum(weights))
    if total <= 0:
        return g
    for est, w in zip(estimates, weights, strict=True):
        g += (w / total) * est
    return g


def server_step(
    state: ServerState, g: np.ndarray, *, ratio: float, rho: float = 0.0, lr: float = 1.0
) -> tuple[ServerState, np.ndarray]:
    """Apply the top-k of (momentum + residual); return the new state and the applied indices.

    The applied update is rounded to float32 before it is added to ``params``; the rounding error stays
    in the residual, so the invariant ``Σ applied + residual = Σ aggregated`` holds in float64.
    """
    d = g.shape[0]
    momentum = rho * state.momentum + g if rho > 0 else g.astype(np.float64, copy=True)
    acc = momentum + state.residual
    if ratio >= 1.0:
        idx = np.arange(d, dtype=np.int64)
    else:
        idx = topk_indices(acc, max(1, int(round(ratio * d))))
    applied = acc[idx].astype(np.float32)
    residual = acc.copy()
    residual[idx] -= applied.astype(np.float64)
    if rho > 0 and ratio < 1.0:
        momentum[idx] = 0.0
    params = state.params.copy()
    params[idx] += np.float32(lr) * applied
    return ServerState(params=params, residual=residual, momentum=momentum, round=state.round + 1), idx
