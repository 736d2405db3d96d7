"""Plain centralised training: all data in one place, one model, minibatch SGD.

One *iteration* is one epoch over the training samples in use (or ``steps_per_iteration`` minibatch
steps when given). Classification minimises the cross-entropy ``−(1/B) Σ log softmax(f(x))_y``;
regression the mean squared error ``(1/B) Σ ‖f(x) − y‖²/k`` over the ``k`` outputs. The update is SGD
with optional momentum: ``v ← μ·v + ∇L``, ``θ ← θ − η·v``.

After each iteration the test set is evaluated: classification reports ``test_loss``, ``test_accuracy``
and macro ``test_precision``, ``test_recall``, ``test_f1`` (averaged over the classes present in the test
labels); regression reports ``test_loss`` = ``test_mse``, ``test_mae``, ``test_rmse``. Extra metric
functions ``f(prediction, target) -> float`` are evaluated on the test set too.

With fewer than ``min_samples`` training samples, an iteration does not train and reports the anomaly
``INADEQUATE_TRAINING_DATA``; :meth:`LocalTrainer.add_data` adds samples and training goes on from the
same weights.
"""

from __future__ import annotations

import copy
import math
import numbers
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import TensorDataset

from sluice.engine import IterationEvent, Suspendable
from sluice.errors import ConfigError, DataError, TrainingError
from sluice.metrics import MetricSpec
from sluice.models import get_flat, layers, mlp, set_flat
from sluice.models.device import resolve_device
from sluice.models.flat import tied_to_frozen
from sluice.models.state import load_module_tree, load_optimizer_tree, module_tree, optimizer_tree
from sluice.tasks.task import (
    Task,
    batch,
    batch_statistics,
    build_model,
    check_task,
    concat,
    extend,
    predict,
    take,
    task_metrics,
    to_device,
)
from sluice.wire.state import field, pack, unpack

MetricFn = Callable[[np.ndarray, np.ndarray], float]


