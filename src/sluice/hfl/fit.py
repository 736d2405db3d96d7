"""Compression fitted to the task, and a watch for runs that stall.

Sluice's default budgets (uploads of 2 % of d, a server step of ``down_budget`` 0.02 · M/N · d a round) are
measured on tasks trained with plain SGD whose updates put most of their energy on few coordinates. Two
kinds of task break that assumption, and :func:`fit_compression` sizes the budgets for them at the start of
a run:

* **an adaptive client optimizer** (Adam, AdamW, RMSprop, Adagrad...: any optimizer with ``betas``) moves
  every coordinate by about the same amount, so a step that moves few coordinates a round leaves most of
  the model where it started: the server's step budget becomes :data:`ADAPTIVE_DOWN_BUDGET`; and it sizes
  its steps itself, so the server's adaptive gain, which lifts steps that keep their direction, overshoots:
  ``down_adapt`` becomes 0 (a gain of 1). Not on a model whose parameters are mostly embedding tables,
  whose steps move only the rows of the ids seen;
* **an adaptive optimizer, normalisation layers** (BatchNorm, LayerNorm, GroupNorm, InstanceNorm, RMSNorm)
  **or recurrent layers** (RNN, LSTM, GRU): on a small model the ratios leave a handful of coordinates per
  message, too few for the sample and the sign step to carry such updates; every upload keeps at least
  :data:`UP_MIN` coordinates and every step :data:`DOWN_MIN` (``compression.up_min`` / ``down_min``; they
  change nothing on models where the ratios already give that many).

Each choice is said once, in the run's notes (console, ``metrics.jsonl`` and the report); every one is
overridden by setting its key (``compression.down_budget``, ``down_adapt``, ``up_min``, ``down_min``; 0
turns a minimum off). Dense directions are left alone.

:class:`StallWatch` notes, once, a compressed run whose monitored test metric stays at the level of a
constant predictor (the most frequent test class's share; the test targets' standard deviation as RMSE) for
:data:`STALL_ROUNDS` evaluations in a row, and names the settings to raise.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from sluice.hfl.config import DOWN_ADAPT, DOWN_BUDGET, HFLConfig
from sluice.tasks.task import Task, targets_of

UP_MIN = 512
"""Coordinates an upload keeps at least on a task whose updates do not suit the ratios (see the docstring)."""
DOWN_MIN = 256
"""Coordinates the server's step moves at least a round on such a task."""
ADAPTIVE_DOWN_BUDGET = 0.05
"""``down_budget`` under an adaptive client optimizer."""
STALL_ROUNDS = 10
"""Evaluations in a row at a constant predictor's level that make a stall."""
EMBEDDINGS = (nn.Embedding, nn.EmbeddingBag)
"""Lookup tables: a step moves only the rows of the ids a batch holds, whatever the optimizer."""
NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)
"""Normalisation layers (BatchNorm and InstanceNorm share ``_NormBase``)."""


def adaptive_optimizer(task: Task, model: nn.Module, lr: float) -> str | None:
    """The name of the task's client optimizer when it scales each coordinate's step by its own statistics
    (an optimizer with ``betas``, or Adagrad, Adadelta, RMSprop), else None."""
    opt = task.make_optimizer(list(model.parameters()), lr)
    kinds = (torch.optim.Adagrad, torch.optim.Adadelta, torch.optim.RMSprop)
    return type(opt).__name__ if "betas" in opt.defaults or isinstance(opt, kinds) else None


def _reasons(task: Task, model: nn.Module, lr: float) -> tuple[str | None, list[str]]:
    """The task's adaptive client optimizer (None: not one, or an embedding-table model) and why its
    compression needs room: the optimizer, normalisation layers, recurrent layers."""
    d = sum(p.numel() for p in model.parameters())
    tables = sum(p.numel() for m in model.modules() if isinstance(m, EMBEDDINGS) for p in m.parameters(recurse=False))
    optimizer = adaptive_optimizer(task, model, lr) if tables <= d / 2 else None
    norms = sorted({type(m).__name__ for m in model.modules() if isinstance(m, NORMS)})
    recurrent = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.RNNBase)})
    why = []
    if optimizer:
        why.append(f"its client optimizer {optimizer} moves every coordinate alike")
    if norms:
        why.append(f"its model normalises activations ({', '.join(norms)})")
    if recurrent:
        why.append(f"its model has recurrent layers ({', '.join(recurrent)})")
    return optimizer, why


