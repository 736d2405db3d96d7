"""User-like tasks for :mod:`hfl_user_tasks`: models, optimizers and data a user would bring, none a built-in.

Each entry of :data:`TASKS` builds a :class:`sluice.Task` (10 clients) and says what it covers. The data are
generated here from fixed seeds (sequences whose class is a frequency, documents whose class is a topic,
Friedman's regression) or are scikit-learn's digits, so every run is reproducible without downloads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import TensorDataset

import sluice

CLIENTS = 10


@dataclass(frozen=True)
class UserTask:
    """A task of the suite: how to build it, the learning rate its optimizer is run with, and what it covers."""

    build: Callable[[], sluice.Task]
    lr: float
    optimizer: str
    covers: str


# ------------------------------------------------------------------------------------------ data
def _sequences(n: int, seed: int, length: int = 12, features: int = 4) -> TensorDataset:
    """Class c in 0..3: feature 0 carries a sine of c + 1 periods over the sequence, at a random phase, in noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    t = torch.arange(length, dtype=torch.float32)
    phase = torch.rand(n, 1, generator=g) * 2 * math.pi
    x = torch.randn(n, length, features, generator=g) * 0.5
    x[:, :, 0] += torch.sin(2 * math.pi * (1 + y[:, None]) * t[None] / length + phase)
    return TensorDataset(x, y)


def _trends(n: int, seed: int, length: int = 12, features: int = 4) -> TensorDataset:
    """Class c in 0..3: feature 0 rises or falls over the sequence with slope −1.5, −0.5, 0.5 or 1.5, in noise;
    the mean of the sequence says nothing of the class."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    t = torch.linspace(-1, 1, length)
    x = torch.randn(n, length, features, generator=g) * 0.5
    x[:, :, 0] += (y[:, None].float() - 1.5) * t[None]
    return TensorDataset(x, y)


def _documents(n: int, seed: int, vocab: int, length: int = 24, classes: int = 4) -> TensorDataset:
    """Bags of ``length`` token ids: a third drawn from the class's 100 topic words, the rest from the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    topics = torch.randperm(vocab, generator=torch.Generator().manual_seed(99))[: 100 * classes].reshape(classes, 100)
    y = torch.randint(0, classes, (n,), generator=g)
    tokens = torch.randint(0, vocab, (n, length), generator=g)
    own = torch.rand(n, length, generator=g) < 1 / 3
    picks = topics[y[:, None].expand(n, length), torch.randint(0, 100, (n, length), generator=g)]
    return TensorDataset(torch.where(own, picks, tokens), y)


def _friedman(n: int, seed: int) -> TensorDataset:
    """Friedman's first regression problem (10 features, 5 of them used) with unit noise, targets scaled."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 10, generator=g)
    y = (10 * torch.sin(math.pi * x[:, 0] * x[:, 1]) + 20 * (x[:, 2] - 0.5) ** 2 + 10 * x[:, 3] + 5 * x[:, 4]
         + torch.randn(n, generator=g))
    return TensorDataset(x, (y - 14.4) / 5.0)


def _blobs(n: int, seed: int, features: int = 64, classes: int = 10) -> TensorDataset:
    """Gaussian classes around fixed random centres, overlapping enough that the model has to learn."""
    centres = torch.randn(classes, features, generator=torch.Generator().manual_seed(7)) * 0.6
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    return TensorDataset(centres[y] + torch.randn(n, features, generator=g), y)


def _digits() -> tuple[TensorDataset, TensorDataset]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    images = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    data = TensorDataset(images[order], torch.tensor(y)[order])
    cut = int(0.8 * len(y))
    return (TensorDataset(*(t[:cut] for t in data.tensors)), TensorDataset(*(t[cut:] for t in data.tensors)))


# ------------------------------------------------------------------------------------------ models
class GRUNorm(nn.Module):
    """GRU over the sequence, BatchNorm on its last state, a linear head (1,156 parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.gru, self.norm, self.head = nn.GRU(4, 16, batch_first=True), nn.BatchNorm1d(16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.gru(x)[1][-1]))


class LSTMHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = nn.LSTM(4, 24, batch_first=True), nn.Linear(24, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0][:, -1])


