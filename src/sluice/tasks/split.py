"""A split (vertical) task: one party's share of the model and the rows it holds.

Every party of split training loads its own :class:`SplitTask` on its own host from its own ``[task]``
section (a built-in split task, or ``package.module:function`` with ``[task.args]``); no other party names
it. The leader's task holds the labels (its table's ``y``) and the top model, and a bottom model in the
topologies where the leader holds features (6, and the U-shape's first part A1 in 5); a follower's task holds
its bottom model and table (4A, 6) or the U-shape's middle part B (5, no table needed).

A factory gets, where its signature takes them and ``[task.args]`` does not give them, ``seed`` (the job's),
``party`` (``"leader"`` or the follower's name, ``"follower-1"``...), ``followers`` (how many) and
``topology`` (``"4A"``, ``"5"``, ``"6"``): one function may serve every party.

Models are factories ``() -> nn.Module``; Sluice seeds torch's generator from the job's seed and the part's
name before calling one (:func:`build_part`), so a part is the same in every process. A part's output may have
any shape ``(batch, ...)``: the top model receives the leader's and the followers' outputs concatenated along
dimension 1 (leader first, then ``follower-1``, ``follower-2``...), or the one output as it is. A ``loss``
must be the mean over the rows it is given, so that the groups of a batch add up to the batch's loss (SPEC
P5); by default cross-entropy for class ids and the mean squared error for float targets.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn

from sluice.errors import TaskError
from sluice.metrics import CLASSIFICATION, KNOWN, REGRESSION, MetricSpec, declare
from sluice.tasks.table import Table
from sluice.tasks.task import LossFn, MetricFn, OptimizerFactory, seeded_module

RowMetrics = Callable[[np.ndarray], Mapping[str, MetricFn]]
"""Metrics that need the table positions of the scored rows (a built-in scenario's type-specific errors)."""


@dataclass
class SplitTask:
    """One party's share of a split task (see the module docstring).

    * ``table``: the rows this party holds (:class:`~sluice.tasks.table.Table`; the leader's with labels).
    * ``bottom``: the part below the top: a bottom model (the leader's C1 or A1, a follower's D), or the
      U-shape's middle part B (a follower in topology 5).
    * ``top``: the leader's top model (C2, A2), fed the bottom outputs and scored by the loss.
    * ``loss``, ``optimizer`` (``(parameters, lr) -> Optimizer``; default: the job's ``train.optimizer``),
      ``metrics`` and ``metric_specs`` as in :class:`sluice.Task` (the leader's).
    * ``standardise``: centre and scale each feature with the train rows' statistics of this party's own table.
    """

    table: Table | None = None
    bottom: Callable[[], nn.Module] | None = None
    top: Callable[[], nn.Module] | None = None
    loss: LossFn | None = None
    optimizer: OptimizerFactory | None = None
    metrics: Mapping[str, MetricFn] = field(default_factory=dict)
    metric_specs: Sequence[MetricSpec] = ()
    name: str = "split-task"
    model_type: str | None = None
    standardise: bool = True
    row_metrics: RowMetrics | None = None

    @property
    def kind(self) -> Literal["classification", "regression"]:
        """Classification for integer labels, regression for float ones (the leader's table)."""
        if self.table is None or self.table.y is None:
            raise TaskError(f"task {self.name!r}: the leader's table needs a label column")
        return "classification" if np.issubdtype(self.table.y.dtype, np.integer) else "regression"

    @property
    def classes(self) -> int:
        """Classes of a classification task: the names the table gives, else the largest label + 1."""
        assert self.table is not None and self.table.y is not None
        return max(len(self.table.classes), int(self.table.y.max()) + 1 if len(self.table.y) else 0)

    def metric_fns(self, rows: np.ndarray) -> dict[str, MetricFn]:
        """The task's own metrics, and those of ``row_metrics`` for the table positions ``rows`` scored."""
        out = dict(self.metrics)
        if self.row_metrics is not None:
            out.update(self.row_metrics(rows))
        return out

    def declared_metrics(self, rows: np.ndarray, extra: Sequence[MetricSpec] = ()) -> dict[str, MetricSpec]:
        """What the leader reports when it scores the table positions ``rows``: ``train_loss`` (and
        ``train_accuracy``), the test metrics of the task's kind (with ``test_auc`` for classification), its
        own metrics and ``extra``."""
        base = ("train_loss", "train_accuracy", *CLASSIFICATION, "test_auc") if self.kind == "classification" \
            else ("train_loss", *REGRESSION)
        own = {s.name: s for s in self.metric_specs}
        names = list(self.metric_fns(rows))
        missing = sorted(n for n in names if n not in own and n not in KNOWN)
        if missing:
            raise TaskError(f"task {self.name!r}: metrics {missing} need a MetricSpec in metric_specs")
        return declare(base, [*(own.get(n) or KNOWN[n] for n in names), *extra])


def part_seed(seed: int, part: str) -> int:
    """Seed of one part: a stable function of the job's seed and the part's name."""
    return (seed * 1_000_003 + zlib.crc32(part.encode())) % (2**63)


def build_part(task: SplitTask, which: Literal["bottom", "top"], seed: int, part: str) -> nn.Module:
    """``task.bottom()`` or ``task.top()`` with torch's generator seeded by (``seed``, ``part``) (restored
    afterwards); :class:`TaskError` when the task has none, the factory fails or returns no module with
    trainable parameters."""
    factory = getattr(task, which)
    if factory is None:
        raise TaskError(f"task {task.name!r} has no {which} model, which {part} needs")
    return seeded_module(factory, part_seed(seed, part), task.name, f"{which} model ({part})")


def fit_shapes(top: nn.Module, shapes: Sequence[tuple[str, tuple[int, ...]]], dtype: torch.dtype) -> None:
    """:class:`TaskError` naming every shape when the top model cannot take the bottom outputs of
    ``shapes`` (``(who, per-sample shape)``, in the order the top receives them) concatenated on dimension 1."""
    named = ", ".join(f"{who} {tuple(s)}" for who, s in shapes)
    try:
        xs = [torch.zeros((2, *s), dtype=dtype) for _, s in shapes]
        with torch.no_grad():
            top.eval()
            top(torch.cat(xs, dim=1) if len(xs) > 1 else xs[0])
    except Exception as exc:  # the user's model: any failure is a misfit
        raise TaskError(f"the top model cannot take the bottom models' outputs ({named} per sample"
                        + (", concatenated on dimension 1" if len(shapes) > 1 else "")
                        + f"): {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    finally:
        top.train()
