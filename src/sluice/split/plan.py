"""What the leader proposes to every follower: the agreed rows, the schedule, the hyper-parameters.

After the private set intersection (:mod:`sluice.psi`) the leader knows the ids every party holds; it draws
the train/test split on them (:func:`agree_rows`) and proposes one slice of the :class:`Plan` to each follower
(:func:`proposal_for`). The proposal names no task, dataset, column or model: each party trains its own task
on its own host (:mod:`sluice.tasks.split`), so the plan is the whole contract between parties (SPEC P7).
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from sluice.errors import DataError
from sluice.tasks.table import Table

from .config import SplitConfig
from .topology import Topology, topology

PROTOCOL = 3
"""Version 3: ``hello`` (the follower loads its own task) and the intersection of ids come before the
proposal, which carries the agreed ids and no task; ``steps`` in the proposal is a plan; the leader ends the
task with ``stop`` (at any step, even before the proposal) or extends it with ``extend``; a follower always
answers ``stop`` with ``bye``."""


@dataclass(frozen=True)
class Plan:
    """The task as the leader runs it: the agreed rows (in one order for every party) and the schedule."""

    topology: Topology
    follower_names: list[str]
    train_ids: list[str]
    test_ids: list[str]
    hparams: dict[str, Any]
    steps: int
    eval_every: int
    seed: int
    task_id: str


def planned_steps(cfg: SplitConfig, train_rows: int) -> int:
    """``train.steps``, else ``train.epochs`` epochs of ``ceil(train_rows / batch_size)`` steps."""
    t = cfg.train
    return t.steps if t.steps is not None else t.epochs * math.ceil(train_rows / t.batch_size)


def agree_rows(cfg: SplitConfig, table: Table, common: np.ndarray) -> tuple[list[str], list[str]]:
    """Train and test ids among the table positions ``common`` (ascending): the table's own test rows where
    it marks them, else a split of ``data.test_fraction`` seeded by the job's seed and stratified by the
    labels where every class has two rows; at most ``train.eval_samples`` test rows (a seeded choice)."""
    ids = table.ids[common]
    if table.test is not None:
        test = table.test[common]
        train_ids, test_ids = [str(i) for i in ids[~test]], [str(i) for i in ids[test]]
    else:
        from sklearn.model_selection import train_test_split

        y = table.y[common] if table.y is not None else None
        classes = y is not None and y.ndim == 1 and np.issubdtype(y.dtype, np.integer)
        stratified = classes and len(y) > 0 and np.unique(y, return_counts=True)[1].min() >= 2
        rows = np.arange(len(ids))
        try:
            try:
                tr, te = train_test_split(rows, test_size=cfg.data.test_fraction, random_state=cfg.seed,
                                          stratify=y if stratified else None)
            except ValueError:  # too few rows to stratify: a plain seeded split
                tr, te = train_test_split(rows, test_size=cfg.data.test_fraction, random_state=cfg.seed)
        except ValueError as exc:
            raise DataError(f"cannot hold out {cfg.data.test_fraction:g} of {len(ids)} aligned rows for testing: "
                            f"{exc}") from None
        train_ids, test_ids = [str(i) for i in ids[np.sort(tr)]], [str(i) for i in ids[np.sort(te)]]
    if not train_ids or not test_ids:
        raise DataError(f"the {len(ids)} aligned rows leave {len(train_ids)} for training and {len(test_ids)} for "
                        "testing; both need some")
    if len(test_ids) > cfg.train.eval_samples:
        rng = np.random.default_rng((cfg.seed, 104729))
        keep = np.sort(rng.choice(len(test_ids), cfg.train.eval_samples, replace=False))
        test_ids = [test_ids[i] for i in keep]
    return train_ids, test_ids


def make_plan(cfg: SplitConfig, train_ids: list[str], test_ids: list[str], steps: int | None = None) -> Plan:
    """The plan of ``cfg`` on the agreed rows, for ``steps`` steps (default: :func:`planned_steps`)."""
    t = cfg.train
    hparams = {"optimizer": t.optimizer, "lr": t.lr, "momentum": t.momentum, "weight_decay": t.weight_decay,
               "batch_size": t.batch_size}
    return Plan(topology(cfg.topology), [f"follower-{i + 1}" for i in range(cfg.followers)], train_ids, test_ids,
                hparams, steps if steps is not None else planned_steps(cfg, len(train_ids)), t.eval_every, cfg.seed,
                uuid.uuid4().hex[:12])


def hello_for(cfg: SplitConfig, name: str, in_shape: tuple[int, ...] | None = None,
              in_dtype: str | None = None) -> dict[str, Any]:
    """What a follower needs to load its own task and build its part: its name and part, the topology, the
    number of followers, the seed; in the U-shape the shape and dtype of one sample of what its middle part
    receives (the leader's bottom output)."""
    out = {"protocol": PROTOCOL, "follower": name, "part": topology(cfg.topology).part(name),
           "followers": cfg.followers, "topology": cfg.topology, "seed": cfg.seed}
    if in_shape is not None:
        out["in_shape"], out["in_dtype"] = list(in_shape), in_dtype
    return out


def proposal_for(plan: Plan, index: int, groups: int | str, tls: bool, *, allow_batch_coupled: bool) -> dict[str, Any]:
    """The plan as proposed to follower ``index``: the agreed ids, its part's name, the hyper-parameters, the
    steps."""
    name = plan.follower_names[index]
    out = {
        "protocol": PROTOCOL, "task_id": plan.task_id, "topology": plan.topology.name, "follower": name,
        "followers": len(plan.follower_names), "seed": plan.seed, "train_ids": plan.train_ids,
        "test_ids": plan.test_ids, "part": plan.topology.part(name), "allow_batch_coupled": allow_batch_coupled,
        "hparams": plan.hparams, "steps": plan.steps, "eval_every": plan.eval_every, "groups": groups, "tls": tls,
    }
    return out


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
