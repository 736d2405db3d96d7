"""Horizontal federated learning with bidirectional sparse compression (SPEC C).

The algorithm is two halves that speak bytes: :class:`Server` (``hfl/server.py``) and :class:`Client`
(``hfl/client.py``); :class:`HFLEngine` (``hfl/engine.py``) is the in-process simulator that drives them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice.hfl.client import Client
from sluice.hfl.engine import HFLEngine
from sluice.hfl.server import Server

if TYPE_CHECKING:
    from sluice.hfl.config import HFLConfig

__all__ = ["Client", "HFLEngine", "Server", "engine_from_config"]


def engine_from_config(cfg: HFLConfig) -> HFLEngine:
    """The simulator a ``sluice run`` configuration describes."""
    return HFLEngine(cfg)
