"""Build the per-client training sets of a federated task from the ``[data]`` configuration section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sluice.data.datasets import load_dataset
from sluice.data.partition import partition
from sluice.data.synthetic import synthetic

if TYPE_CHECKING:
    from sluice.data.config import DataConfig


@dataclass
class FederatedData:
    """Client train sets and one pooled test set.

    ``clients[k] = (X_k, y_k)`` with ``X_k`` float32 ``(n_k, num_features)`` and ``y_k`` int64 ``(n_k,)``.
    """

    name: str
    clients: list[tuple[np.ndarray, np.ndarray]]
    X_test: np.ndarray
    y_test: np.ndarray
    num_features: int
    num_classes: int

    @property
    def sizes(self) -> list[int]:
        """Number of train samples of each client, ``n_k``."""
        return [len(y) for _, y in self.clients]

    def label_histogram(self) -> np.ndarray:
        """``(num_clients, num_classes)`` int64 matrix of train label counts per client."""
        return np.stack([np.bincount(y, minlength=self.num_classes) for _, y in self.clients])

    def summary(self) -> str:
        """A short human-readable description: client count, size spread and test size."""
        s = np.asarray(self.sizes)
        return (
            f"{self.name}: {len(s)} clients, {int(s.sum())} train samples "
            f"(per client min {int(s.min())}, median {float(np.median(s)):g}, max {int(s.max())}), "
            f"{len(self.y_test)} test samples, {self.num_features} features, {self.num_classes} classes"
        )


def load_federated(cfg: DataConfig, seed: int) -> FederatedData:
    """Load ``cfg.dataset`` and split its train part among ``cfg.num_clients`` clients.

    For the embedded datasets the train/test split uses ``cfg.test_fraction`` and the partition uses
    ``cfg.partition`` (with ``cfg.alpha`` or ``cfg.shards_per_client``); both are seeded by ``seed``.
    For ``synthetic`` the clients are generated with Synthetic(``cfg.synthetic_alpha``,
    ``cfg.synthetic_beta``) and ``cfg.partition`` is ignored: the split is inherent to the generator.
    Raises :class:`sluice.errors.DataError` when the data cannot be built as configured.
    """
    if cfg.dataset == "synthetic":
        clients, X_test, y_test = synthetic(
            cfg.synthetic_alpha,
            cfg.synthetic_beta,
            cfg.num_clients,
            seed=seed,
            test_fraction=cfg.test_fraction,
        )
        num_classes = 10
        return FederatedData(
            name=f"synthetic({cfg.synthetic_alpha:g},{cfg.synthetic_beta:g})",
            clients=clients,
            X_test=X_test,
            y_test=y_test,
            num_features=int(X_test.shape[1]),
            num_classes=num_classes,
        )
    ds = load_dataset(cfg.dataset, seed=seed, test_fraction=cfg.test_fraction)
    parts = partition(
        ds.y_train,
        cfg.num_clients,
        cfg.partition,
        alpha=cfg.alpha,
        shards_per_client=cfg.shards_per_client,
        seed=seed,
    )
    return FederatedData(
        name=ds.name,
        clients=[(ds.X_train[idx], ds.y_train[idx]) for idx in parts],
        X_test=ds.X_test,
        y_test=ds.y_test,
        num_features=ds.num_features,
        num_classes=ds.num_classes,
    )
