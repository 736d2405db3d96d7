"""The parts of a split model: small MLPs built from a JSON-able spec with seeded initialisation.

A spec is what the leader proposes for each part (SPEC P7), e.g.
``{"in": 20, "hidden": [32], "out": 16, "activation": "relu", "final_activation": true,
"batch_norm": false, "dtype": "float32"}``. Weights are drawn from ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``
with a generator seeded by (task seed, part name), so a part built in any process is identical. The
leader's loss (:func:`head_loss`) is here too: the full-batch reference uses the same one.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from sluice.errors import ConfigError
from sluice.wire import dtypes

_ACT = {"relu": nn.ReLU, "tanh": nn.Tanh}
_MODEL_DTYPES = (dtypes.FP32, dtypes.FP64)


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a spec's ``dtype`` name (``float32`` or ``float64``)."""
    for t in _MODEL_DTYPES:
        if t.long_name == name:
            return t.torch
    raise ConfigError(f"unknown dtype {name!r}; allowed: {', '.join(t.long_name for t in _MODEL_DTYPES)}")


def part_seed(seed: int, part: str) -> int:
    """Seed of one part: a stable function of the task seed and the part's name."""
    return (seed * 1_000_003 + zlib.crc32(part.encode())) % (2**63)


def mlp_spec(
    in_dim: int,
    hidden: list[int],
    out_dim: int,
    activation: str,
    final_activation: bool,
    batch_norm: bool,
    dtype: str,
) -> dict[str, Any]:
    return {
        "in": int(in_dim),
        "hidden": [int(h) for h in hidden],
        "out": int(out_dim),
        "activation": activation,
        "final_activation": bool(final_activation),
        "batch_norm": bool(batch_norm),
        "dtype": dtype,
    }


def num_params(spec: dict[str, Any]) -> int:
    """Parameter count of the MLP a spec describes (checked by followers before accepting)."""
    dims = [spec["in"], *spec["hidden"], spec["out"]]
    n = sum(a * b + b for a, b in zip(dims[:-1], dims[1:], strict=True))
    if spec.get("batch_norm"):
        n += 2 * sum(spec["hidden"])
    return n


def build_mlp(spec: dict[str, Any], seed: int) -> nn.Sequential:
    """Linear -> [BatchNorm] -> activation per hidden layer, then Linear [-> activation]."""
    try:
        act = _ACT[spec["activation"]]
        dtype = torch_dtype(spec["dtype"])
        dims = [int(spec["in"]), *[int(h) for h in spec["hidden"]], int(spec["out"])]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"invalid model spec {spec!r}: {exc!r}") from exc
    if any(d <= 0 for d in dims):
        raise ConfigError(f"model layer widths must be positive, got {dims}")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        last = i == len(dims) - 2
        if not last:
            if spec.get("batch_norm"):
                layers.append(nn.BatchNorm1d(b))
            layers.append(act())
        elif spec.get("final_activation"):
            layers.append(act())
    model = nn.Sequential(*layers).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                bound = 1.0 / m.in_features**0.5
                m.weight.uniform_(-bound, bound, generator=gen)
                m.bias.uniform_(-bound, bound, generator=gen)
    return model


def batch_coupled_layers(module: nn.Module) -> list[str]:
    """Names of sub-modules whose output for one sample depends on the other samples of the batch."""
    coupled = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)
    return [name or type(m).__name__ for name, m in module.named_modules() if isinstance(m, coupled)]


def check_exact(module: nn.Module, part: str, groups: int, allow: bool) -> None:
    """Refuse batch-coupled layers when a batch is cut into groups (SPEC P5), unless ``allow``."""
    coupled = batch_coupled_layers(module)
    if coupled and groups > 1 and not allow:
        raise ConfigError(
            f"{part} has batch-coupled layers ({', '.join(coupled)}): with G={groups} groups their "
            f"statistics are per group, so the update would differ from the full-batch update. Use "
            f"pipeline.groups = 1, remove BatchNorm, or set model.allow_batch_coupled = true"
        )


def linear_layers(module: nn.Module) -> list[nn.Linear]:
    """The linear layers of a part, input first."""
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def train_last_layers(module: nn.Module, layers: int) -> None:
    """Freeze every linear layer of ``module`` but the last ``layers`` (their weights then get no gradient,
    so the optimizer leaves them as they are; gradients still flow through them to earlier parts)."""
    lin = linear_layers(module)
    if not 1 <= layers <= len(lin):
        raise ConfigError(f"layers to train must be in 1..{len(lin)} (the part has {len(lin)} linear layers), "
                          f"got {layers}")
    for i, m in enumerate(lin):
        m.requires_grad_(i >= len(lin) - layers)


def import_optimizer_modules() -> None:
    """Import what torch's optimizers import when the first one is built (``torch._dynamo``, about 1 s of
    CPU). A party does it before it is connected to its peers: on a busy machine that second takes many times
    longer, and a peer waiting for the proposal or its answer meanwhile counts it against its stall timeout
    (``transport.timeout_s``)."""
    import torch._dynamo  # noqa: F401


def make_optimizer(params: list[nn.Parameter], hp: dict[str, Any]) -> torch.optim.Optimizer:
    """SGD (with momentum, weight decay) or Adam, from the negotiated hyper-parameters."""
    if not params:
        return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=hp["lr"])
    if hp["optimizer"] == "adam":
        return torch.optim.Adam(params, lr=hp["lr"], weight_decay=hp["weight_decay"])
    if hp["optimizer"] == "sgd":
        return torch.optim.SGD(params, lr=hp["lr"], momentum=hp["momentum"], weight_decay=hp["weight_decay"])
    raise ConfigError(f"unknown optimizer {hp['optimizer']!r}; allowed: sgd, adam")


def targets(y: np.ndarray, task: str, dtype: torch.dtype) -> torch.Tensor:
    """Labels as :func:`head_loss` takes them: int64 class ids, or regression targets in the model's dtype."""
    t = torch.from_numpy(np.ascontiguousarray(y))
    return t if task == "classification" else t.to(dtype)


def head_loss(task: str, z: torch.Tensor, y: torch.Tensor, batch: int) -> torch.Tensor:
    """The loss of the rows of ``z`` summed and divided by ``batch`` (the whole batch's size), so that the
    groups of a batch add up to its mean loss: cross-entropy (classification), or the squared error
    averaged over the ``k`` outputs, ``‖z − y‖²/k`` (regression)."""
    if task == "classification":
        return F.cross_entropy(z, y, reduction="sum") / batch
    return F.mse_loss(z, y, reduction="sum") / (batch * z.shape[1])
