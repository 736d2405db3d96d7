"""What every party does with its parts: the exactness check (SPEC P5), freezing layers, the optimizer of
the negotiated hyper-parameters, and the leader's loss of one group (:func:`group_loss`; the full-batch
reference uses the same one). The parts themselves come from each party's own task
(:mod:`sluice.tasks.split`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sluice.errors import ConfigError
from sluice.tasks.split import SplitTask


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


def group_loss(task: SplitTask, z: torch.Tensor, y: torch.Tensor, batch: int) -> torch.Tensor:
    """The loss of one group of a batch of ``batch`` rows, weighted so that the groups add up to the batch's
    loss: :func:`head_loss` by default, else the task's mean loss times ``len(y) / batch``."""
    if task.loss is None:
        return head_loss(task.kind, z, y, batch)
    return task.loss(z, y) * (len(y) / batch)


def head_loss(task: str, z: torch.Tensor, y: torch.Tensor, batch: int) -> torch.Tensor:
    """The loss of the rows of ``z`` summed and divided by ``batch`` (the whole batch's size), so that the
    groups of a batch add up to its mean loss: cross-entropy (classification), or the squared error
    averaged over the ``k`` outputs, ``‖z − y‖²/k`` (regression)."""
    if task == "classification":
        return F.cross_entropy(z, y, reduction="sum") / batch
    return F.mse_loss(z, y, reduction="sum") / (batch * z.shape[1])
