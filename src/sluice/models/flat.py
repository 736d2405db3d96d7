"""View a model's parameters as one flat float32 vector ``theta`` of length ``d = num_params(model)``.

The layout is ``theta = concat(p.reshape(-1) for p in model.parameters())``, so ``set_flat(m, get_flat(m))``
leaves ``m`` unchanged and index ``i`` of every vector names the same scalar weight on every party. The
vectors are float32 whatever the parameters' dtype and device: reading an fp16 or bf16 model is exact,
writing rounds to its dtype. The floating-point buffers (BatchNorm's running statistics) have a flat view
of their own (:func:`get_buffers`), and :func:`layers` groups parameters by the submodule that holds them.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def num_params(model: nn.Module) -> int:
    """Return ``d = sum(p.numel() for p in model.parameters())``."""
    return sum(p.numel() for p in model.parameters())


def output_layer(model: nn.Module) -> int:
    """The number of parameters of the last ``nn.Linear`` (weights and bias), which are the last coordinates of
    θ; 0 when the model has no linear layer or its parameters do not come last."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        return 0
    last, params = list(linears[-1].parameters()), list(model.parameters())
    if [id(p) for p in params[len(params) - len(last):]] != [id(p) for p in last]:
        return 0  # not the last coordinates of θ
    return sum(p.numel() for p in last)


def _read(tensors: list[torch.Tensor]) -> np.ndarray:
    parts = [t.detach().reshape(-1).to(device="cpu", dtype=torch.float32) for t in tensors]
    return torch.cat(parts).numpy().copy() if parts else np.zeros(0, dtype=np.float32)


def _write(tensors: list[torch.Tensor], vec: np.ndarray, what: str) -> None:
    arr = np.asarray(vec)
    d = sum(t.numel() for t in tensors)
    if arr.ndim != 1 or arr.shape[0] != d:
        raise ValueError(f"flat {what} vector must have shape ({d},), got {arr.shape}")
    src = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
    offset = 0
    with torch.no_grad():
        for t in tensors:
            t.copy_(src[offset : offset + t.numel()].view_as(t))
            offset += t.numel()


def get_flat(model: nn.Module) -> np.ndarray:
    """Return a float32 copy of all parameters concatenated in ``parameters()`` order, shape ``(d,)``."""
    return _read(list(model.parameters()))


def set_flat(model: nn.Module, vec: np.ndarray) -> None:
    """Overwrite the parameters with ``vec`` (the inverse of :func:`get_flat`), in place.

    Raises ``ValueError`` when ``vec`` is not 1-D or its length is not ``num_params(model)``.
    """
    _write(list(model.parameters()), vec, "parameter")


def _float_buffers(model: nn.Module) -> list[torch.Tensor]:
    return [b for b in model.buffers() if torch.is_floating_point(b)]


def num_buffers(model: nn.Module) -> int:
    """Scalars in the model's floating-point buffers (BatchNorm's running mean and variance...)."""
    return sum(b.numel() for b in _float_buffers(model))


def get_buffers(model: nn.Module) -> np.ndarray:
    """The floating-point buffers concatenated in ``buffers()`` order as one float32 vector (integer buffers,
    such as BatchNorm's batch counter, stay with the module)."""
    return _read(_float_buffers(model))


def set_buffers(model: nn.Module, vec: np.ndarray) -> None:
    """Overwrite the floating-point buffers with ``vec`` (the inverse of :func:`get_buffers`), in place."""
    _write(_float_buffers(model), vec, "buffer")


def layer_modules(model: nn.Module) -> list[nn.Module]:
    """The model's layers: every submodule that holds parameters itself (a convolution, a linear layer, a
    BatchNorm, an embedding, an LSTM...), in registration order."""
    return [m for m in model.modules() if any(True for _ in m.parameters(recurse=False))]


def layers(model: nn.Module) -> list[list[nn.Parameter]]:
    """The parameters of each of :func:`layer_modules`; a parameter shared by two layers (tied weights) is
    listed with the first only, so a layer may list none."""
    seen: set[int] = set()
    out = []
    for module in layer_modules(model):
        own = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for p in own)
        out.append(own)
    return out


def tied_to_frozen(model: nn.Module, trainable: int) -> list[str]:
    """The last ``trainable`` layers (:func:`layer_modules`) that share a parameter with an earlier layer: those
    cannot be trained while the earlier ones stay frozen (named by their class)."""
    mods = layer_modules(model)
    frozen = {id(p) for m in mods[: len(mods) - trainable] for p in m.parameters(recurse=False)}
    return [type(m).__name__ for m in mods[len(mods) - trainable:]
            if any(id(p) in frozen for p in m.parameters(recurse=False))]
