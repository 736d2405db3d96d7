"""Plain centralised training (one party, all data in one place)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice._lazy import lazy_exports

if TYPE_CHECKING:
    from sluice.local.config import LocalConfig
    from sluice.local.trainer import LocalTrainer

__all__ = ["LocalTrainer", "engine_from_config"]

_LAZY = {"LocalTrainer": "trainer"}

__getattr__ = lazy_exports(__name__, _LAZY)


def engine_from_config(cfg: LocalConfig) -> LocalTrainer:
    """The trainer a ``sluice local`` configuration describes (a scenario: its pooled train rows)."""
    from sluice.data import load_dataset
    from sluice.data.scenarios import SCENARIO_NAMES
    from sluice.local.trainer import LocalTrainer

    if cfg.data.dataset in SCENARIO_NAMES:
        return _scenario_trainer(cfg)
    ds = load_dataset(cfg.data.dataset, seed=cfg.seed, test_fraction=cfg.data.test_fraction)
    n = cfg.data.max_train_samples or len(ds.y_train)
    return LocalTrainer(ds.X_train[:n], ds.y_train[:n], ds.X_test, ds.y_test, num_classes=ds.num_classes,
                        hidden=cfg.model.hidden, lr=cfg.train.lr, momentum=cfg.train.momentum,
                        batch_size=cfg.train.batch_size, min_samples=cfg.train.min_samples, seed=cfg.seed,
                        default_iterations=cfg.train.iterations)


def _scenario_trainer(cfg: LocalConfig) -> LocalTrainer:
    """The centralised model of a scenario: every party's train rows pooled (standardised), the
    scenario's test rows and type-specific errors."""
    import numpy as np

    from sluice.data.config import DataConfig
    from sluice.data.federated import load_federated
    from sluice.local.trainer import LocalTrainer

    fed = load_federated(DataConfig(dataset=cfg.data.dataset, scenario=cfg.data.scenario), seed=cfg.seed)
    X = np.concatenate([X for X, _ in fed.clients])
    y = np.concatenate([y for _, y in fed.clients])
    n = cfg.data.max_train_samples or len(y)
    return LocalTrainer(X[:n], y[:n], fed.X_test, fed.y_test, task=fed.task,
                        num_classes=fed.num_classes if fed.task == "classification" else None,
                        hidden=cfg.model.hidden, lr=cfg.train.lr, momentum=cfg.train.momentum,
                        batch_size=cfg.train.batch_size, min_samples=cfg.train.min_samples, seed=cfg.seed,
                        default_iterations=cfg.train.iterations, metric_fns=fed.metric_fns,
                        metric_specs=fed.metric_specs)
