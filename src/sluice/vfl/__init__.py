"""Pipelined split / vertical training across parties (SPEC P1-P8).

A batch is cut into G groups; each party runs its forward and backward operations group by group, a
scheduler picks send-producing work first (with back-pressure on the send queue), and the groups'
gradients add up to exactly the full-batch update.

Entry points: :class:`SplitEngine` (the engine protocol; followers in threads, in local processes or on
other hosts), :func:`serve_follower` (the follower side across hosts) and :func:`run_inprocess` (a whole
task in one process for its planned steps, without the control plane). The topologies are one table,
:data:`~sluice.vfl.topology.TOPOLOGIES`.
"""

from __future__ import annotations

from .config import SplitConfig
from .engine import SplitEngine
from .grouping import PipeStage, chain_bound, group_sizes, lower_bound, seed_formula, split_batch
from .reference import reference_train
from .runner import SplitResult, run_inprocess, serve_follower
from .schedule import Decision, Op, OpGraph, OpType, Scheduler, Subtype
from .topology import TOPOLOGIES, Topology

__all__ = [
    "engine_from_config",
    "SplitConfig",
    "SplitEngine",
    "SplitResult",
    "run_inprocess",
    "serve_follower",
    "reference_train",
    "TOPOLOGIES",
    "Topology",
    "Scheduler",
    "Op",
    "OpGraph",
    "OpType",
    "Subtype",
    "Decision",
    "PipeStage",
    "group_sizes",
    "split_batch",
    "seed_formula",
    "lower_bound",
    "chain_bound",
]


def engine_from_config(cfg: SplitConfig) -> SplitEngine:
    """The split-training engine a ``sluice split`` configuration describes."""
    return SplitEngine(cfg)
