"""How a job's task is built (:func:`load_task`; a split party's: :func:`load_split_task`) and split among
clients (:func:`client_datasets`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from sluice.errors import DataError, TaskError
from sluice.tasks.config import SPLIT_BUILTIN_NAMES, TaskConfig, call_factory, import_factory
from sluice.tasks.split import SplitTask
from sluice.tasks.task import Task, extend, take, targets_of

_TABULAR_KEYS = ("test_fraction", "synthetic_alpha", "synthetic_beta", "num_clients", "scenario")


def load_task(task: TaskConfig, *, seed: int, data: Any = None, hidden: list[int] | None = None,
              node_args: dict[str, Any] | None = None) -> Task:
    """The task a job describes. A built-in MLP task takes its dataset settings from ``data`` (a ``[data]``
    section) and its layers from ``hidden``; ``node_args`` (a Flower node's own settings) update
    ``[task.args]``."""
    from sluice.tasks.builtin import BUILTIN, TABULAR, tabular

    args = {**task.args, **(node_args or {})}
    if task.factory is not None:
        return call_factory(import_factory(task.factory), task.factory, args, seed)
    name = task.name or getattr(data, "dataset", None) or "digits"
    if name in BUILTIN:
        return call_factory(BUILTIN[name], name, args, seed)
    if name not in TABULAR:
        raise TaskError(f"unknown built-in task {name!r}; built-in: {', '.join((*TABULAR, *BUILTIN))}")
    defaults = {k: getattr(data, k) for k in _TABULAR_KEYS if hasattr(data, k)}
    if hidden is not None:
        defaults["hidden"] = list(hidden)
    return call_factory(tabular, name, {"dataset": name, **defaults, **args}, seed)


def client_datasets(task: Task, data: Any = None, *, seed: int = 0) -> list[Dataset]:
    """One training dataset per client: the task's own list, or its one dataset partitioned (seeded by
    ``seed``). A ``[data]`` section's ``num_clients`` must equal the length of a task's own list."""
    from sluice.data import partition

    given = getattr(data, "num_clients", None)
    if task.per_client:
        clients = list(task.train)
        if given is not None and given != len(clients):
            raise TaskError(f"data.num_clients = {given}, but task {task.name!r} brings {len(clients)} clients' "
                            f"datasets; set data.num_clients = {len(clients)} or leave it out")
        return clients
    p = task.partition
    method = getattr(data, "partition", None) or p.method
    alpha = getattr(data, "alpha", None) or p.alpha
    shards = getattr(data, "shards_per_client", None) or p.shards_per_client
    try:
        parts = partition(targets_of(task.train), given or p.num_clients, method, alpha=alpha,
                          shards_per_client=shards, seed=seed)
    except DataError as exc:
        raise TaskError(f"task {task.name!r}: {exc}") from None
    return [take(task.train, idx) for idx in parts]


def load_split_task(section: TaskConfig, *, seed: int, party: str, followers: int, topology: str,
                    builtin_args: dict[str, Any]) -> SplitTask:
    """The task a party's ``[task]`` section names: a factory (imported here) or a built-in split task, whose
    defaults are ``builtin_args`` (the job's ``[data]`` and ``[model]`` settings), under ``[task.args]``."""
    from sluice.tasks.split_builtin import builtin_split

    context = {"party": party, "followers": followers, "topology": topology}
    if section.factory is not None:
        return call_factory(import_factory(section.factory), section.factory, section.args, seed, context,
                            SplitTask)
    name = section.name or builtin_args.get("dataset") or "breast_cancer"
    if name not in SPLIT_BUILTIN_NAMES:
        raise TaskError(f"unknown built-in split task {name!r}; built-in: {', '.join(SPLIT_BUILTIN_NAMES)}")
    args = {**builtin_args, **section.args, "dataset": name}
    return call_factory(builtin_split, name, args, seed, context, SplitTask)


@dataclass
class Federation:
    """A task as a federation trains it: the task and one training dataset per client, with the samples each
    client holds now (:meth:`limit` and :meth:`add` change them; :meth:`tree` / :meth:`from_tree` save them
    as how many of its own samples each client keeps and the arrays added to it)."""

    task: Task
    base: list[Dataset]
    keep: list[int] = field(default_factory=list)
    added: list[tuple[np.ndarray, np.ndarray] | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.keep = self.keep or [len(ds) for ds in self.base]
        self.added = self.added or [None] * len(self.base)
        self.clients = [self._dataset(c) for c in range(len(self.base))]

    def _dataset(self, c: int) -> Dataset:
        ds = self.base[c] if self.keep[c] == len(self.base[c]) else take(self.base[c], range(self.keep[c]))
        return ds if self.added[c] is None else extend(ds, *self.added[c])

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def model_type(self) -> str | None:
        return self.task.model_type

    @property
    def metric_fns(self) -> dict[str, Any]:
        return dict(self.task.metrics)

    @property
    def sizes(self) -> list[int]:
        """Training samples of each client."""
        return [len(ds) for ds in self.clients]

    def limit(self, keep: list[int]) -> None:
        """Client ``c`` keeps only its first ``keep[c]`` samples (its own first, then those added)."""
        for c, k in enumerate(keep):
            own = min(k, self.keep[c])
            extra = self.added[c]
            self.added[c] = None if extra is None or k <= own else (extra[0][: k - own], extra[1][: k - own])
            self.keep[c] = own
            self.clients[c] = self._dataset(c)

    def add(self, c: int, X: np.ndarray, y: np.ndarray) -> None:
        """Append samples ``(X, y)`` to client ``c``."""
        old = self.added[c]
        self.added[c] = (X, y) if old is None else (np.concatenate([old[0], X]), np.concatenate([old[1], y]))
        self.clients[c] = self._dataset(c)

    def tree(self) -> dict[str, Any]:
        return {"keep": list(self.keep), "added": [None if a is None else list(a) for a in self.added]}

    def restored(self, tree: dict[str, Any]) -> Federation:
        """This federation with the samples of :meth:`tree`."""
        keep, added = list(tree["keep"]), list(tree["added"])
        if len(keep) != len(self.base) or len(added) != len(self.base):
            raise TaskError(f"the saved samples are of {len(keep)} clients, this federation has {len(self.base)}")
        if any(not 0 <= k <= len(ds) for k, ds in zip(keep, self.base, strict=True)):
            raise TaskError("the saved sample counts do not fit this task's datasets")
        return Federation(self.task, self.base, [int(k) for k in keep],
                          [None if a is None else (a[0], a[1]) for a in added])
