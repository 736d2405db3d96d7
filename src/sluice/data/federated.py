"""Build the per-client training sets of a federated task from the ``[data]`` configuration section.

A network-analytics scenario (:mod:`sluice.data.scenarios`) gives one client per party of the scenario
(``ScenarioData.party``), its train rows standardised with the train rows' statistics
(:meth:`ScenarioData.scaled`) and its held-out rows as the test set; its type-specific errors are metric
functions on the test rows that undo the scaling first (:func:`scaled_metric_fns`). Classification
scenarios give class ids as labels; regression scenarios float targets ``(n, k)`` (the model has ``k``
outputs, and clients minimise the mean squared error).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from sluice.data.config import DEFAULT_CLIENTS
from sluice.data.datasets import load_dataset
from sluice.data.partition import partition
from sluice.data.synthetic import synthetic
from sluice.errors import ConfigError, DataError
from sluice.metrics import (
    KNOWN,
    MetricSpec,
)

if TYPE_CHECKING:

    from sluice.data.config import DataConfig
    from sluice.data.scenarios import ScenarioData

MetricFn = Callable[[np.ndarray, np.ndarray], float]


@dataclass
class FederatedData:
    """Client train sets and one pooled test set.

    ``clients[k] = (X_k, y_k)`` with ``X_k`` float32 ``(n_k, num_features)`` and, for classification,
    ``y_k`` int64 ``(n_k,)``; for regression ``y_k`` float32 ``(n_k, num_classes)``: ``num_classes`` is the
    model's output width (classes, or regression targets). A scenario adds its ``model_type``, its
    ``target_names``, the metric functions ``f(outputs, y_test)`` of its type-specific errors with their
    specs, and ``scaling`` = ``(x_mean, x_std, y_mean, y_std)`` that maps natural units to the model's
    space (added data is standardised with it).
    """

    name: str
    clients: list[tuple[np.ndarray, np.ndarray]]
    X_test: np.ndarray
    y_test: np.ndarray
    num_features: int
    num_classes: int
    task: Literal["classification", "regression"] = "classification"
    target_names: tuple[str, ...] = ()
    model_type: str | None = None
    metric_fns: dict[str, MetricFn] = field(default_factory=dict)
    metric_specs: tuple[MetricSpec, ...] = ()
    scaling: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def sizes(self) -> list[int]:
        """Number of train samples of each client, ``n_k``."""
        return [len(y) for _, y in self.clients]

    def label_histogram(self) -> np.ndarray:
        """``(num_clients, num_classes)`` int64 matrix of train label counts per client (classification)."""
        if self.task != "classification":
            raise DataError(f"{self.name} is a regression task: its targets have no label histogram")
        return np.stack([np.bincount(y, minlength=self.num_classes) for _, y in self.clients])

    def summary(self) -> str:
        """A short human-readable description: client count, size spread and test size."""
        s = np.asarray(self.sizes)
        out = ", ".join(self.target_names) if self.task == "regression" else f"{self.num_classes} classes"
        return (
            f"{self.name}: {len(s)} clients, {int(s.sum())} train samples "
            f"(per client min {int(s.min())}, median {float(np.median(s)):g}, max {int(s.max())}), "
            f"{len(self.y_test)} test samples, {self.num_features} features, {out}"
        )

    def to_model_space(self, X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows given in natural units as the model takes them (standardised with :attr:`scaling`; as they
        are when there is none)."""
        if self.scaling is None:
            return X, y
        xm, xs, ym, ys = self.scaling
        X = ((X - xm) / xs).astype(np.float32)
        if self.task == "regression":
            y = ((y.reshape(-1, len(ym)) - ym) / ys).astype(np.float32)
        return X, y


def scenario_federated(data: ScenarioData, num_clients: int | None = None) -> FederatedData:
    """One client per party of scenario ``data``: its train rows, standardised; the held-out rows pooled
    as the test set, with the scenario's type-specific errors as metric functions on them.

    ``num_clients``, when given, must equal the number of parties (:class:`ConfigError` otherwise); a
    party without train rows is a :class:`DataError`.
    """
    from sluice.data import scenarios

    parties = data.num_parties
    if num_clients is not None and num_clients != parties:
        raise ConfigError(f"data.num_clients = {num_clients}, but scenario {data.name} as configured has "
                          f"{parties} parties (one client each); set data.num_clients = {parties} or leave it out")
    X, y = data.scaled()
    train = ~data.test
    clients = []
    for k in range(parties):
        rows = train & (data.party == k)
        if not rows.any():
            raise DataError(f"scenario {data.name}: party {k} holds no training rows")
        clients.append((X[rows], y[rows]))
    test_rows = np.flatnonzero(data.test)
    if test_rows.size == 0:
        raise DataError(f"scenario {data.name} holds no test rows")
    spec = scenarios.get_spec(data.name)
    fns = scenarios.scaled_metric_fns(data, test_rows, spec)
    classes = int(data.y.max()) + 1 if data.task == "classification" else 0
    num_classes = max(classes, len(data.target_names)) if data.task == "classification" else (
        1 if y.ndim == 1 else int(y.shape[1]))
    return FederatedData(
        name=data.name, clients=clients, X_test=X[test_rows], y_test=y[test_rows],
        num_features=int(X.shape[1]), num_classes=num_classes, task=data.task,
        target_names=tuple(data.target_names), model_type=data.model_type,
        metric_fns=fns, metric_specs=specs_of(fns, spec.metric_specs),
        scaling=data.scaling(),
    )


def specs_of(fns: dict[str, MetricFn], declared: tuple[MetricSpec, ...]) -> tuple[MetricSpec, ...]:
    """The spec of each metric function: its scenario's declaration, else Sluice's (:data:`KNOWN`);
    :class:`ConfigError` for a function neither declares."""
    own = {s.name: s for s in declared}
    missing = sorted(n for n in fns if n not in own and n not in KNOWN)
    if missing:
        raise ConfigError(f"metric functions {missing} have no MetricSpec (whether higher is better, the range)")
    return tuple(own.get(n) or KNOWN[n] for n in fns)


def load_federated(cfg: DataConfig, seed: int) -> FederatedData:
    """Load ``cfg.dataset`` and split its train part among ``cfg.num_clients`` clients.

    A scenario is generated from ``cfg.scenario`` and ``seed`` (or read from the cache) and split by its
    parties (:func:`scenario_federated`).

    For the embedded datasets the train/test split uses ``cfg.test_fraction`` and the partition uses
    ``cfg.partition`` (with ``cfg.alpha`` or ``cfg.shards_per_client``); both are seeded by ``seed``.
    For ``synthetic`` the clients are generated with Synthetic(``cfg.synthetic_alpha``,
    ``cfg.synthetic_beta``) and ``cfg.partition`` is ignored: the split is inherent to the generator.
    Raises :class:`sluice.errors.DataError` when the data cannot be built as configured.
    """
    if cfg.is_scenario:
        from sluice.data.scenarios import load_scenario

        return scenario_federated(load_scenario(cfg.dataset, cfg.scenario, seed), cfg.num_clients)
    num_clients = cfg.num_clients or DEFAULT_CLIENTS
    if cfg.dataset == "synthetic":
        clients, X_test, y_test = synthetic(
            cfg.synthetic_alpha,
            cfg.synthetic_beta,
            num_clients,
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
        num_clients,
        cfg.partition or "dirichlet",
        alpha=cfg.alpha or 0.3,
        shards_per_client=cfg.shards_per_client or 2,
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