class LocalTrainer(Suspendable):
    """Implements :class:`sluice.engine.Engine` for centralised training of a task's model on its one training
    set (a task with one dataset per client trains on all of them, in client order).

    The optimizer is the task's, or SGD with ``lr`` and ``momentum``. :meth:`from_arrays` builds the task of an
    MLP on arrays."""

    def __init__(
        self,
        task: Task,
        *,
        lr: float = 0.05,
        momentum: float = 0.0,
        batch_size: int = 32,
        steps_per_iteration: int | None = None,
        min_samples: int = 1,
        max_train_samples: int | None = None,
        seed: int = 0,
        default_iterations: int | None = None,
        device: str = "cpu",
    ) -> None:
        if lr <= 0 or not 0 <= momentum < 1 or batch_size < 1 or min_samples < 0:
            raise ConfigError(
                "need lr > 0, 0 <= momentum < 1, batch_size >= 1 and min_samples >= 0, got "
                f"lr={lr}, momentum={momentum}, batch_size={batch_size}, min_samples={min_samples}"
            )
        if steps_per_iteration is not None and steps_per_iteration < 1:
            raise ConfigError(f"steps_per_iteration must be >= 1, got {steps_per_iteration}")
        self.task_def = task
        self.task = task.kind
        train = concat(task.train) if task.per_client else task.train
        self.base = train if max_train_samples is None or max_train_samples >= len(train) else \
            take(train, range(max_train_samples))
        self.added: tuple[np.ndarray, np.ndarray] | None = None
        self.lr, self.momentum, self.batch_size = float(lr), float(momentum), int(batch_size)
        self.steps_per_iteration = steps_per_iteration
        self.min_samples = int(min_samples)
        self.metric_specs = list(task.specs())
        self.seed = int(seed)
        self.default_iterations = default_iterations
        self.device = resolve_device(device)
        self.iteration = 0
        self._limit: int | None = None
        self._suspended = False
        self.model: torch.nn.Module | None = None
        self._trainable: int | None = None

    @classmethod
    def from_arrays(cls, X_train: Any, y_train: Any, X_test: Any, y_test: Any, *,
                    kind: Literal["classification", "regression"] = "classification", num_classes: int | None = None,
                    hidden: Sequence[int] = (64,), metric_fns: dict[str, MetricFn] | None = None,
                    metric_specs: Sequence[MetricSpec] = (), seed: int = 0, name: str = "arrays",
                    **kwargs: Any) -> LocalTrainer:
        """A trainer of an MLP with ``hidden`` units on arrays: class ids (``num_classes`` outputs; default: the
        largest label + 1) or regression targets (1-D or 2-D)."""
        if kind not in ("classification", "regression"):
            raise ConfigError(f"kind must be 'classification' or 'regression', got {kind!r}")
        X, y = _arrays(X_train, y_train, kind)
        Xt, yt = _arrays(X_test, y_test, kind)
        if Xt.shape[1] != X.shape[1]:
            raise DataError(f"train has {X.shape[1]} features but test has {Xt.shape[1]}")
        if kind == "classification":
            seen = max(int(y.max(initial=-1)), int(yt.max(initial=-1))) + 1
            out = int(num_classes or seen)
            if seen > out:
                raise DataError(f"labels go up to {seen - 1} but num_classes is {out}")
        else:
            out = 1 if y.ndim == 1 else int(y.shape[1])
        task = Task(model=lambda: mlp(X.shape[1], [int(h) for h in hidden], out, seed=seed),
                    train=TensorDataset(torch.from_numpy(X), torch.from_numpy(y)),
                    test=TensorDataset(torch.from_numpy(Xt), torch.from_numpy(yt)), metrics=dict(metric_fns or {}),
                    metric_specs=tuple(metric_specs), name=name)
        return cls(task, seed=seed, **kwargs)

    @classmethod
    def from_dataset(cls, name: str = "digits", *, seed: int = 0, test_fraction: float = 0.2,
                     **kwargs: Any) -> LocalTrainer:
        """A classifier on one of the embedded datasets of :func:`sluice.data.load_dataset`."""
        from sluice.data import load_dataset

        ds = load_dataset(name, seed=seed, test_fraction=test_fraction)
        return cls.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test, num_classes=ds.num_classes, seed=seed,
                               name=name, **kwargs)

    # ------------------------------------------------------------------ data
    @property
    def data(self) -> torch.utils.data.Dataset:
        """The training samples held: the task's, then those added."""
        return self.base if self.added is None else extend(self.base, *self.added)

    # ------------------------------------------------------------------ optional capabilities
    @property
    def num_samples(self) -> int:
        """Training samples in use."""
        n = len(self.base) + (0 if self.added is None else len(self.added[1]))
        return n if self._limit is None else min(n, self._limit)

    @property
    def num_layers(self) -> int:
        """Layers of the model that hold parameters (:func:`sluice.models.layers`)."""
        self.start()
        return len(layers(self.model))

    @property
    def metrics(self) -> dict[str, MetricSpec]:
        return self.task_def.declared_metrics()

    @property
    def metric_fns(self) -> dict[str, MetricFn]:
        """The task's own test metrics (a scenario's type-specific errors)."""
        return dict(self.task_def.metrics)

    counts_bytes = False

    def set_trainable_layers(self, n: int) -> None:
        """Train only the last ``n`` layers; earlier ones are frozen."""
        total = self.num_layers
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= total:
            raise ConfigError(f"layers to train must be in 1..{total}, got {n!r}")
        tied = tied_to_frozen(self.model, int(n))
        if tied:
            raise ConfigError(f"the last {n} layers share parameters with earlier layers ({', '.join(tied)}: tied "
                              "weights), so they cannot be trained alone; train more layers or all")
        self._trainable = int(n)
        self.opt = _optimizer(self.task_def, self.model, self._trainable, self.lr, self.momentum)

    def limit_samples(self, n: int) -> None:
        """Use only the first ``n`` training samples."""
        if n < 1:
            raise ConfigError(f"sample limit must be >= 1, got {n}")
        self._limit = n

    def set_min_samples(self, n: int) -> None:
        """With fewer than ``n`` training samples an iteration trains nothing and reports
        ``INADEQUATE_TRAINING_DATA``."""
        if n < 0:
            raise ConfigError(f"minimum sample count must be >= 0, got {n}")
        self.min_samples = int(n)

    @property
    def num_params(self) -> int:
        self.start()
        return sum(p.numel() for p in self.model.parameters())

    @property
    def params(self) -> np.ndarray:
        """Flat copy of the model weights."""
        self.start()
        assert self.model is not None
        return get_flat(self.model)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self.model is not None:
            return
        torch.set_num_threads(1)
        model = build_model(self.task_def, self.seed).to(self.device)
        check_task(self.task_def, model, [self.base])
        self.base = to_device(self.base, self.device)
        self.model = model
        self.loss = self.task_def.loss_fn()
        self.opt = _optimizer(self.task_def, model, self._trainable, self.lr, self.momentum)

    def check_data(self, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """Samples for :meth:`add_data` (``{"X": ..., "y": ...}`` or ``(X, y)``) as arrays, or DataError when
        their shape, labels or values do not fit this model."""
        if isinstance(data, dict):
            unknown = sorted(set(data) - {"X", "y"})
            if unknown:
                raise DataError(f"local training takes only X and y, got also {unknown}")
            X, y = data.get("X"), data.get("y")
        else:
            X, y = data
        if X is None or y is None:
            raise DataError("added data needs both X and y")
        raw_y = np.asarray(y)
        if self.task == "classification" and raw_y.dtype.kind == "f" and not (
            np.isfinite(raw_y).all() and (raw_y == np.round(raw_y)).all()
        ):
            raise DataError("class labels must be whole numbers (no NaN, inf or fractions)")
        X, y = _arrays(X, y, self.task, flat=False)
        x0, _ = batch(self.base, torch.zeros(1, dtype=torch.int64))
        if X.shape[1:] != tuple(x0.shape[1:]):
            what = f"{x0.shape[1]} features" if x0.ndim == 2 else f"inputs of shape {tuple(x0.shape[1:])}"
            raise DataError(f"added data has {X.shape[1] if X.ndim == 2 else X.shape[1:]} features, the model takes "
                            f"{what}")
        if not (np.isfinite(X).all() and np.isfinite(y).all()):
            raise DataError("added data has non-finite values (NaN or inf)")
        self.start()
        if self.task == "classification" and y.size:
            classes = _outputs(self.model, self.base, self.device)
            if int(y.max()) >= classes:
                raise DataError(f"added labels go up to {int(y.max())}; classes are 0..{classes - 1}")
        prepare = self.task_def.prepare
        return prepare(X, y) if prepare is not None else (X, y)

    def add_data(self, data: Any) -> None:
        """Append samples: ``{"X": ..., "y": ...}`` or ``(X, y)`` (checked by :meth:`check_data`)."""
        X, y = self.check_data(data)
        if self._limit is not None:
            self._limit = self.num_samples + X.shape[0]
        self.added = (X, y) if self.added is None else (np.concatenate([self.added[0], X]),
                                                        np.concatenate([self.added[1], y]))

    def save(self, path: str | Path) -> str:
        """The model as a CPU ``state_dict`` (loads on any device), with the task's name and the iteration."""
        self.start()
        assert self.model is not None
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        torch.save({"state_dict": state, "task": self.task_def.name, "kind": self.task,
                    "iteration": self.iteration}, p)
        return str(p)

    def probe(self, iterations: int = 2) -> float:
        """Seconds per iteration measured on ``iterations`` iterations; the model is left as it was."""
        self.start()
        snap = (copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.opt.state_dict()), self.iteration)
        t0 = time.perf_counter()
        done = 0
        for _ in range(max(1, iterations)):
            if self.num_samples < max(self.min_samples, 1):
                break
            self._train_once()
            done += 1
        secs = (time.perf_counter() - t0) / max(done, 1)
        assert self.model is not None
        self.model.load_state_dict(snap[0])
        self.opt.load_state_dict(snap[1])
        self.iteration = snap[2]
        return secs

    # ------------------------------------------------------------------ checkpoint
    def checkpoint(self) -> bytes:
        """The whole training state as bytes (:func:`sluice.wire.state.pack`): the weights, the optimizer's
        state (momentum buffers), the iteration count (which seeds the next shuffles), the samples added by
        :meth:`add_data` and the settings (:meth:`limit_samples`, :meth:`set_min_samples`,
        :meth:`set_trainable_layers`). The task's own data comes from the task."""
        self.start()
        assert self.model is not None
        return pack({"kind": "local-trainer", "model": module_tree(self.model), "optimizer": optimizer_tree(self.opt),
                     "iteration": self.iteration, "added": None if self.added is None else list(self.added),
                     "limit": self._limit, "min_samples": self.min_samples, "trainable_layers": self._trainable})

    def restore(self, buf: bytes) -> None:
        """Continue from a :meth:`checkpoint` of a trainer built with the same arguments: the iterations that
        follow are those the checkpointed trainer would have run."""
        model, opt, iteration, added, limit, min_samples, trainable = field(
            unpack(buf), "local-trainer", "model", "optimizer", "iteration", "added", "limit", "min_samples",
            "trainable_layers")
        self.start()
        assert self.model is not None
        self._trainable = trainable
        self.opt = _optimizer(self.task_def, self.model, self._trainable, self.lr, self.momentum)
        load_module_tree(self.model, model)
        load_optimizer_tree(self.opt, opt)
        self.added = None if added is None else (added[0], added[1])
        self.iteration, self._limit, self.min_samples = int(iteration), limit, int(min_samples)

    # ------------------------------------------------------------------ one iteration
    def _train_once(self) -> float:
        assert self.model is not None
        data = _first(self.data, self.num_samples)
        n = len(data)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.iteration + 1)
        bs = min(self.batch_size, n)
        steps = self.steps_per_iteration or math.ceil(n / bs)
        order = torch.randperm(n, generator=gen)
        self.model.train()
        total, count = 0.0, 0
        pos = 0
        for _ in range(steps):
            if pos >= n:
                order = torch.randperm(n, generator=gen)
                pos = 0
            idx = order[pos:pos + bs]
            pos += bs
            if len(idx) == 1 and batch_statistics(self.model):  # BatchNorm cannot take one sample
                continue
            x, y = batch(data, idx)
            self.opt.zero_grad(set_to_none=True)
            loss = self.loss(self.model(x.to(self.device)), y.to(self.device))
            loss.backward()
            self.opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        self.iteration += 1
        return total / max(count, 1)

    def _evaluate(self) -> dict[str, float]:
        assert self.model is not None
        outputs, targets = predict(self.model, self.task_def.test, self.device)
        return task_metrics(self.task_def, outputs, targets)

    def evaluate(self) -> dict[str, float]:
        """Test metrics of the model as it is now, without training it."""
        self.start()
        return self._evaluate()

    def iterate(self) -> IterationEvent:
        self.start()
        if self._suspended:
            raise TrainingError("the engine is suspended: resume() it before the next iteration")
        t0 = time.perf_counter()
        have = self.num_samples
        if have < max(self.min_samples, 1):
            return IterationEvent(
                iteration=self.iteration, seconds=time.perf_counter() - t0,
                anomaly="INADEQUATE_TRAINING_DATA",
                detail=f"{have} training samples, at least {max(self.min_samples, 1)} needed",
            )
        train_loss = self._train_once()
        metrics = {"train_loss": train_loss, **self._evaluate()}
        anomaly, detail = None, ""
        bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
        if bad:
            anomaly, detail = "DIVERGED", f"{bad[0]} is {metrics[bad[0]]} at iteration {self.iteration}"
        return IterationEvent(iteration=self.iteration, metrics=metrics, seconds=time.perf_counter() - t0,
                              anomaly=anomaly, detail=detail)

    def get_weights(self) -> np.ndarray:
        """Alias of :attr:`params`."""
        return self.params

    def set_weights(self, flat: np.ndarray) -> None:
        self.start()
        assert self.model is not None
        set_flat(self.model, flat)


