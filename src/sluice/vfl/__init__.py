"""Pipelined split / vertical training across parties (SPEC P1-P8).

A batch is cut into G groups; each party runs its forward and backward operations group by group, a
scheduler picks send-producing work first (with back-pressure on the send queue), and the groups'
gradients add up to exactly the full-batch update.

Entry points: :func:`run_inprocess` (threads + emulated links), :func:`run_processes` (one process per
follower, loopback gRPC), :func:`serve_follower` / :func:`run_leader` (across hosts), and
:class:`SplitEngine` (the engine protocol).
"""

from .config import SplitConfig
from .engine import SplitEngine
from .grouping import chain_bound, group_sizes, lower_bound, seed_formula, split_batch
from .reference import reference_train
from .runner import SplitResult, run_inprocess, run_leader, run_processes, serve_follower
from .schedule import Decision, Op, OpGraph, OpType, Scheduler, Subtype

__all__ = [
    "SplitConfig",
    "SplitEngine",
    "SplitResult",
    "run_inprocess",
    "run_processes",
    "run_leader",
    "serve_follower",
    "reference_train",
    "Scheduler",
    "Op",
    "OpGraph",
    "OpType",
    "Subtype",
    "Decision",
    "group_sizes",
    "split_batch",
    "seed_formula",
    "lower_bound",
    "chain_bound",
]