class Attention(nn.Module):
    """One transformer encoder layer (self-attention, LayerNorm) over embedded steps, mean-pooled."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Linear(4, width)
        self.position = nn.Parameter(torch.zeros(12, width))
        self.encoder = nn.TransformerEncoderLayer(width, 4, 64, dropout=0.0, batch_first=True)
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x) + self.position).mean(dim=1))


class Bag(nn.Module):
    """Mean of token embeddings (20,000 × 64), a linear head: 1.28 M parameters, nearly all in the table."""

    def __init__(self, vocab: int = 20_000) -> None:
        super().__init__()
        self.embed, self.head = nn.EmbeddingBag(vocab, 64, mode="mean"), nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


def _cnn_bn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.Flatten(),
                         nn.Linear(32 * 4 * 4, 10))


def _mlp_ln(inputs: int, hidden: tuple[int, ...], outputs: int) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        layers: list[nn.Module] = []
        for i, h in enumerate(hidden):
            layers += [nn.Linear(hidden[i - 1] if i else inputs, h), nn.LayerNorm(h), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(hidden[-1], outputs))
    return build


def _wide_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 384), nn.ReLU(), nn.Linear(384, 256), nn.ReLU(),
                         nn.Linear(256, 10))


# ------------------------------------------------------------------------------------------ tasks
def _adam(params, lr):
    return torch.optim.Adam(params, lr=lr)


def _adamw(params, lr):
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.01)


def _momentum(params, lr):
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def _iid() -> sluice.Partition:
    return sluice.Partition(method="iid", num_clients=CLIENTS)


def _dirichlet(alpha: float) -> sluice.Partition:
    return sluice.Partition(method="dirichlet", num_clients=CLIENTS, alpha=alpha)


def gru_bn_adam() -> sluice.Task:
    return sluice.Task(model=GRUNorm, train=_sequences(1500, 1), test=_sequences(500, 2), optimizer=_adam,
                       partition=_iid(), name="gru-bn-adam")


def lstm_momentum() -> sluice.Task:
    return sluice.Task(model=LSTMHead, train=_trends(1500, 3), test=_trends(500, 4), optimizer=_momentum,
                       partition=_dirichlet(0.5), name="lstm-momentum")


def attention_adamw() -> sluice.Task:
    return sluice.Task(model=Attention, train=_trends(1500, 5), test=_trends(500, 6), optimizer=_adamw,
                       partition=_iid(), name="attention-adamw")


def cnn_bn_sgd() -> sluice.Task:
    train, test = _digits()
    return sluice.Task(model=_cnn_bn, train=train, test=test, partition=_dirichlet(0.3), name="cnn-bn-sgd")


def embedding_adam() -> sluice.Task:
    return sluice.Task(model=Bag, train=_documents(3000, 7, 20_000), test=_documents(1000, 8, 20_000),
                       optimizer=_adam, partition=_dirichlet(0.5), name="embedding-adam")


def regression_ln_sgd() -> sluice.Task:
    return sluice.Task(model=_mlp_ln(10, (64, 64), 1), train=_friedman(2000, 9), test=_friedman(500, 10),
                       partition=_iid(), name="regression-ln-sgd")


def wide_mlp_adam() -> sluice.Task:
    train, test = _digits()
    return sluice.Task(model=_wide_mlp, train=train, test=test, optimizer=_adam, partition=_iid(),
                       name="wide-mlp-adam")


def mlp_ln_momentum() -> sluice.Task:
    return sluice.Task(model=_mlp_ln(64, (512, 256), 10), train=_blobs(3000, 11), test=_blobs(1000, 12),
                       optimizer=_momentum, partition=_dirichlet(0.3), name="mlp-ln-momentum")


TASKS: dict[str, UserTask] = {
    "gru-bn-adam": UserTask(gru_bn_adam, 0.01, "Adam", "GRU + BatchNorm, 1.2 k parameters, IID"),
    "lstm-momentum": UserTask(lstm_momentum, 0.05, "SGD, momentum 0.9", "LSTM, 3 k parameters, Dirichlet 0.5"),
    "attention-adamw": UserTask(attention_adamw, 0.003, "AdamW", "self-attention + LayerNorm, 9 k parameters, IID"),
    "cnn-bn-sgd": UserTask(cnn_bn_sgd, 0.05, "SGD", "CNN + BatchNorm on digits, 10 k parameters, Dirichlet 0.3"),
    "embedding-adam": UserTask(embedding_adam, 0.01, "Adam", "embedding bag, 1.28 M parameters, Dirichlet 0.5"),
    "regression-ln-sgd": UserTask(regression_ln_sgd, 0.05, "SGD", "regression MLP + LayerNorm, 5 k parameters, IID"),
    "wide-mlp-adam": UserTask(wide_mlp_adam, 0.001, "Adam", "MLP on digits, 126 k parameters, IID"),
    "mlp-ln-momentum": UserTask(mlp_ln_momentum, 0.01, "SGD, momentum 0.9",
                                "MLP + LayerNorm, 166 k parameters, Dirichlet 0.3"),
}
