"""Local training of a task on one party's device, from and to flat vectors (SPEC C1).

A :class:`Learner` is built once per simulator or node from the task: the scratch module (on the device),
the initial model θ_0 and buffers, the loss, the optimizer factory and the model's layers. :meth:`fit`
trains from a flat model ``θ`` (and buffers) on a dataset and returns ``Δ = θ_local − θ`` as float64, the
mean training loss and the buffers after training; batches are shuffled with a ``torch.Generator`` seeded
by the caller, so the same seed gives the same update on every runtime. ``trainable = l`` trains only the
last ``l`` layers (:func:`sluice.models.layers`): the others get no gradient and their coordinates of Δ
are exactly zero; their buffers still follow the batches, as a BatchNorm in training mode does.

On a GPU, with the default optimizer and a tensor dataset (kept on the device by :meth:`Learner.check`), every
full batch is one replay of a step captured as a CUDA graph (:mod:`sluice.hfl._graph_step`); a last, smaller
batch runs eagerly. Δ can stay on the device (``on_device``) for the compressors
(:mod:`sluice.compress.device`).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from sluice.errors import ConfigError
from sluice.hfl._graph_step import GraphStep, capture
from sluice.models import get_buffers, get_flat, layers, num_buffers, output_layer, set_buffers, set_flat
from sluice.models.device import resolve_device
from sluice.models.flat import tied_to_frozen
from sluice.tasks.task import (
    Task,
    batch,
    batch_statistics,
    build_model,
    check_task,
    predict,
    task_metrics,
    to_device,
)


class Learner:
    """The task's model on ``device`` and how a party trains it (see the module docstring)."""

    def __init__(self, task: Task, seed: int, device: str = "cpu") -> None:
        self.task = task
        self.device = resolve_device(device)
        self.model = build_model(task, seed).to(self.device)
        self.batch_statistics = batch_statistics(self.model)
        self.theta0 = get_flat(self.model)
        self.buffers0 = get_buffers(self.model)
        self.num_buffers = num_buffers(self.model)
        self.loss = task.loss_fn()
        self.layers = layers(self.model)
        self.cuda_graphs = True
        self._graphs: dict[tuple, GraphStep | None] = {}

    @property
    def d(self) -> int:
        return int(self.theta0.shape[0])

    @property
    def output_layer(self) -> int:
        return output_layer(self.model)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def check(self, clients: list[Dataset]) -> list[Dataset]:
        """The clients' datasets checked against the task (:func:`sluice.tasks.task.check_task`) and, when they
        are tensors, moved to the device."""
        check_task(self.task, self.model, clients)
        return [to_device(ds, self.device) for ds in clients]

    def check_layers(self, trainable: int | None) -> int | None:
        """``trainable`` checked: None (all layers) or an integer in ``1..num_layers``."""
        if trainable is None:
            return None
        n = self.num_layers
        if isinstance(trainable, bool) or not isinstance(trainable, numbers.Integral) or not 1 <= trainable <= n:
            raise ConfigError(f"layers to train must be in 1..{n} (the layers of task {self.task.name!r} that hold "
                              f"parameters), got {trainable!r}")
        tied = tied_to_frozen(self.model, trainable)
        if tied:
            raise ConfigError(f"task {self.task.name!r}: the last {trainable} layers share parameters with earlier "
                              f"layers ({', '.join(tied)}: tied weights), so they cannot be trained alone; train "
                              f"more layers or all")
        return int(trainable)

    def _trainable_params(self, trainable: int | None) -> list[torch.nn.Parameter]:
        keep = len(self.layers) if trainable is None else trainable
        out = []
        for i, group in enumerate(self.layers):
            for p in group:
                p.requires_grad_(i >= len(self.layers) - keep)
                if p.requires_grad:
                    out.append(p)
        return out

    def load(self, params: np.ndarray, buffers: np.ndarray | None) -> None:
        """Put the flat model (and buffers, when the model has any) into the scratch module."""
        set_flat(self.model, params)
        if self.num_buffers:
            set_buffers(self.model, self.buffers0 if buffers is None else buffers)

    def fit(self, params: np.ndarray, buffers: np.ndarray | None, data: Dataset, *, epochs: int, batch_size: int,
            lr: float, seed: int, trainable: int | None = None,
            on_device: bool = False) -> tuple[Any, float, np.ndarray | None]:
        """Train from ``params`` (and ``buffers``) on ``data``; return ``(Δ, mean loss, buffers after)``, Δ a
        float64 numpy vector, or with ``on_device`` a float64 tensor left on the device."""
        train = self._trainable_params(trainable)
        n = len(data)
        graph = self._graph(train, lr, data, batch_size) if n >= batch_size else None
        self.load(params, buffers)
        start = self._flat()
        model = self.model
        model.train()
        gen = torch.Generator().manual_seed(seed)
        opt = self.task.make_optimizer(train, lr, fused=self.device.type == "cuda")
        order = torch.cat([torch.randperm(n, generator=gen) for _ in range(epochs)])
        if isinstance(data, TensorDataset):  # the whole order in one copy, not one per batch
            order = order.to(data.tensors[0].device)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        skipped = 0
        if graph is not None:
            graph.total.zero_()
        for e in range(epochs):
            for s in range(0, n, batch_size):
                idx = order[e * n + s : e * n + min(s + batch_size, n)]
                if idx.shape[0] == 1 and self.batch_statistics:  # BatchNorm cannot take one sample
                    skipped += 1
                    continue
                if graph is not None and idx.shape[0] == batch_size:
                    graph.step(*data.tensors, idx)
                    continue
                x, y = batch(data, idx)
                x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                opt.zero_grad(set_to_none=True)
                loss = self.loss(model(x), y)
                loss.backward()
                opt.step()
                total += loss.detach().double() * len(y)
        if graph is not None:
            total += graph.total
        delta = self._flat() - start
        mean = float(total) / max(epochs * n - skipped, 1)
        return (delta if on_device else delta.cpu().numpy()), mean, get_buffers(model) if self.num_buffers else None

    def _flat(self) -> torch.Tensor:
        """θ of the scratch module as float64 on its device (what :func:`get_flat` reads, widened)."""
        return torch.cat([p.detach().reshape(-1).double() for p in self.model.parameters()])

    def _graph(self, train: list[torch.nn.Parameter], lr: float, data: Dataset, batch_size: int) -> GraphStep | None:
        """The captured step (:mod:`sluice.hfl._graph_step`) for these settings, when the learner uses CUDA graphs
        (on a GPU, the default optimizer, a tensor dataset on the device); None otherwise."""
        if not (self.cuda_graphs and self.device.type == "cuda" and self.task.optimizer is None
                and isinstance(data, TensorDataset) and data.tensors[0].device == self.device):
            return None
        x, y = data.tensors
        key = (tuple(id(p) for p in train), float(lr), batch_size, x.shape[1:], x.dtype, y.shape[1:], y.dtype)
        if key not in self._graphs:
            idx = torch.arange(batch_size, device=self.device)
            self._graphs[key] = capture(self.model.train(), self.loss, train, lr, x[idx], y[idx], self.task.name)
        return self._graphs[key]

    def evaluate(self, params: np.ndarray, buffers: np.ndarray | None, test: Dataset) -> dict[str, float]:
        """Test metrics of the flat model on ``test`` (:func:`sluice.tasks.task.task_metrics`)."""
        self.load(params, buffers)
        outputs, targets = predict(self.model, test, self.device)
        return task_metrics(self.task, outputs, targets)
