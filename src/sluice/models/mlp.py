"""Small seeded multilayer perceptrons."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import nn

from sluice.errors import ConfigError


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, *, seed: int = 0) -> nn.Module:
    """Build ``Linear(in_dim, h1) -> ReLU -> ... -> Linear(h_last, out_dim)`` in float32 on the CPU.

    ``hidden=[]`` gives a single linear layer (multinomial logistic regression). Every ``Linear(m, n)``
    is initialised as PyTorch's default, ``W, b ~ U(-1/sqrt(m), 1/sqrt(m))``, but drawn from a local
    ``torch.Generator`` seeded with ``seed``: the global RNG state is neither read nor changed, and the
    same arguments give the same weights. The output is raw logits (no softmax).
    """
    for name, value in (("in_dim", in_dim), ("out_dim", out_dim)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    if any(isinstance(h, bool) or not isinstance(h, numbers.Integral) or h < 1 for h in hidden):
        raise ConfigError(f"hidden layer sizes must be integers >= 1, got {list(hidden)}")
    dims = [int(in_dim), *(int(h) for h in hidden), int(out_dim)]
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    layers: list[nn.Module] = []
    for i, (m, n) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        lin = nn.Linear(m, n, device="meta", dtype=torch.float32).to_empty(device="cpu")
        bound = 1.0 / math.sqrt(m)
        with torch.no_grad():
            lin.weight.uniform_(-bound, bound, generator=gen)
            lin.bias.uniform_(-bound, bound, generator=gen)
        layers.append(lin)
        if i < len(dims) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
