"""A party's rows as tensors: the rows of the agreed ids from its own table, in the agreed order.

Each party standardises its own features with the statistics of its own train rows (a per-feature operation,
so it needs nothing from the other parties), unless its task says its features are ready as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sluice.tasks.split import SplitTask
from sluice.tasks.table import standardise


@dataclass
class PartyData:
    """One party's features of the train and test rows, and (the leader's) their labels."""

    X_train: torch.Tensor
    X_test: torch.Tensor
    test_rows: np.ndarray
    y_train: np.ndarray | None = None
    y_test: np.ndarray | None = None


def party_data(task: SplitTask, train_ids: list[str], test_ids: list[str], dtype: torch.dtype,
               with_labels: bool) -> PartyData:
    """The rows ``train_ids`` and ``test_ids`` of the task's table (:class:`~sluice.errors.DataError` naming ids
    it does not hold); ``test_rows`` are their positions in the table."""
    table = task.table
    assert table is not None
    tr, te = table.rows(train_ids), table.rows(test_ids)
    Xtr, Xte = table.X[tr], table.X[te]
    if task.standardise and Xtr.size:
        Xtr, Xte = standardise(Xtr, Xte)

    def tensor(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).to(dtype)

    y = table.y if with_labels else None
    return PartyData(tensor(Xtr), tensor(Xte), te, None if y is None else y[tr], None if y is None else y[te])