def _arrays(X: Any, y: Any, kind: str, *, flat: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` as float32 inputs (2-D when ``flat``) and int64 class ids or float32 targets."""
    X = np.ascontiguousarray(X, dtype=np.float32)
    if flat and X.ndim != 2:
        raise DataError(f"X must be 2-D (samples × features), got shape {X.shape}")
    if kind == "classification":
        y = np.ascontiguousarray(y, dtype=np.int64).reshape(-1)
        if y.size and y.min() < 0:
            raise DataError("class labels must be >= 0")
    else:
        y = np.ascontiguousarray(y, dtype=np.float32)
        if y.ndim > 2:
            raise DataError(f"regression targets must be 1-D or 2-D, got shape {y.shape}")
    if y.shape[0] != X.shape[0]:
        raise DataError(f"X has {X.shape[0]} rows but y has {y.shape[0]}")
    return X, y


def _optimizer(task: Task, model: torch.nn.Module, trainable: int | None, lr: float,
               momentum: float) -> torch.optim.Optimizer:
    """Freeze all but the last ``trainable`` layers of ``model`` (all train when None) and return the optimizer
    of the layers that train: the task's, or SGD with ``lr`` and ``momentum``."""
    groups = layers(model)
    keep = len(groups) if trainable is None else trainable
    for i, group in enumerate(groups):
        for p in group:
            p.requires_grad_(i >= len(groups) - keep)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = task.optimizer
    return opt(params, lr) if opt is not None else torch.optim.SGD(params, lr=lr, momentum=momentum)


def _outputs(model: torch.nn.Module, data: torch.utils.data.Dataset, device: torch.device) -> int:
    """The number of outputs of ``model`` (left in eval mode), from one sample of ``data``."""
    x, _ = batch(data, torch.zeros(1, dtype=torch.int64))
    with torch.no_grad():
        model.eval()
        return int(model(x.to(device)).shape[1])


def _first(data: torch.utils.data.Dataset, n: int) -> torch.utils.data.Dataset:
    """The first ``n`` samples of ``data`` (``data`` itself when it holds ``n``)."""
    return data if n == len(data) else take(data, range(n))
