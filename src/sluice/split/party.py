"""What every party of pipelined split training shares: the worker (SPEC P7).

Each party (:mod:`sluice.split.leader`, :mod:`sluice.split.follower`) reads its data, builds its operation
graph for every step (:mod:`sluice.split.topology`), lets the :class:`~sluice.split.schedule.Scheduler` pick
the next operation,
runs it with its trainer (forward, backward, optimizer), and exchanges tensors over its links. The same
code runs over the in-process emulated link and over gRPC; only the links differ.

Exactness (SPEC P5): group ``g`` of a batch of ``B`` samples contributes the loss
``sum_{i in g} CE(z_i, y_i) / B``; gradients from all groups accumulate in ``.grad`` and the optimizer
steps once per batch, so the update equals the full-batch update of the mean loss (up to float rounding)
for models whose per-sample outputs do not depend on other samples.

Step protocol. Tensors carry (step, group, tag), the tags of :data:`sluice.split.topology.TOPOLOGIES`.
After its optimizer step a follower evaluates when due and sends ``step_done`` with its idle and busy
seconds, per-operation seconds and the bytes it sent for that step; it starts the next step at once (the
batch order is agreed, so no message is needed).
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import torch
from torch import nn

from sluice.errors import SluiceError, TrainingError, TransportError
from sluice.transport.link import Delivery, Inbox, Link
from sluice.wire.tensor import (
    ControlMsg,
    RawMsg,
    TensorMsg,
    decode,
    encode_control,
    encode_raw,
    encode_tensor,
)

from .schedule import Decision, Op, OpGraph, Scheduler


def default_threshold() -> int:
    """P4 threshold from memory size: 1 % of available memory, between 1 MB and 256 MB."""
    avail = psutil.virtual_memory().available
    return int(min(256 << 20, max(1 << 20, avail // 100)))


@contextmanager
def switch_interval(ms: float | None) -> Iterator[None]:
    """Run with ``sys.setswitchinterval(ms / 1000)`` and restore the previous interval afterwards.

    Transport threads (gRPC, emulated links) take the interpreter lock briefly for every message; with the
    default 5 ms interval the compute thread may wait that long to get it back after each kernel."""
    if ms is None:
        yield
        return
    old = sys.getswitchinterval()
    sys.setswitchinterval(ms / 1000.0)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


class Stopped(Exception):
    """The leader asked a follower to stop (internal)."""


class Worker:
    """Inbox, store, byte meters and the scheduling loop shared by leader and followers."""

    def __init__(self, name: str, links: dict[str, Link], timeout_s: float, threshold: int | None,
                 setup_timeout_s: float | None = None) -> None:
        self.name = name
        self.links = links
        self.timeout_s = timeout_s
        self.setup_timeout_s = max(timeout_s, setup_timeout_s or 0.0)
        """How long a setup wait (a peer loading its task, intersecting ids with another party, measuring
        itself) may stay silent: at least ``timeout_s``."""
        self.inbox = Inbox()
        for peer, link in links.items():
            link.attach(self.inbox, peer)
        self.scheduler = Scheduler(threshold or default_threshold())
        self.store: dict[Hashable, Any] = {}
        self.controls: dict[str, deque[tuple[ControlMsg, int, float]]] = defaultdict(deque)
        self.raws: dict[str, deque[tuple[bytes, float]]] = defaultdict(deque)
        self.graph: OpGraph | None = None
        self.finished_peers: set[str] = set()
        self.paused = False
        self.stop_requested = False
        self.sent_by_step: dict[int, int] = defaultdict(int)
        self.setup_sent = 0
        self.idle = 0.0
        self.busy = 0.0
        self.op_seconds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        self.trace: list[Decision] | None = None
        self.device = torch.device("cpu")
        """Where this party computes; tensors travel from the CPU (:meth:`send_tensor`, :meth:`_absorb`)."""

    # -- sending -------------------------------------------------------------------------------
    def _send(self, peer: str, payload: bytes) -> None:
        """Queue ``payload`` on the link to ``peer``. When the link has ended, a failure its peer reported
        before closing it (an ``error`` message already in the inbox) is raised instead of the bare end of
        the link: the reader thread may deliver both while this party is still computing."""
        try:
            self.links[peer].send(payload)
        except TransportError:
            self.raise_reported_failure()
            raise

    def raise_reported_failure(self) -> None:
        """Absorb what has arrived, without waiting: raises :class:`TrainingError` for a peer's ``error``
        message (the failure deliveries of ended links are passed over)."""
        while True:
            d = self.inbox.get_nowait()
            if d is None:
                return
            if d.error is None:
                self._absorb(d)

    def send_tensor(self, peer: str, step: int, group: int, tag: str, tensor: torch.Tensor) -> int:
        payload = encode_tensor(step, group, tag, tensor.cpu())
        self._send(peer, payload)
        self.sent_by_step[step] += len(payload)
        return len(payload)

    def send_control(
        self, peer: str, type_: str, body: dict[str, Any] | None = None, step: int | None = None
    ) -> int:
        payload = encode_control(type_, body)
        self._send(peer, payload)
        if step is None:
            self.setup_sent += len(payload)
        else:
            self.sent_by_step[step] += len(payload)
        return len(payload)

    def send_raw(self, peer: str, data: bytes) -> int:
        payload = encode_raw(data)
        self._send(peer, payload)
        self.setup_sent += len(payload)
        return len(payload)

    def queued_bytes(self) -> int:
        return sum(link.pending_bytes() for link in self.links.values())

    # -- receiving -----------------------------------------------------------------------------
    def _absorb(self, d: Delivery) -> None:
        if d.error is not None:
            if d.peer in self.finished_peers:
                return
            raise d.error
        assert d.payload is not None
        msg = decode(d.payload)
        if isinstance(msg, TensorMsg):
            key = ("in", msg.step, msg.tag, d.peer, msg.group)
            self.store[key] = msg.tensor.to(self.device)
            if self.graph is not None:
                self.graph.offer(key)
        elif isinstance(msg, ControlMsg):
            self._on_control(d.peer, msg, len(d.payload), d.arrived)
        elif isinstance(msg, RawMsg):
            self.raws[d.peer].append((msg.data, d.arrived))

    def _on_control(self, peer: str, msg: ControlMsg, size: int, arrived: float) -> None:
        if msg.type == "error":
            raise TrainingError(f"{peer} failed: {msg.body.get('message', 'no detail')}")
        if msg.type == "pause":
            self.paused = True
        elif msg.type == "resume":
            self.paused = False
        elif msg.type == "bye":
            self.finished_peers.add(peer)  # its close that follows is expected
            self.controls[peer].append((msg, size, arrived))
        elif msg.type == "stop":
            self.stop_requested = True
            self.controls[peer].append((msg, size, arrived))
        else:
            self.controls[peer].append((msg, size, arrived))

    def pump(self, wait: bool, what: str = "a message", setup: bool = False) -> None:
        """Absorb everything that has arrived; with ``wait`` and nothing there, block (counted as idle)
        until one delivery arrives, for at most ``timeout_s`` (``setup_timeout_s`` for a ``setup`` wait)."""
        got = False
        while True:
            d = self.inbox.get_nowait()
            if d is None:
                break
            got = True
            self._absorb(d)
        if wait and not got:
            t0 = time.perf_counter()
            timeout, setting = ((self.setup_timeout_s, "transport.setup_timeout_s") if setup
                                else (self.timeout_s, "transport.timeout_s"))
            d = self.inbox.get(None if self.paused else timeout, what, setting)
            self.idle += time.perf_counter() - t0
            self._absorb(d)

    def channel(self, peer: str) -> RawChannel:
        """Raw messages to and from ``peer`` as a :class:`sluice.psi.Channel` (counted as setup bytes)."""
        return RawChannel(self, peer)

    def take_control(self, peer: str, *types: str) -> tuple[ControlMsg, int, float] | None:
        """The first queued control message from ``peer`` of one of ``types`` (removed from the queue)."""
        q = self.controls[peer]
        for i, item in enumerate(q):
            if item[0].type in types:
                del q[i]
                return item
        return None

    def wait_control(self, peer: str, types: str | tuple[str, ...], what: str, setup: bool = False) -> ControlMsg:
        """Block until ``peer`` sends a control message of one of ``types`` (see :meth:`pump` for ``setup``)."""
        wanted = (types,) if isinstance(types, str) else types
        while True:
            item = self.take_control(peer, *wanted)
            if item is not None:
                return item[0]
            self.pump(True, f"{what} from {peer}", setup)

    def wait_keys(self, keys: list[Hashable], what: str) -> None:
        while not all(k in self.store for k in keys):
            self.pump(True, what)

    # -- the scheduling loop -------------------------------------------------------------------
    def run_graph(
        self, ops: list[Op], execute: Callable[[Op], None], what: str, abortable: bool = False
    ) -> None:
        """Run one step's operations, always picking the scheduler's choice among the ready ones."""
        graph = OpGraph(ops)
        for op in ops:
            for k in op.needs:
                if k in self.store:
                    graph.offer(k)
        self.graph = graph
        try:
            while not graph.finished:
                self.pump(False)
                if abortable and self.stop_requested:
                    raise Stopped
                dec = self.scheduler.choose(graph.ready, self.queued_bytes())
                if self.trace is not None:
                    self.trace.append(dec)
                if dec.op is None:
                    self.pump(True, what)
                    if abortable and self.stop_requested:
                        raise Stopped
                    continue
                t0 = time.perf_counter()
                execute(dec.op)
                dt = time.perf_counter() - t0
                rec = self.op_seconds[dec.op.name]
                rec[0] += dt
                rec[1] += 1
                self.busy += dt
                graph.done(dec.op)
        finally:
            self.graph = None

    def reset_counters(self) -> None:
        self.idle = 0.0
        self.busy = 0.0
        self.op_seconds = defaultdict(lambda: [0.0, 0])

    def close_links(self) -> None:
        for link in self.links.values():
            try:
                link.close()
            except SluiceError:
                pass


class RawChannel:
    """One peer's raw messages as a channel: ``send`` queues one, ``recv`` waits for the next."""

    def __init__(self, worker: Worker, peer: str) -> None:
        self.worker, self.peer = worker, peer

    def send(self, data: bytes) -> None:
        self.worker.send_raw(self.peer, data)

    def recv(self) -> bytes:
        raws = self.worker.raws[self.peer]
        while not raws:
            self.worker.pump(True, f"the intersection of ids with {self.peer}")
        return raws.popleft()[0]


def params_of(*modules: nn.Module | None) -> list[nn.Parameter]:
    return [p for m in modules if m is not None for p in m.parameters()]


def fail_peers(worker: Worker, exc: BaseException) -> None:
    """Tell every peer (best effort) why this party stops, then close the links."""
    for peer in worker.links:
        if peer in worker.finished_peers:
            continue
        try:
            worker.send_control(peer, "error", {"message": f"{type(exc).__name__}: {exc}"})
        except SluiceError:
            pass
    for link in worker.links.values():
        try:
            link.flush(1.0)
        except SluiceError:
            pass
    worker.close_links()

