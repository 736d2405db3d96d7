"""Horizontal federated learning with bidirectional sparse compression (SPEC C).

The algorithm is two halves that speak bytes: :class:`Server` (``hfl/server.py``) and :class:`Client`
(``hfl/client.py``); :class:`HFLEngine` (``hfl/engine.py``) is the in-process simulator that drives them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sluice.hfl.client import Client
    from sluice.hfl.config import HFLConfig
    from sluice.hfl.engine import HFLEngine
    from sluice.hfl.server import Server

__all__ = ["Client", "HFLEngine", "Server", "engine_from_config"]


_LAZY = {"Client": "sluice.hfl.client", "HFLEngine": "sluice.hfl.engine", "Server": "sluice.hfl.server"}


def __getattr__(name: str) -> object:
    """Import the engine modules (torch) only when one of their names is used, so that reading a
    configuration stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def engine_from_config(cfg: HFLConfig) -> HFLEngine:
    """The simulator a ``sluice run`` configuration describes."""
    from sluice.hfl.engine import HFLEngine

    return HFLEngine(cfg)
