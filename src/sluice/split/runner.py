"""Running split training outside the control plane: a whole task in one process for its planned steps
(:func:`run_inprocess`, used by tests and benchmarks), and the follower side of a task led from elsewhere
(:func:`serve_follower`, what ``sluice split party --role follower`` runs).

The leader side of every run is :class:`~sluice.split.engine.SplitEngine`.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from sluice.files import atomic_write
from sluice.transport.grpc_link import GrpcListener

from .config import SplitConfig
from .engine import FollowerHook, Record, SplitEngine, follower_for
from .links import tls_files
from .models import import_optimizer_modules
from .party import switch_interval
from .schedule import Decision

OnRecord = Callable[[Record], None]


@dataclass
class SplitResult:
    """Step records, the run summary, and the trained parts this process holds (name -> state dict)."""

    records: list[Record]
    summary: dict[str, Any]
    states: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    traces: dict[str, list[Decision]] = field(default_factory=dict)


def run_inprocess(
    cfg: SplitConfig, on_record: OnRecord | None = None, trace: bool = False,
    follower_hook: FollowerHook | None = None,
) -> SplitResult:
    """Leader in this thread, each follower in a thread, joined by emulated links (``transport.emulate``,
    whatever ``transport.kind`` says); the planned steps, then the end.

    ``trace`` keeps every scheduling decision of every party (``SplitResult.traces``); ``follower_hook(i,
    follower)`` runs in follower ``i``'s thread before it serves (tests use it to inject failures)."""
    cfg = cfg.model_copy(update={"transport": cfg.transport.model_copy(update={"kind": "inproc"})})
    engine = SplitEngine(cfg, trace=trace, follower_hook=follower_hook)
    try:
        engine.start()
        for _ in range(engine.default_iterations):
            engine.iterate()
            if on_record is not None:
                on_record(engine.records[-1])
    finally:
        engine.stop()
    return SplitResult(engine.records, engine.summary(), engine.states(), engine.traces() if trace else {})


def _die_with_parent(parent_pid: int | None) -> None:
    """Linux: ask for SIGTERM when the parent dies (a spawned follower never outlives ``split run``)."""
    if parent_pid is None:
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # pragma: no cover - not Linux
        pass
    if os.getppid() != parent_pid:
        sys.exit(3)


def serve_follower(
    cfg: SplitConfig,
    listen: str,
    name: str | None = None,
    ready_file: str | None = None,
    accept_timeout: float = 600.0,
    parent_pid: int | None = None,
    on_event: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Listen on ``listen``, serve one leader's task, return this follower's summary."""
    _die_with_parent(parent_pid)
    torch.set_num_threads(1)
    import_optimizer_modules()  # before listening: the leader waits for the answer to its proposal
    listener = GrpcListener(listen, tls_files(cfg.transport.tls), name or cfg.party.name)
    try:
        if on_event:
            on_event(f"listening on {listener.address}")
        if ready_file:
            atomic_write(ready_file, listener.address.encode())
        link = listener.accept(accept_timeout)
        if on_event:
            on_event("leader connected")
        f = follower_for(link, cfg)
        with switch_interval(cfg.pipeline.switch_interval_ms):
            return f.serve()
    finally:
        listener.close()
