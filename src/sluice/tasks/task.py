"""A task: what the parties train — the user's model, data, loss, optimizer and metrics.

A :class:`Task` is plain PyTorch: a factory that returns any ``torch.nn.Module``, training data as
``torch.utils.data.Dataset`` objects whose items are ``(input, target)`` pairs (one dataset per client, or one
dataset that Sluice partitions with :class:`Partition`), and a test dataset. Targets that are integers are
class ids (default loss: cross-entropy over the model's outputs, one per class); float targets are
regressed (default loss: mean squared error, the targets reshaped to the outputs). Every engine trains a
task and nothing else: Sluice's own datasets and scenarios are built-in tasks (:mod:`sluice.tasks.builtin`).

The helpers below are how engines read a task: :func:`batch` gathers the samples of an index tensor
(a ``TensorDataset`` by indexing its tensors, any other dataset by collating its items), :func:`predict`
runs a model over a dataset in chunks, :func:`task_metrics` scores the outputs, and :func:`check_task`
refuses a task whose parts do not fit together before anything trains.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.utils.data import ConcatDataset, Dataset, Subset, TensorDataset, default_collate

from sluice.errors import TaskError
from sluice.metrics import (
    CLASSIFICATION,
    KNOWN,
    REGRESSION,
    MetricSpec,
    classification_metrics,
    declare,
    regression_metrics,
)

MetricFn = Callable[[np.ndarray, np.ndarray], float]
"""``f(outputs, targets) -> float`` on the test set: logits ``(n, classes)`` and class ids, or predictions
reshaped to the targets and the targets."""
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter], float], torch.optim.Optimizer]

_SEEDED = threading.RLock()
"""Held while a factory draws from torch's seeded generator (:func:`seeded_module`)."""

EVAL_CHUNK = 4096
"""Test samples per forward pass in :func:`predict`."""


@dataclass(frozen=True)
class Partition:
    """How Sluice splits a task's one training dataset among clients (:func:`sluice.data.partition`):
    ``iid``, ``dirichlet`` label skew with concentration ``alpha``, or ``shards`` of one label,
    ``shards_per_client`` each. The ``[data]`` section's values, where given, take precedence."""

    method: Literal["iid", "dirichlet", "shards"] = "dirichlet"
    num_clients: int = 20
    alpha: float = 0.3
    shards_per_client: int = 2


@dataclass
class Task:
    """What the parties train.

    * ``model``: a factory ``() -> nn.Module``; Sluice seeds torch's random generator from the job's seed
      before calling it, so the same job starts from the same weights on every party.
    * ``train``: one ``Dataset`` per client, or one ``Dataset`` that Sluice partitions (``partition``).
    * ``test``: the ``Dataset`` the model is scored on after every iteration.
    * ``loss``: ``(outputs, targets) -> scalar tensor``; default cross-entropy for class ids, MSE for floats.
    * ``optimizer``: ``(parameters, lr) -> torch.optim.Optimizer``; default SGD with the job's ``train.lr``.
    * ``metrics``: extra test metrics by name, ``f(outputs, targets) -> float``; a name Sluice does not know
      needs its :class:`~sluice.metrics.MetricSpec` in ``metric_specs`` (direction and range).
    * ``name``, ``model_type`` (a 3GPP ``MDAType``, optional), ``target_names`` (regression outputs), and
      ``prepare``: maps samples added while training, given in natural units, to the model's input space.
    """

    model: Callable[[], nn.Module]
    train: Dataset | Sequence[Dataset]
    test: Dataset
    loss: LossFn | None = None
    optimizer: OptimizerFactory | None = None
    metrics: Mapping[str, MetricFn] = field(default_factory=dict)
    metric_specs: Sequence[MetricSpec] = ()
    name: str = "task"
    partition: Partition = field(default_factory=Partition)
    model_type: str | None = None
    target_names: tuple[str, ...] = ()
    prepare: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None

    @property
    def per_client(self) -> bool:
        """Whether ``train`` already holds one dataset per client."""
        return isinstance(self.train, list | tuple)

    @property
    def kind(self) -> Literal["classification", "regression"]:
        """Classification when the test targets are integers, else regression."""
        return "regression" if torch.is_floating_point(_as_tensor(_item(self.test, 0)[1])) else "classification"

    def specs(self) -> tuple[MetricSpec, ...]:
        """The spec of each extra metric: ``metric_specs``, else Sluice's own (:data:`~sluice.metrics.KNOWN`)."""
        own = {s.name: s for s in self.metric_specs}
        missing = sorted(n for n in self.metrics if n not in own and n not in KNOWN)
        if missing:
            raise TaskError(f"task {self.name!r}: metrics {missing} need a MetricSpec in metric_specs "
                            "(whether higher is better, and the range)")
        return tuple(own.get(n) or KNOWN[n] for n in self.metrics)

    def declared_metrics(self, extra: Sequence[MetricSpec] = ()) -> dict[str, MetricSpec]:
        """What an engine training this task reports: ``train_loss``, the test metrics of its kind, its own
        metrics and ``extra``."""
        base = CLASSIFICATION if self.kind == "classification" else REGRESSION
        return declare(("train_loss", *base), [*self.specs(), *extra])

    def loss_fn(self) -> LossFn:
        """``loss``, or the default of the task's kind."""
        if self.loss is not None:
            return self.loss
        if self.kind == "classification":
            return nn.functional.cross_entropy
        return lambda out, y: nn.functional.mse_loss(out, y.reshape(out.shape))

    def make_optimizer(self, params: Iterable[nn.Parameter], lr: float, *,
                       fused: bool = False) -> torch.optim.Optimizer:
        """``optimizer(params, lr)``, or plain SGD with learning rate ``lr`` (its fused kernel with ``fused``:
        one launch per step on a GPU)."""
        if self.optimizer is None:
            return torch.optim.SGD(params, lr=lr, fused=True) if fused else torch.optim.SGD(params, lr=lr)
        opt = self.optimizer(params, lr)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TaskError(f"task {self.name!r}: optimizer returned {type(opt).__name__}, not a torch.optim."
                            "Optimizer")
        return opt


