"""The uplink compressors' and the aggregation's arithmetic on a torch device (a CUDA GPU).

A client that trains on a GPU keeps its update Δ there: :func:`keep_probabilities` and :func:`topk_indices`
find what a :func:`~sluice.compress.stages.sample` or :func:`~sluice.compress.stages.topk` upload keeps, the
keep draws are made there, and an error-feedback residual stays there between rounds; only the ``k`` kept
indices and values come to the CPU, where they are rounded and encoded exactly as on the CPU path. The
server adds each decoded upload into an aggregate on its device (:func:`sluice.compress.estimate.add_estimate`).
The formulas are those of :mod:`sluice.compress.stages` (same selection, same probabilities, same ties to
the lower index); only the keep draws come from a ``torch.Generator`` seeded from the compressor's ``rng``
instead of from ``rng`` itself, so a GPU client's upload is as likely as a CPU client's but not the same
one. Saved states hold numpy arrays (:func:`to_host`). Imported only where a
tensor reaches a compressor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def topk_indices(x: torch.Tensor, k: int) -> torch.Tensor:
    """Sorted int64 indices of the ``k`` largest ``|x_i|``; ties go to the lower index, NaN counts as inf."""
    key = torch.nan_to_num(x.detach().abs().double(), nan=float("inf"))
    n = key.shape[0]
    if k <= 0:
        return torch.empty(0, dtype=torch.int64, device=x.device)
    if k >= n:
        return torch.arange(n, device=x.device)
    t = torch.topk(key, k, sorted=False).values.min()
    above = torch.nonzero(key > t).flatten()
    ties = torch.nonzero(key == t).flatten()[: k - above.shape[0]]
    return torch.sort(torch.cat([above, ties])).values


def keep_probabilities(x: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`sluice.compress.stages.keep_probabilities` on ``x``'s device: ``p_i = min(1, |x_i| / λ)`` with
    ``Σ p_i = k``; non-finite values are kept for sure."""
    a = x.detach().abs().double()
    bad = ~torch.isfinite(a)
    if bool(bad.any()):
        a = torch.where(bad, torch.zeros_like(a), a)
        return torch.where(bad, torch.ones_like(a), keep_probabilities(a, max(0, k - int(bad.sum()))))
    if k <= 0:
        return torch.zeros_like(a)
    if int(torch.count_nonzero(a)) <= k:
        return (a > 0).double()
    s = torch.topk(a, k, sorted=True).values  # the k largest, decreasing
    tail = a.sum() - torch.cat([s.new_zeros(1), torch.cumsum(s[:-1], 0)])  # T_c for c < k
    c = torch.arange(k, device=a.device, dtype=torch.float64)
    capped = int(torch.argmax(((k - c) * s <= tail).to(torch.uint8)))  # the first c that qualifies
    return torch.clamp(a / (tail[capped] / (k - capped)), max=1.0)


def topk(x: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The indices and values of :func:`topk_indices` without the zeros, on the CPU."""
    idx = topk_indices(x, k)
    idx = idx[x[idx] != 0]
    return to_numpy(idx), to_numpy(x[idx])


def sample(x: torch.Tensor, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The indices kept with :func:`keep_probabilities` by draws seeded with ``seed`` and their values
    ``x_i / p_i`` (float64), on the CPU."""
    p = keep_probabilities(x, k)
    u = torch.rand(x.shape[0], generator=torch.Generator(device=x.device).manual_seed(seed), device=x.device,
                   dtype=torch.float64)
    idx = torch.nonzero(u < p).flatten()
    return to_numpy(idx), to_numpy(x[idx].double() / p[idx])


def plus(x: torch.Tensor, residual: Any) -> torch.Tensor:
    """``x + residual`` in float64 on ``x``'s device (the residual a numpy array or a tensor)."""
    return x.double() + torch.as_tensor(residual, device=x.device)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def put(like: torch.Tensor) -> Callable[[np.ndarray], torch.Tensor]:
    """A function moving numpy arrays to ``like``'s device."""
    return lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(like.device)


def to_host(tree: Any) -> Any:
    """``tree`` with every tensor replaced by its numpy copy (tuples and lists walked), for saving."""
    if isinstance(tree, torch.Tensor):
        return to_numpy(tree)
    if isinstance(tree, tuple | list):
        return type(tree)(to_host(v) for v in tree)
    return tree
