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
    """The trainer a ``sluice local`` configuration describes."""
    from sluice.data import load_dataset
    from sluice.local.trainer import LocalTrainer

    ds = load_dataset(cfg.data.dataset, seed=cfg.seed, test_fraction=cfg.data.test_fraction)
    n = cfg.data.max_train_samples or len(ds.y_train)
    return LocalTrainer(ds.X_train[:n], ds.y_train[:n], ds.X_test, ds.y_test, num_classes=ds.num_classes,
                        hidden=cfg.model.hidden, lr=cfg.train.lr, momentum=cfg.train.momentum,
                        batch_size=cfg.train.batch_size, min_samples=cfg.train.min_samples, seed=cfg.seed,
                        default_iterations=cfg.train.iterations)
