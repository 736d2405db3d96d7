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
from .topology import Topology, topology

PROTOCOL = 2
"""Version 2: ``steps`` in the proposal is a plan; the leader ends the task with ``stop`` (at any step, even
before the proposal) or extends it with ``extend``; a follower always answers ``stop`` with ``bye``."""


@dataclass(frozen=True)
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
    steps: int
    task_id: str

    @property
    def topology(self) -> Topology:
        return topology(self.cfg.topology)


def planned_steps(cfg: SplitConfig, train_rows: int) -> int:
    """``train.steps``, else ``train.epochs`` epochs of ``ceil(train_rows / batch_size)`` steps."""
    t = cfg.train
    return t.steps if t.steps is not None else t.epochs * math.ceil(train_rows / t.batch_size)


def build_task(cfg: SplitConfig, steps: int | None = None) -> Task:
    """Everything the leader needs to propose and run the task described by ``cfg`` for ``steps`` steps
    (default: :func:`planned_steps`)."""
    table = load_table(cfg.data, cfg.seed)
    train_ids, test_ids = split_ids(table, cfg.data.test_fraction, cfg.seed)
    if len(test_ids) > cfg.train.eval_samples:
        rng = np.random.default_rng((cfg.seed, 104729))
        keep = np.sort(rng.choice(len(test_ids), cfg.train.eval_samples, replace=False))
        test_ids = [test_ids[i] for i in keep]
    leader_cols, follower_cols = default_columns(cfg, table)
    names = [f"follower-{i + 1}" for i in range(cfg.followers)]
    topo = topology(cfg.topology)
    m = cfg.model
    emb = m.embedding

    def mlp(in_dim: int, hidden: list[int], out: int, final: bool, bn: bool) -> dict[str, Any]:
        return mlp_spec(in_dim, hidden, out, m.activation, final, bn, m.dtype)

    specs: dict[str, dict[str, Any]] = {}
    if topo.leader_bottom:
        specs[topo.part("leader")] = mlp(len(leader_cols), m.bottom_hidden, emb, True, m.batch_norm)
    for name, cols in zip(names, follower_cols, strict=True):
        if topo.u_shape:
            specs[topo.part(name)] = mlp(emb, m.middle_hidden, emb, True, m.batch_norm)
        else:
            specs[topo.part(name)] = mlp(len(cols), m.bottom_hidden, emb, True, m.batch_norm)
    specs["leader.top"] = mlp(emb * topo.top_inputs(cfg.followers), m.top_hidden, table.outputs, False, False)
    t = cfg.train
    hparams = {
        "optimizer": t.optimizer,
        "lr": t.lr,
        "momentum": t.momentum,
        "weight_decay": t.weight_decay,
        "batch_size": t.batch_size,
    }
    return Task(
        cfg, table, train_ids, test_ids, leader_cols, follower_cols, names, specs, hparams,
        steps if steps is not None else planned_steps(cfg, len(train_ids)), uuid.uuid4().hex[:12],
    )


def proposal_for(task: Task, index: int, groups: int | str, tls: bool) -> dict[str, Any]:
    """The task as proposed to follower ``index`` (dataset, ids, its columns, its model part, ...)."""
    name = task.follower_names[index]
    d = task.cfg.data
    part = task.topology.part(name)
    return {
        "protocol": PROTOCOL,
        "task_id": task.task_id,
        "topology": task.topology.name,
        "follower": name,
        "followers": len(task.follower_names),
        "dataset": {
            "dataset": d.dataset,
            "n_samples": d.n_samples,
            "n_features": d.n_features,
            "n_informative": d.n_informative,
            "n_classes": d.n_classes,
            "scenario": d.scenario,
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


def eval_due(step: int, steps: int, eval_every: int) -> bool:
    """Evaluate after ``step`` every ``eval_every`` steps and after the last planned step."""
    if step == steps - 1:
        return True
    return eval_every > 0 and (step + 1) % eval_every == 0
