"""Split tasks of a user's own, for the tests: digits scans shared out by pixel columns, with convolutional and
recurrent parts whose activations are not 2-D. Named ``split_user_tasks:<function>`` in a job's ``[task]``."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from sluice import SplitTask, Table
from sluice.data.datasets import raw_dataset


def _scans(columns: range) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    X, y = raw_dataset("digits")
    ids = np.array([f"scan-{i:05d}" for i in range(len(y))])
    return ids, X.reshape(-1, 8, 8)[:, :, list(columns)].reshape(len(y), 8 * len(columns)), y.astype(np.int64)


class ColumnConv(nn.Module):
    """A 3x3 convolution over 8 rows x ``width`` pixel columns, pooled to (batch, 4, 8, 2): a 4-D activation."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
        self.conv = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Tanh(), nn.AdaptiveAvgPool2d((8, 2)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.reshape(-1, 1, 8, self.width))


class ConvTop(nn.Module):
    """Takes the bottoms' feature maps concatenated on the channel dimension."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.head = nn.Sequential(nn.Conv2d(channels, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                                  nn.Flatten(), nn.Linear(24, 10))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h)


def conv(party: str, followers: int, topology: str) -> SplitTask:
    """Topologies 4A and 6: each follower a block of the right half's pixel columns, the leader the left half
    (6) or only the labels (4A); every bottom a convolution, the top a convolution over their maps."""
    first = 4 if topology == "6" else 0
    blocks = [range(first + (8 - first) * k // followers, first + (8 - first) * (k + 1) // followers)
              for k in range(followers)]
    if party == "leader":
        ids, X, y = _scans(range(0, 4) if topology == "6" else range(0))
        bottoms = followers + (topology == "6")
        return SplitTask(table=Table(ids, X, y), name="conv",
                         bottom=(lambda: ColumnConv(4).double()) if topology == "6" else None,
                         top=lambda: ConvTop(4 * bottoms).double())
    k = int(party.split("-")[1]) - 1
    ids, X, _ = _scans(blocks[k])
    return SplitTask(table=Table(ids, X), name="conv", bottom=lambda: ColumnConv(len(blocks[k])).double())


class RowEncoder(nn.Module):
    """A1 of the U-shape: each of the 8 rows of a scan encoded alone; sends (batch, 8, 12), a sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = nn.Sequential(nn.Linear(8, 12), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rows(x.reshape(-1, 8, 8))


class RowGRU(nn.Module):
    """B of the U-shape: a GRU over the row sequence; sends its whole output sequence (batch, 8, 10)."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(12, 10, batch_first=True)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.gru(h)[0]


def recurrent(party: str) -> SplitTask:
    """Topology 5 (U-shape): the leader holds the scans and the labels, the follower the recurrent middle."""
    if party != "leader":
        return SplitTask(name="recurrent", bottom=lambda: RowGRU().double())
    ids, X, y = _scans(range(8))
    return SplitTask(table=Table(ids, X, y), name="recurrent", bottom=lambda: RowEncoder().double(),
                     top=lambda: nn.Sequential(nn.Flatten(), nn.Linear(80, 10)).double(),
                     optimizer=lambda params, lr: torch.optim.Adam(params, lr=lr))
