"""Pipelined split / vertical training across parties (SPEC P1-P8).

A batch is cut into G groups; each party runs its forward and backward operations group by group, a
scheduler picks send-producing work first (with back-pressure on the send queue), and the groups'
gradients add up to exactly the full-batch update.

Entry points: :class:`SplitEngine` (the engine protocol; followers in threads, in local processes or on
other hosts), :func:`serve_follower` (the follower side across hosts) and :func:`run_inprocess` (a whole
task in one process for its planned steps, without the control plane). The topologies are one table,
:data:`~sluice.split.topology.TOPOLOGIES`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice._lazy import lazy_exports

if TYPE_CHECKING:
    from .config import SplitConfig
    from .engine import SplitEngine

__all__ = [
    "engine_from_config",
    "SplitConfig",
    "SplitEngine",
    "SplitResult",
    "run_inprocess",
    "serve_follower",
    "reference_train",
    "TOPOLOGIES",
]

_LAZY = {
    "SplitConfig": "config",
    "SplitEngine": "engine",
    "reference_train": "reference",
    "SplitResult": "runner",
    "run_inprocess": "runner",
    "serve_follower": "runner",
    "TOPOLOGIES": "topology",
}
"""Where each public name lives; imported on first use so that reading a configuration stays light."""


__getattr__ = lazy_exports(__name__, _LAZY)

def engine_from_config(cfg: SplitConfig) -> SplitEngine:
    """The split-training engine a ``sluice split`` configuration describes."""
    from .engine import SplitEngine

    return SplitEngine(cfg)
