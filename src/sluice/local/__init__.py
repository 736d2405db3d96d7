"""Plain centralised training engine (all data in one place), speaking :mod:`sluice.engine`."""

from sluice.local.trainer import LocalTrainer, classification_metrics

__all__ = ["LocalTrainer", "classification_metrics"]
