"""A vertical task of one's own: each party reads its own table and builds its own convolutional bottom model.

Every party calls ``vertical`` on its own host with its own name (Sluice passes ``party``): the leader gets its
table (with the label column), a bottom model and the top model; a follower its table and its bottom model.
A bottom model sees the scan columns its party holds as an 8-row image and sends 16 numbers per subject; the
top model classifies the digits from the bottom outputs of every party.

    [task]
    factory = "task:vertical"   # run with PYTHONPATH=examples/vertical
    [task.args]
    tables = "tables"           # this party's table: tables/<party>.csv
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from sluice import SplitTask, read_table


class HalfScan(nn.Module):
    """Two 3x3 convolutions over the pixel columns a party holds (8 rows x ``width``), pooled to 16 numbers."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
        self.conv = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x.reshape(-1, 1, 8, self.width))
        return h.mean(dim=(2, 3))


def vertical(party: str, tables: str = "tables", followers: int = 1) -> SplitTask:
    """``party``'s share: its table ``tables/<party>.csv``, its bottom model and, for the leader, the top."""
    table = read_table(Path(tables) / f"{party}.csv", label_column="label" if party == "leader" else None)
    width = table.X.shape[1] // 8

    def top() -> nn.Module:
        return nn.Sequential(nn.Linear(16 * (followers + 1), 32), nn.ReLU(), nn.Linear(32, 10))

    return SplitTask(table=table, bottom=lambda: HalfScan(width), top=top if party == "leader" else None,
                     name="digits-halves")
