"""Plain centralised training (one party, all data in one place)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice._lazy import lazy_exports

if TYPE_CHECKING:
    from sluice.local.config import LocalConfig
    from sluice.local.trainer import LocalTrainer
    from sluice.tasks import Task

__all__ = ["LocalTrainer", "engine_from_config"]

_LAZY = {"LocalTrainer": "trainer"}

__getattr__ = lazy_exports(__name__, _LAZY)


def engine_from_config(cfg: LocalConfig, task: Task | None = None) -> LocalTrainer:
    """The trainer a ``sluice local`` configuration describes: its task (a built-in dataset, a scenario's
    pooled train rows, or a task of its own; ``task`` replaces the ``[task]`` section) trained in one place."""
    from sluice.local.trainer import LocalTrainer
    from sluice.tasks import load_task

    task = task or load_task(cfg.task, seed=cfg.seed, data=cfg.data, hidden=cfg.model.hidden)
    return LocalTrainer(task, lr=cfg.train.lr, momentum=cfg.train.momentum, batch_size=cfg.train.batch_size,
                        min_samples=cfg.train.min_samples, max_train_samples=cfg.data.max_train_samples, seed=cfg.seed,
                        default_iterations=cfg.train.iterations, device=cfg.train.device)
