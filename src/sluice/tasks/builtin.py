"""Built-in tasks: Sluice's embedded datasets and scenarios as :class:`~sluice.tasks.Task` objects.

* ``digits``, ``breast_cancer``, ``mnist``: the embedded dataset (:mod:`sluice.data.datasets`) with an MLP
  (``hidden`` units); one training set that Sluice partitions.
* ``synthetic``: FedProx's Synthetic(α, β) with an MLP; one dataset per client (the generator's split).
* ``coverage``, ``energy``, ``kpi_anomaly``: a network-analytics scenario with an MLP; one dataset per party
  (standardised), the scenario's held-out rows, its type-specific errors and model type.
* ``mnist_cnn``: the CNN of McMahan et al. 2017 (two 5×5 convolutions of 32 and 64 channels, each followed
  by 2×2 max pooling, a 512-unit layer, 10 outputs: 1,663,370 parameters) on the embedded MNIST images,
  split as in the paper: 2 shards of one label per client, 100 clients.
* ``digits_cnn``: a small CNN (two 3×3 convolutions with BatchNorm) on digits' 8×8 images.
* ``kpi_cnn``: a 1-D convolution over each KPI's last ``window`` residuals of the KPI-anomaly scenario,
  beside the time-of-day features.

Each is a plain function of keyword arguments that returns a task, the same interface as a user's factory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from sluice.data import load_dataset
from sluice.data.config import DataConfig
from sluice.data.federated import FederatedData, load_federated
from sluice.models import mlp
from sluice.tasks.config import TABULAR_NAMES
from sluice.tasks.task import Partition, Task

TABULAR = TABULAR_NAMES
"""Built-in tasks that train an MLP of ``[model] hidden`` on a dataset of ``[data]``."""


def _tensors(X: np.ndarray, y: np.ndarray) -> TensorDataset:
    return TensorDataset(torch.from_numpy(np.ascontiguousarray(X)), torch.from_numpy(np.ascontiguousarray(y)))


def from_federated(fed: FederatedData, model: Callable[[], nn.Module], *, partition: Partition | None = None,
                   train: tuple[np.ndarray, np.ndarray] | None = None) -> Task:
    """A task of arrays: ``fed``'s clients (or the one training set ``train``, partitioned by Sluice), its test
    rows, metric functions, model type and scaling."""
    data = _tensors(*train) if train is not None else [_tensors(X, y) for X, y in fed.clients]
    return Task(model=model, train=data, test=_tensors(fed.X_test, fed.y_test), metrics=dict(fed.metric_fns),
                metric_specs=fed.metric_specs, name=fed.name, partition=partition or Partition(),
                model_type=fed.model_type, target_names=fed.target_names,
                prepare=fed.to_model_space if fed.scaling is not None else None)


def tabular(dataset: str = "digits", *, hidden: list[int] | tuple[int, ...] = (128, 128), seed: int = 0,
            test_fraction: float = 0.2, synthetic_alpha: float = 1.0, synthetic_beta: float = 1.0,
            num_clients: int | None = None, scenario: dict[str, Any] | None = None) -> Task:
    """An MLP with ``hidden`` units on a built-in dataset or scenario (see the module docstring)."""
    cfg = DataConfig(dataset=dataset, num_clients=num_clients, test_fraction=test_fraction,
                     synthetic_alpha=synthetic_alpha, synthetic_beta=synthetic_beta, scenario=scenario or {})
    if cfg.is_scenario or dataset == "synthetic":
        fed = load_federated(cfg, seed)
        train = None
    else:
        ds = load_dataset(dataset, seed=seed, test_fraction=test_fraction)
        fed = FederatedData(name=ds.name, clients=[], X_test=ds.X_test, y_test=ds.y_test,
                            num_features=ds.num_features, num_classes=ds.num_classes)
        train = (ds.X_train, ds.y_train)
    return from_federated(fed, lambda: mlp(fed.num_features, list(hidden), fed.num_classes, seed=seed), train=train)


# --------------------------------------------------------------------------------------------- CNNs
class MnistCNN(nn.Module):
    """McMahan et al. 2017's CNN for 28×28 images: 1,663,370 parameters with 10 classes."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _images(dataset: str, side: int, seed: int, test_fraction: float) -> tuple[TensorDataset, TensorDataset]:
    ds = load_dataset(dataset, seed=seed, test_fraction=test_fraction)

    def img(X: np.ndarray, y: np.ndarray) -> TensorDataset:
        return _tensors(X.reshape(-1, 1, side, side), y)

    return img(ds.X_train, ds.y_train), img(ds.X_test, ds.y_test)


def mnist_cnn(*, seed: int = 0, test_fraction: float = 0.2, num_clients: int = 100) -> Task:
    """McMahan et al.'s CNN on the embedded MNIST images, 2 shards of one label per client."""
    train, test = _images("mnist", 28, seed, test_fraction)
    return Task(model=MnistCNN, train=train, test=test, name="mnist_cnn",
                partition=Partition("shards", num_clients=num_clients, shards_per_client=2))


class DigitsCNN(nn.Module):
    """Two 3×3 convolutions (16 and 32 channels, BatchNorm, ReLU), 2×2 pooling after the second, 10 outputs."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 4 * 4, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def digits_cnn(*, seed: int = 0, test_fraction: float = 0.2) -> Task:
    """A small CNN with BatchNorm on digits' 8×8 images; Sluice partitions the training set."""
    train, test = _images("digits", 8, seed, test_fraction)
    return Task(model=DigitsCNN, train=train, test=test, name="digits_cnn")


class KpiCNN(nn.Module):
    """A 1-D convolution over ``kpis`` series of ``window`` steps, pooled over time, beside ``extra`` features."""

    def __init__(self, kpis: int, window: int, extra: int, classes: int, channels: int = 16) -> None:
        super().__init__()
        self.kpis, self.window = kpis, window
        self.conv = nn.Sequential(nn.Conv1d(kpis, channels, 3, padding=1), nn.ReLU(),
                                  nn.Conv1d(channels, channels, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(2 * channels + extra, 32), nn.ReLU(), nn.Linear(32, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x[:, : self.kpis * self.window].reshape(-1, self.kpis, self.window)
        h = self.conv(seq)
        pooled = torch.cat([h.mean(2), h.amax(2)], 1)
        return self.head(torch.cat([pooled, x[:, self.kpis * self.window:]], 1))


def kpi_cnn(*, seed: int = 0, channels: int = 16, scenario: dict[str, Any] | None = None) -> Task:
    """A sequence model on the KPI-anomaly scenario: one client per cell, its type-specific metrics."""
    from sluice.data.scenarios.kpi_anomaly import KPIS

    fed = load_federated(DataConfig(dataset="kpi_anomaly", scenario=scenario or {}), seed)
    kpis = len(KPIS)
    window = (fed.num_features - 3) // kpis
    task = from_federated(fed, lambda: KpiCNN(kpis, window, fed.num_features - kpis * window, fed.num_classes,
                                              channels))
    task.name = "kpi_cnn"
    return task


BUILTIN: dict[str, Callable[..., Task]] = {"mnist_cnn": mnist_cnn, "digits_cnn": digits_cnn, "kpi_cnn": kpi_cnn}
"""Built-in tasks with their own model, by name (the tabular ones are :func:`tabular`)."""
