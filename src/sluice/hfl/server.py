"""Server step of horizontal FL with top-k selection and error feedback (SPEC C2–C3).

Pure functions: ``(ServerState, inputs) -> (ServerState, outputs)``; nothing is hidden in globals.

Notation per round t, over the d model coordinates:

* ``g_t = Σ_c w_c·ĝ_c / Σ_c w_c``: weighted average of the terminals' unbiased update estimates ĝ_c
  (zeros where a terminal sent nothing; rand-k estimates carry the d/k scale).
* momentum (optional, ρ > 0): ``m_t = ρ·m_{t−1} + g_t``; with ρ = 0, ``m_t = g_t``.
* accumulated: ``a_t = m_t + e_{t−1}``. The residual ``e`` is zero at the coordinates applied last round,
  so at those coordinates ``a_t`` is the aggregate alone (the seed's "first gradients") and elsewhere the
  aggregate merged with the residual carried from earlier rounds (its "second gradients").
* applied: ``u_t = topk(a_t)``, rounded to the downlink value type (fp16 or fp32) after scaling by the
  server learning rate η: the model moves ``θ_{t+1} = θ_t + s_t`` with ``s_t = round(η·u_t)``, a step that
  travels to terminals exactly.
* error feedback: ``e_t = a_t − s_t/η`` (so Σ_t s_t/η + e_T = Σ_t m_t; the rounding error stays in e).
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


_FP16_MAX = float(np.finfo(np.float16).max)


def server_step(
    state: ServerState, g: np.ndarray, *, ratio: float, rho: float = 0.0, lr: float = 1.0,
    value_dtype: type = np.float32,
) -> tuple[ServerState, np.ndarray, np.ndarray]:
    """Apply the top-k of (momentum + residual); return the new state, the applied indices and the step.

    The step ``s = round(lr·acc[idx])`` is in ``value_dtype`` (fp16 values are clipped to its range) and
    ``params[idx] += s`` in float32: a terminal that adds the same steps in the same order holds the same
    model bit for bit. The rounding error stays in the residual: ``Σ s/lr + residual = Σ aggregated``.
    """
    d = g.shape[0]
    momentum = rho * state.momentum + g if rho > 0 else g.astype(np.float64, copy=True)
    acc = momentum + state.residual
    if ratio >= 1.0:
        idx = np.arange(d, dtype=np.int64)
    else:
        idx = topk_indices(acc, max(1, int(round(ratio * d))))
    scaled = lr * acc[idx]
    if value_dtype == np.float16:
        scaled = np.clip(scaled, -_FP16_MAX, _FP16_MAX)
    step = scaled.astype(value_dtype)
    residual = acc.copy()
    residual[idx] -= step.astype(np.float64) / lr
    if rho > 0 and ratio < 1.0:
        momentum[idx] = 0.0
    params = state.params.copy()
    params[idx] += step.astype(np.float32)
    return ServerState(params=params, residual=residual, momentum=momentum, round=state.round + 1), idx, step
