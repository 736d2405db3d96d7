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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from sluice.engine import IterationEvent, Suspendable
from sluice.errors import ConfigError, DataError, TrainingError
from sluice.hfl.state import field, pack, unpack
from sluice.metrics import (
    CLASSIFICATION,
    KNOWN,
    REGRESSION,
    MetricSpec,
    classification_metrics,
    declare,
    regression_metrics,
)
from sluice.models import get_flat, mlp, set_flat
from sluice.models.state import load_module_tree, load_optimizer_tree, module_tree, optimizer_tree

MetricFn = Callable[[np.ndarray, np.ndarray], float]


class LocalTrainer(Suspendable):
    """Implements :class:`sluice.engine.Engine` for centralised training of an MLP."""

    def __init__(
        self,
        X_train: np.ndarray,
        y_train: np.ndarray,
        X_test: np.ndarray,
        y_test: np.ndarray,
        *,
        task: Literal["classification", "regression"] = "classification",
        num_classes: int | None = None,
        hidden: Sequence[int] = (64,),
        lr: float = 0.05,
        momentum: float = 0.0,
        batch_size: int = 32,
        steps_per_iteration: int | None = None,
        min_samples: int = 1,
        metric_fns: dict[str, MetricFn] | None = None,
        metric_specs: Sequence[MetricSpec] = (),
        seed: int = 0,
        default_iterations: int | None = None,
    ) -> None:
        if task not in ("classification", "regression"):
            raise ConfigError(f"task must be 'classification' or 'regression', got {task!r}")
        if lr <= 0 or not 0 <= momentum < 1 or batch_size < 1 or min_samples < 0:
            raise ConfigError(
                "need lr > 0, 0 <= momentum < 1, batch_size >= 1 and min_samples >= 0, got "
                f"lr={lr}, momentum={momentum}, batch_size={batch_size}, min_samples={min_samples}"
            )
        if steps_per_iteration is not None and steps_per_iteration < 1:
            raise ConfigError(f"steps_per_iteration must be >= 1, got {steps_per_iteration}")
        self.task = task
        self.X, self.y = self._check(X_train, y_train)
        self.X_test, self.y_test = self._check(X_test, y_test)
        if self.X_test.shape[1] != self.X.shape[1]:
            raise DataError(f"train has {self.X.shape[1]} features but test has {self.X_test.shape[1]}")
        if task == "classification":
            seen = max(int(self.y.max(initial=-1)), int(self.y_test.max(initial=-1))) + 1
            self.num_classes = int(num_classes or seen)
            if seen > self.num_classes:
                raise DataError(f"labels go up to {seen - 1} but num_classes is {self.num_classes}")
            out_dim = self.num_classes
        else:
            self.num_classes = 0
            out_dim = 1 if self.y.ndim == 1 else int(self.y.shape[1])
        self.in_dim, self.out_dim = int(self.X.shape[1]), out_dim
        self.hidden = [int(h) for h in hidden]
        self.lr, self.momentum, self.batch_size = float(lr), float(momentum), int(batch_size)
        self.steps_per_iteration = steps_per_iteration
        self.min_samples = int(min_samples)
        self.metric_fns = dict(metric_fns or {})
        specs = {s.name: s for s in metric_specs}
        undeclared = sorted(set(self.metric_fns) - set(specs) - set(KNOWN))
        if undeclared:
            raise ConfigError(f"metric functions {undeclared} need a MetricSpec in metric_specs (whether higher "
                              "is better, and the range)")
        self.metric_specs = [specs.get(n) or KNOWN[n] for n in self.metric_fns]
        self.seed = int(seed)
        self.default_iterations = default_iterations
        self.iteration = 0
        self._limit: int | None = None
        self._suspended = False
        self.model: nn.Module | None = None
        self._trainable: int | None = None

    @classmethod
    def from_dataset(cls, name: str = "digits", *, seed: int = 0, test_fraction: float = 0.2,
                     **kwargs: Any) -> LocalTrainer:
        """A classifier on one of the embedded datasets of :func:`sluice.data.load_dataset`."""
        from sluice.data import load_dataset

        ds = load_dataset(name, seed=seed, test_fraction=test_fraction)
        return cls(ds.X_train, ds.y_train, ds.X_test, ds.y_test, num_classes=ds.num_classes, seed=seed,
                   **kwargs)

    def _check(self, X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2:
            raise DataError(f"X must be 2-D (samples × features), got shape {X.shape}")
        if self.task == "classification":
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

    # ------------------------------------------------------------------ optional capabilities
    @property
    def num_samples(self) -> int:
        """Training samples in use."""
        n = self.X.shape[0]
        return n if self._limit is None else min(n, self._limit)

    @property
    def num_layers(self) -> int:
        """Trainable (linear) layers of the model."""
        return len(self.hidden) + 1

    @property
    def metrics(self) -> dict[str, MetricSpec]:
        base = CLASSIFICATION if self.task == "classification" else REGRESSION
        return declare(("train_loss", *base), self.metric_specs)

    counts_bytes = False

    def set_trainable_layers(self, layers: int) -> None:
        """Train only the last ``layers`` linear layers; earlier ones are frozen."""
        if not 1 <= layers <= self.num_layers:
            raise ConfigError(f"layers to train must be in 1..{self.num_layers}, got {layers}")
        self._trainable = layers
        if self.model is not None:
            self._apply_trainable()

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
        self.model = mlp(self.in_dim, self.hidden, self.out_dim, seed=self.seed)
        self._apply_trainable()

    def _apply_trainable(self) -> None:
        assert self.model is not None
        linears = [m for m in self.model if isinstance(m, nn.Linear)]
        keep = len(linears) if self._trainable is None else self._trainable
        for i, lin in enumerate(linears):
            for p in lin.parameters():
                p.requires_grad_(i >= len(linears) - keep)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)

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
        X, y = self._check(X, y)
        if X.shape[1] != self.in_dim:
            raise DataError(f"added data has {X.shape[1]} features, the model takes {self.in_dim}")
        if not (np.isfinite(X).all() and np.isfinite(y).all()):
            raise DataError("added data has non-finite values (NaN or inf)")
        if self.task == "classification" and y.size and int(y.max()) >= self.num_classes:
            raise DataError(f"added labels go up to {int(y.max())}; classes are 0..{self.num_classes - 1}")
        return X, y

    def add_data(self, data: Any) -> None:
        """Append samples: ``{"X": ..., "y": ...}`` or ``(X, y)`` (checked by :meth:`check_data`)."""
        X, y = self.check_data(data)
        if self._limit is not None:
            self._limit += X.shape[0]
        self.X = np.concatenate([self.X, X])
        self.y = np.concatenate([self.y, y])

    def save(self, path: str | Path) -> str:
        self.start()
        assert self.model is not None
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"state_dict": self.model.state_dict(), "in_dim": self.in_dim, "hidden": self.hidden,
                    "out_dim": self.out_dim, "task": self.task, "iteration": self.iteration}, p)
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
        """The whole training state as bytes (:func:`sluice.hfl.state.pack`): the weights, the optimizer's
        state (momentum buffers), the iteration count (which seeds the next shuffles), the training samples
        (those added by :meth:`add_data` included) and the settings (:meth:`limit_samples`,
        :meth:`set_min_samples`, :meth:`set_trainable_layers`). The test set comes from the constructor."""
        self.start()
        assert self.model is not None
        return pack({"kind": "local-trainer", "model": module_tree(self.model), "optimizer": optimizer_tree(self.opt),
                     "iteration": self.iteration, "X": self.X, "y": self.y, "limit": self._limit,
                     "min_samples": self.min_samples, "trainable_layers": self._trainable})

    def restore(self, buf: bytes) -> None:
        """Continue from a :meth:`checkpoint` of a trainer built with the same arguments: the iterations that
        follow are those the checkpointed trainer would have run."""
        model, opt, iteration, X, y, limit, min_samples, layers = field(
            unpack(buf), "local-trainer", "model", "optimizer", "iteration", "X", "y", "limit", "min_samples",
            "trainable_layers")
        X, y = self._check(X, y)
        if X.shape[1] != self.in_dim:
            raise DataError(f"the checkpoint's samples have {X.shape[1]} features, the model takes {self.in_dim}")
        self.start()
        assert self.model is not None
        self._trainable = layers
        self._apply_trainable()
        load_module_tree(self.model, model)
        load_optimizer_tree(self.opt, opt)
        self.X, self.y = X, y
        self.iteration, self._limit, self.min_samples = int(iteration), limit, int(min_samples)

    # ------------------------------------------------------------------ one iteration
    def _loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.task == "classification":
            return nn.functional.cross_entropy(out, y)
        return nn.functional.mse_loss(out, y.reshape(out.shape))

    def _train_once(self) -> float:
        assert self.model is not None
        n = self.num_samples
        X = torch.from_numpy(self.X[:n])
        y = torch.from_numpy(self.y[:n])
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
            self.opt.zero_grad(set_to_none=True)
            loss = self._loss(self.model(X[idx]), y[idx])
            loss.backward()
            self.opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        self.iteration += 1
        return total / max(count, 1)

    def _evaluate(self) -> dict[str, float]:
        assert self.model is not None
        self.model.eval()
        with torch.no_grad():
            out = self.model(torch.from_numpy(self.X_test))
        if self.task == "classification":
            metrics = classification_metrics(out, self.y_test, self.num_classes)
        else:
            metrics = regression_metrics(out.numpy().reshape(self.y_test.shape), self.y_test)
        pred_np = out.numpy()
        if self.task == "regression":
            pred_np = pred_np.reshape(self.y_test.shape)
        for name, fn in self.metric_fns.items():
            metrics[name] = float(fn(pred_np, self.y_test))
        return metrics

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
