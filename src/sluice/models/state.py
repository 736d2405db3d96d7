"""A module's weights and an optimizer's state as plain trees, for checkpoints (:mod:`sluice.wire.state`).

``module_tree(m)`` maps each ``state_dict`` entry to a numpy copy; ``optimizer_tree(opt)`` holds the
optimizer's per-parameter state (SGD momentum buffers, Adam moments and step counts: every tensor as a
numpy copy) under string keys, and its ``param_groups``. Loading either back gives the same tensors bit
for bit, so training resumed from them takes exactly the steps it would have taken.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from sluice.errors import WireError


def _out(v: Any) -> Any:
    return v.detach().cpu().numpy().copy() if isinstance(v, torch.Tensor) else v


def module_tree(module: nn.Module) -> dict[str, np.ndarray]:
    """Every ``state_dict`` entry of ``module`` as a numpy copy."""
    return {k: _out(v) for k, v in module.state_dict().items()}


def load_module_tree(module: nn.Module, tree: dict[str, Any]) -> None:
    """Load what :func:`module_tree` saved; :class:`WireError` when the names or shapes differ."""
    own = module.state_dict()
    if not isinstance(tree, dict) or set(tree) != set(own):
        got = sorted(tree) if isinstance(tree, dict) else type(tree).__name__
        raise WireError(f"the saved model holds {got}, this model {sorted(own)}")
    for k, v in own.items():
        if not isinstance(tree[k], np.ndarray) or tuple(tree[k].shape) != tuple(v.shape):
            raise WireError(f"saved weight {k} does not have this model's shape {tuple(v.shape)}")
    module.load_state_dict({k: torch.from_numpy(np.array(tree[k], copy=True)) for k in own})


def optimizer_tree(opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's ``state_dict``: per-parameter state by parameter index (as text) with every tensor as
    a numpy copy, and ``param_groups``."""
    sd = opt.state_dict()
    return {"state": {str(i): {k: _out(v) for k, v in s.items()} for i, s in sd["state"].items()},
            "param_groups": sd["param_groups"]}


def load_optimizer_tree(opt: torch.optim.Optimizer, tree: dict[str, Any]) -> None:
    """Load what :func:`optimizer_tree` saved into an optimizer over the same parameters."""
    try:
        state = {int(i): {k: torch.from_numpy(np.array(v, copy=True)) if isinstance(v, np.ndarray) else v
                          for k, v in s.items()} for i, s in tree["state"].items()}
        opt.load_state_dict({"state": state, "param_groups": tree["param_groups"]})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise WireError(f"the saved optimizer state does not fit this optimizer: {exc}") from None
