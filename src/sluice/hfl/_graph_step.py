"""A local training step captured once as a CUDA graph and replayed for every batch of the same shape.

On a GPU, a small model's step (forward, backward, optimizer) is dozens of kernel launches of a few
microseconds of work each, so launching them costs more than running them. :class:`GraphStep` records one
step of the task's model, loss and plain SGD (the default optimizer, which holds no state) on static input
tensors with :class:`torch.cuda.CUDAGraph`; for each batch the samples are gathered into those tensors from
a dataset kept on the device (one kernel per tensor) and the graph is replayed: the kernels of the eager
step, so the same update up to the GPU's floating-point non-determinism. The graph also adds ``loss ·
batch size`` into :attr:`GraphStep.total`.

Capturing runs three warm-up steps on a side stream that change the parameters and buffers: the caller
loads its model after :func:`capture`. A step that cannot be captured (a loss that synchronises with the
CPU, an operation CUDA graphs do not support) makes :func:`capture` return None, with a warning, and the
caller trains eagerly.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

WARMUP_STEPS = 3


class GraphStep:
    """One captured step on static ``(x, y)`` batches shaped like ``inputs`` and ``targets``."""

    def __init__(self, model: nn.Module, loss: Callable, opt: torch.optim.Optimizer, inputs: torch.Tensor,
                 targets: torch.Tensor) -> None:
        device = inputs.device
        self.x, self.y = inputs.clone(), targets.clone()
        self.total = torch.zeros((), dtype=torch.float64, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                opt.zero_grad(set_to_none=True)
                loss(model(self.x), self.y).backward()
                opt.step()
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            out = loss(model(self.x), self.y)
            out.backward()
            opt.step()
            self.total += out.detach().double() * self.x.shape[0]

    def step(self, inputs: torch.Tensor, targets: torch.Tensor, idx: torch.Tensor) -> None:
        """Train on samples ``idx`` (a device tensor of the captured batch size) of ``inputs``/``targets``."""
        torch.index_select(inputs, 0, idx, out=self.x)
        torch.index_select(targets, 0, idx, out=self.y)
        self.graph.replay()


def capture(model: nn.Module, loss: Callable, params: list[nn.Parameter], lr: float, inputs: torch.Tensor,
            targets: torch.Tensor, task_name: str) -> GraphStep | None:
    """A :class:`GraphStep` of plain SGD with ``lr`` on ``params``, or None (with a warning) when the step
    cannot be captured."""
    try:
        return GraphStep(model, loss, torch.optim.SGD(params, lr=lr), inputs, targets)
    except Exception as exc:  # noqa: BLE001 - any failure to capture means: train eagerly
        warnings.warn(f"task {task_name!r}: its training step cannot be captured as a CUDA graph "
                      f"({type(exc).__name__}: {exc}); training without one", RuntimeWarning, stacklevel=2)
        return None
