"""Horizontal federated learning with bidirectional sparse compression (SPEC C).

The algorithm is two halves that speak bytes: :class:`Server` (``hfl/server.py``) and :class:`Client`
(``hfl/client.py``); :class:`HFLEngine` (``hfl/engine.py``) is the in-process simulator that drives them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice._lazy import lazy_exports

if TYPE_CHECKING:
    from sluice.hfl.client import Client
    from sluice.hfl.config import HFLConfig
    from sluice.hfl.engine import HFLEngine
    from sluice.hfl.server import Server
    from sluice.tasks import Task

__all__ = ["Client", "HFLEngine", "Server", "engine_from_config"]

_LAZY = {"Client": "client", "HFLEngine": "engine", "Server": "server"}

__getattr__ = lazy_exports(__name__, _LAZY)


def engine_from_config(cfg: HFLConfig, task: Task | None = None) -> HFLEngine:
    """The simulator a ``sluice run`` configuration describes (training ``task`` instead of its ``[task]``)."""
    from sluice.hfl.engine import HFLEngine

    return HFLEngine(cfg, task)