def _update(cfg: HFLConfig, d: int, optimizer: str | None, up_min: int, down_min: int) -> dict[str, Any]:
    """The compression settings to change for a model of ``d`` parameters: the unset downlink budget and gain,
    and ratios raised so that uploads keep ``up_min`` coordinates and steps move ``down_min``."""
    c = cfg.compression
    update: dict[str, Any] = {}
    if c.down == "topk" and c.down_budget is None:
        update["down_budget"] = ADAPTIVE_DOWN_BUDGET if optimizer else DOWN_BUDGET
    if c.down == "topk" and c.down_adapt is None:
        update["down_adapt"] = 0.0 if optimizer else DOWN_ADAPT
    if c.up in ("sample", "topk", "randk") and up_min / d > c.up_ratio:
        update["up_ratio"] = min(1.0, up_min / d)
    q = cfg.train.participation
    budget = update.get("down_budget", c.budget)
    if c.down == "topk" and c.down_ratio is None and down_min / d > budget * q:
        update["down_budget"] = min(1.0, down_min / (d * q))
    elif c.down == "topk" and c.down_ratio is not None and down_min / d > c.down_ratio:
        update["down_ratio"] = min(1.0, down_min / d)
    return update


def fit_compression(cfg: HFLConfig, task: Task, model: nn.Module) -> tuple[HFLConfig, list[str]]:
    """``cfg`` with the budgets sized for ``task`` and its ``model`` (see the module docstring), and a note
    for each choice that changed a setting."""
    c = cfg.compression
    d = sum(p.numel() for p in model.parameters())
    optimizer, why = _reasons(task, model, cfg.train.lr)
    up_min = c.up_min if c.up_min is not None else (UP_MIN if why else 0)
    down_min = c.down_min if c.down_min is not None else (DOWN_MIN if why else 0)
    update = _update(cfg, d, optimizer, up_min, down_min)
    fitted = cfg.model_copy(update={"compression": c.model_copy(update=update)})
    defaults = {"down_budget": DOWN_BUDGET, "down_adapt": DOWN_ADAPT}
    changed = {k: v for k, v in update.items() if defaults.get(k) != v}
    if not changed:
        return fitted, []
    old = {"up_ratio": c.up_ratio, "down_ratio": c.down_ratio, "down_budget": c.budget, "down_adapt": c.adapt}
    settings = ", ".join(f"compression.{k} {old[k]:g} → {v:.4g}" for k, v in changed.items())
    why = why or ["compression.up_min or down_min is set"]
    return fitted, [f"compression fitted to task {task.name!r} ({d:,} parameters): {' and '.join(why)}, so "
                    f"{settings} (uploads keep ≥ {up_min} coordinates, steps move ≥ {down_min} a round); set "
                    "compression.down_budget, down_adapt, up_min or down_min to choose otherwise"]


class StallWatch:
    """Notes once when the monitored test metric stays at a constant predictor's level (module docstring)."""

    def __init__(self, task: Task, compressed: bool) -> None:
        self.compressed = compressed
        self.run = 0
        self.said = False
        targets = np.asarray(targets_of(task.test))
        if task.kind == "classification":
            counts = np.bincount(targets.astype(np.int64).reshape(-1))
            self.metric, self.level = "test_accuracy", float(counts.max() / counts.sum())
        else:
            self.metric, self.level = "test_rmse", float(targets.reshape(len(targets), -1).std(axis=0).mean())

    def stalled(self, value: float) -> bool:
        """Whether ``value`` is at the constant predictor's level (within a point of its accuracy, or within
        1 % of its RMSE)."""
        if self.metric == "test_accuracy":
            return value <= self.level + 0.01
        return value >= 0.99 * self.level

    def observe(self, rnd: int, metrics: dict[str, float]) -> str | None:
        """A note the first time the run has stalled for :data:`STALL_ROUNDS` evaluations, else None."""
        if not self.compressed or self.said or self.metric not in metrics:
            return None
        self.run = self.run + 1 if self.stalled(metrics[self.metric]) else 0
        if self.run < STALL_ROUNDS:
            return None
        self.said = True
        what = "predicting the most frequent class" if self.metric == "test_accuracy" else "predicting the mean"
        return (f"stalled: {self.metric} has stayed at {metrics[self.metric]:.4g} for {self.run} evaluations up to "
                f"round {rnd}, the level of {what} ({self.level:.4g}); compression may be too tight for this task: "
                "raise compression.up_min and compression.down_min (e.g. to 2048 and 1024) or compression.down_budget, "
                "or compare with compression.up = \"dense\" and compression.down = \"dense\"")