# ------------------------------------------------------------------------------------------ datasets
def _as_tensor(v: Any) -> torch.Tensor:
    return v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))


def _item(ds: Dataset, i: int) -> tuple[Any, Any]:
    item = ds[i]
    if not isinstance(item, tuple | list) or len(item) != 2:
        raise TaskError(f"a dataset item must be an (input, target) pair, got {type(item).__name__}")
    return item[0], item[1]


def batch(ds: Dataset, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples ``idx`` of ``ds`` as ``(inputs, targets)`` tensors."""
    if isinstance(ds, TensorDataset):
        x, y = ds.tensors
        return x[idx.to(x.device)], y[idx.to(y.device)]
    x, y = default_collate([_item(ds, int(i)) for i in idx.tolist()])
    return _as_tensor(x), _as_tensor(y)


def targets_of(ds: Dataset) -> np.ndarray:
    """Every target of ``ds``, in order (without loading inputs where the dataset allows)."""
    if isinstance(ds, TensorDataset):
        return ds.tensors[1].cpu().numpy()
    if isinstance(ds, Subset):
        return targets_of(ds.dataset)[np.asarray(ds.indices, dtype=np.int64)]
    if isinstance(ds, ConcatDataset):
        return np.concatenate([targets_of(d) for d in ds.datasets])
    if hasattr(ds, "targets"):
        return np.asarray(ds.targets)
    return np.stack([_as_tensor(_item(ds, i)[1]).numpy() for i in range(len(ds))])


def take(ds: Dataset, idx: np.ndarray | range) -> Dataset:
    """The samples ``idx`` of ``ds`` as a dataset (a ``TensorDataset`` stays one)."""
    idx = np.asarray(idx, dtype=np.int64)
    if isinstance(ds, TensorDataset):
        t = torch.from_numpy(idx)
        return TensorDataset(*(x[t.to(x.device)] for x in ds.tensors))
    return Subset(ds, idx.tolist())


def extend(ds: Dataset, X: np.ndarray, y: np.ndarray) -> Dataset:
    """``ds`` followed by the samples ``(X, y)``."""
    if isinstance(ds, TensorDataset):
        x0, y0 = ds.tensors
        return TensorDataset(torch.cat([x0, torch.from_numpy(X).to(x0.device, x0.dtype)]),
                             torch.cat([y0, torch.from_numpy(y).to(y0.device, y0.dtype)]))
    return ConcatDataset([ds, TensorDataset(torch.from_numpy(X), torch.from_numpy(y))])


def concat(datasets: Sequence[Dataset]) -> Dataset:
    """The datasets one after the other (``TensorDataset`` objects stay one ``TensorDataset``)."""
    if len(datasets) == 1:
        return datasets[0]
    if all(isinstance(d, TensorDataset) for d in datasets):
        return TensorDataset(*(torch.cat(parts) for parts in zip(*(d.tensors for d in datasets), strict=True)))
    return ConcatDataset(list(datasets))


def to_device(ds: Dataset, device: torch.device) -> Dataset:
    """A ``TensorDataset`` moved to ``device`` (so that batches need no copy); other datasets as they are."""
    if isinstance(ds, TensorDataset) and ds.tensors[0].device != device:
        return TensorDataset(*(t.to(device) for t in ds.tensors))
    return ds


def sample_shape(ds: Dataset) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape of one input of ``ds`` and its targets' dtype."""
    x, y = batch(ds, torch.zeros(1, dtype=torch.int64))
    return tuple(x.shape[1:]), y.dtype


# ------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def predict(model: nn.Module, ds: Dataset, device: torch.device | None = None) -> tuple[torch.Tensor, np.ndarray]:
    """The model's outputs (float32, on the CPU) on every sample of ``ds``, and the targets."""
    device = device or torch.device("cpu")
    model.eval()
    outs, ys = [], []
    for start in range(0, len(ds), EVAL_CHUNK):
        x, y = batch(ds, torch.arange(start, min(len(ds), start + EVAL_CHUNK)))
        outs.append(model(x.to(device)).float().cpu())
        ys.append(y.cpu().numpy())
    return (outs[0] if len(outs) == 1 else torch.cat(outs)), (ys[0] if len(ys) == 1 else np.concatenate(ys))


def task_metrics(task: Task, outputs: torch.Tensor, targets: np.ndarray) -> dict[str, float]:
    """Test metrics of ``outputs``: classification (cross-entropy, accuracy, macro P/R/F1) for class ids,
    regression (MSE, MAE, RMSE) for float targets, then each of the task's metric functions."""
    if task.kind == "classification":
        metrics = classification_metrics(outputs, targets, int(outputs.shape[1]))
        pred = outputs.numpy()
    else:
        pred = outputs.numpy().reshape(targets.shape)
        metrics = regression_metrics(pred, targets)
    for name, fn in task.metrics.items():
        metrics[name] = float(fn(pred, targets))
    return metrics


# ------------------------------------------------------------------------------------------ checks
def build_model(task: Task, seed: int) -> nn.Module:
    """``task.model()`` with torch's generator seeded from ``seed`` (restored afterwards); :class:`TaskError`
    when the factory fails or returns something else than a module with parameters."""
    return seeded_module(task.model, seed, task.name, "model")


def seeded_module(factory: Callable[[], nn.Module], seed: int, task: str, what: str) -> nn.Module:
    """``factory()`` with torch's generator seeded from ``seed`` (restored afterwards); :class:`TaskError` naming
    ``task`` and ``what`` when the factory fails or returns something else than a module with parameters. One
    factory at a time in a process: torch's generator is one for every thread (split parties in threads)."""
    with _SEEDED, torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        try:
            model = factory()
        except Exception as exc:  # the user's factory: any failure is the task's
            raise TaskError(f"task {task!r}: the {what} factory failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise TaskError(f"task {task!r}: the {what} factory returned {type(model).__name__}, not a "
                        "torch.nn.Module")
    if not any(p.requires_grad for p in model.parameters()):
        raise TaskError(f"task {task!r}: the {what} has no trainable parameters")
    return model


def batch_statistics(model: nn.Module) -> bool:
    """Whether ``model`` normalises with the statistics of each batch in training (BatchNorm): a batch of one
    sample has none, so the default training loops leave such a batch out (the last one of an epoch)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def check_task(task: Task, model: nn.Module, clients: Sequence[Dataset]) -> None:
    """:class:`TaskError` naming the task and what does not fit: an empty dataset, samples the model cannot
    take, class ids outside the model's outputs, regression targets that do not match the outputs, or a loss
    that is not a finite scalar. Runs one forward pass per dataset on two samples; ``model`` is not changed."""
    if not clients:
        raise TaskError(f"task {task.name!r} has no training data")
    named = [("test data", task.test), *((f"client {c}'s data", ds) for c, ds in enumerate(clients))]
    kind = task.kind
    loss_fn = task.loss_fn()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        for what, ds in named:
            if len(ds) == 0:
                raise TaskError(f"task {task.name!r}: {what} is empty")
            x, y = batch(ds, torch.arange(min(2, len(ds))))
            try:
                out = model(x.to(next(model.parameters()).device))
            except Exception as exc:
                raise TaskError(f"task {task.name!r}: the model cannot take the samples of {what} (input shape "
                                f"{tuple(x.shape[1:])}, {x.dtype}): {type(exc).__name__}: {exc}") from exc
            _check_targets(task, what, ds, out, y, kind)
            try:
                loss = loss_fn(out, y.to(out.device))
            except Exception as exc:
                raise TaskError(f"task {task.name!r}: the loss fails on {what}: {type(exc).__name__}: {exc}") from exc
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise TaskError(f"task {task.name!r}: the loss must be a scalar tensor, got {shape}")
            if not math.isfinite(float(loss.detach())):
                raise TaskError(f"task {task.name!r}: the loss on {what} is {float(loss.detach())}")
    finally:
        model.load_state_dict(state)


def _check_targets(task: Task, what: str, ds: Dataset, out: torch.Tensor, y: torch.Tensor, kind: str) -> None:
    if kind == "classification":
        if torch.is_floating_point(y):
            raise TaskError(f"task {task.name!r}: {what} has float targets but the test data class ids")
        if out.ndim != 2:
            raise TaskError(f"task {task.name!r}: a classifier must output (batch, classes), got shape "
                            f"{tuple(out.shape)}")
        labels = targets_of(ds)
        if labels.size and (labels.min() < 0 or labels.max() >= out.shape[1]):
            raise TaskError(f"task {task.name!r}: {what} has labels from {int(labels.min())} to "
                            f"{int(labels.max())}, but the model has {out.shape[1]} outputs (classes 0.."
                            f"{out.shape[1] - 1})")
    elif out.numel() != y.numel():
        raise TaskError(f"task {task.name!r}: {what} has targets of shape {tuple(y.shape[1:])} per sample but the "
                        f"model outputs {tuple(out.shape[1:])}")
