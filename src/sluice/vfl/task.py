"""A split-training task as the leader defines it: data, columns, parts, hyper-parameters, batches.

The leader builds a :class:`Task` from its config and proposes one slice of it to each follower
(:func:`proposal_for`). Followers rebuild what they need from the proposal alone, so the proposal is
the whole contract between parties (SPEC P7).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .config import SplitConfig
from .data import Table, default_columns, load_table, split_ids
from .models import mlp_spec

PROTOCOL = 1


@dataclass
class Task:
    cfg: SplitConfig
    table: Table
    train_ids: list[str]
    test_ids: list[str]
    leader_columns: list[int]
    follower_columns: list[list[int]]
    follower_names: list[str]
    specs: dict[str, dict[str, Any]]
    hparams: dict[str, Any]
    steps: int | None
    task_id: str

    @property
    def topology(self) -> str:
        return self.cfg.topology


def follower_part(topology: str, name: str) -> str:
    return f"{name}.middle" if topology == "5" else f"{name}.bottom"


def build_task(cfg: SplitConfig, unbounded: bool = False) -> Task:
    """Everything the leader needs to propose and run the task described by ``cfg``."""
    table = load_table(cfg.data, cfg.seed)
    train_ids, test_ids = split_ids(table, cfg.data.test_fraction, cfg.seed)
    if len(test_ids) > cfg.train.eval_samples:
        rng = np.random.default_rng((cfg.seed, 104729))
        keep = np.sort(rng.choice(len(test_ids), cfg.train.eval_samples, replace=False))
        test_ids = [test_ids[i] for i in keep]
    leader_cols, follower_cols = default_columns(cfg, table)
    names = [f"follower-{i + 1}" for i in range(cfg.followers)]
    m = cfg.model
    specs: dict[str, dict[str, Any]] = {}
    emb = m.embedding
    if cfg.topology == "5":
        specs["leader.bottom"] = mlp_spec(
            len(leader_cols), m.bottom_hidden, emb, m.activation, True, m.batch_norm, m.dtype
        )
        specs[f"{names[0]}.middle"] = mlp_spec(
            emb, m.middle_hidden, emb, m.activation, True, m.batch_norm, m.dtype
        )
        specs["leader.top"] = mlp_spec(
            emb, m.top_hidden, table.n_classes, m.activation, False, False, m.dtype
        )
    else:
        width = emb * cfg.followers
        if cfg.topology == "6":
            specs["leader.bottom"] = mlp_spec(
                len(leader_cols), m.bottom_hidden, emb, m.activation, True, m.batch_norm, m.dtype
            )
            width += emb
        for name, cols in zip(names, follower_cols, strict=True):
            specs[f"{name}.bottom"] = mlp_spec(
                len(cols), m.bottom_hidden, emb, m.activation, True, m.batch_norm, m.dtype
            )
        specs["leader.top"] = mlp_spec(
            width, m.top_hidden, table.n_classes, m.activation, False, False, m.dtype
        )
    t = cfg.train
    hparams = {
        "optimizer": t.optimizer,
        "lr": t.lr,
        "momentum": t.momentum,
        "weight_decay": t.weight_decay,
        "batch_size": t.batch_size,
    }
    per_epoch = math.ceil(len(train_ids) / t.batch_size)
    steps = None if unbounded else (t.steps if t.steps is not None else t.epochs * per_epoch)
    return Task(
        cfg, table, train_ids, test_ids, leader_cols, follower_cols, names, specs, hparams, steps,
        uuid.uuid4().hex[:12],
    )


def proposal_for(task: Task, index: int, groups: int | str, tls: bool) -> dict[str, Any]:
    """The task as proposed to follower ``index`` (dataset, ids, its columns, its model part, ...)."""
    name = task.follower_names[index]
    d = task.cfg.data
    part = follower_part(task.topology, name)
    return {
        "protocol": PROTOCOL,
        "task_id": task.task_id,
        "topology": task.topology,
        "follower": name,
        "followers": len(task.follower_names),
        "dataset": {
            "dataset": d.dataset,
            "n_samples": d.n_samples,
            "n_features": d.n_features,
            "n_informative": d.n_informative,
            "n_classes": d.n_classes,
        },
        "seed": task.cfg.seed,
        "columns": task.follower_columns[index],
        "train_ids": task.train_ids,
        "test_ids": task.test_ids,
        "part": part,
        "model": task.specs[part],
        "allow_batch_coupled": task.cfg.model.allow_batch_coupled,
        "hparams": task.hparams,
        "steps": task.steps,
        "eval_every": task.cfg.train.eval_every,
        "groups": groups,
        "tls": tls,
    }


@lru_cache(maxsize=64)
def _perm(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng((seed, 7919, epoch)).permutation(n)


class BatchPlan:
    """Which train rows (positions in the agreed id order) form the batch of each step: a seeded
    permutation per epoch, consecutive slices of ``batch_size`` (the last one of an epoch may be shorter)."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.per_epoch = math.ceil(n / batch_size)

    def epoch(self, step: int) -> int:
        return step // self.per_epoch

    def batch(self, step: int) -> np.ndarray:
        e, j = divmod(step, self.per_epoch)
        return _perm(self.n, self.seed, e)[j * self.batch_size : (j + 1) * self.batch_size]


def eval_due(step: int, steps: int | None, eval_every: int) -> bool:
    """Evaluate after ``step`` every ``eval_every`` steps and after the last step."""
    if steps is not None and step == steps - 1:
        return True
    return eval_every > 0 and (step + 1) % eval_every == 0
