"""One scheduler for every topology: a party's work for a batch as a small graph of operations.

Each operation (forward or backward of one part on one group) is either

- **first type** (send-producing, SPEC P3): its result is sent to another party, or feeds an operation
  whose result is sent. Subtypes: ``SENDS`` (the seed's "second subtype": the result itself is sent)
  outranks ``FEEDS`` (the seed's "first subtype": the result only feeds a sending operation);
- **second type** (local-only): its result stays here (bottom backward: gradients of local weights).

Choice among the ready operations (:meth:`Scheduler.choose`), with ``Q`` the bytes waiting in the send
queue and ``T`` the threshold (SPEC P4, seed [0173]-[0180]):

1. ``Q >= T`` and a second-type operation is ready -> the best second-type operation (back-pressure);
2. else a first-type operation is ready -> the best first-type operation;
3. else a second-type operation is ready -> the best second-type operation;
4. else wait for a message.

"Best" is the smallest ``(subtype rank, group, declaration order)``: SENDS before FEEDS, earlier groups
first. Rule 1 stops first-type work when the queue reaches the threshold; re-evaluating before every
operation gives both switch-back rules: first-type work resumes as soon as ``Q < T`` or the second-type
input is used up. The seed's FIG. 9 flowchart tests ``Q > T`` at step 903 while its text [0175] says
"greater than or equal to"; Sluice follows the text.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from enum import IntEnum


class OpType(IntEnum):
    FIRST = 1  #: send-producing
    SECOND = 2  #: local-only


class Subtype(IntEnum):
    SENDS = 1  #: result is sent (the seed's "second subtype")
    FEEDS = 2  #: result feeds a sending operation (the seed's "first subtype")


@dataclass(frozen=True)
class Op:
    """One operation of one group. ``needs`` are the store keys it consumes."""

    name: str
    group: int
    type: OpType
    subtype: Subtype | None = None
    needs: tuple[Hashable, ...] = ()
    order: int = 0

    def __post_init__(self) -> None:
        if (self.type == OpType.FIRST) != (self.subtype is not None):
            raise ValueError(f"{self.name}: first-type operations need a subtype, second-type ones none")

    @property
    def rank(self) -> tuple[int, int, int, int]:
        sub = int(self.subtype) if self.subtype is not None else 0
        return (int(self.type), sub, self.group, self.order)

    def __str__(self) -> str:
        return f"{self.name}[{self.group}]"


@dataclass(frozen=True)
class Decision:
    """What :meth:`Scheduler.choose` picked and why (``mode``: first, backpressure, second or wait)."""

    op: Op | None
    mode: str
    queued_bytes: int = 0


class Scheduler:
    """Priority choice with a send-queue threshold (see the module docstring for the rules)."""

    def __init__(self, threshold_bytes: int) -> None:
        if threshold_bytes < 1:
            raise ValueError(f"queue threshold must be >= 1 byte, got {threshold_bytes}")
        self.threshold = int(threshold_bytes)

    def choose(self, ready: Iterable[Op], queued_bytes: int) -> Decision:
        best_first: Op | None = None
        best_second: Op | None = None
        for op in ready:
            if op.type == OpType.FIRST:
                if best_first is None or op.rank < best_first.rank:
                    best_first = op
            elif best_second is None or op.rank < best_second.rank:
                best_second = op
        if best_second is not None and queued_bytes >= self.threshold:
            return Decision(best_second, "backpressure", queued_bytes)
        if best_first is not None:
            return Decision(best_first, "first", queued_bytes)
        if best_second is not None:
            return Decision(best_second, "second", queued_bytes)
        return Decision(None, "wait", queued_bytes)


@dataclass
class OpGraph:
    """Operations of one step and what each still waits for; ``offer(key)`` makes inputs available."""

    ops: list[Op]
    _missing: dict[Op, set] = field(default_factory=dict, init=False)
    _waiting: dict[Hashable, list[Op]] = field(default_factory=dict, init=False)
    ready: set[Op] = field(default_factory=set, init=False)
    remaining: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        for op in self.ops:
            self._missing[op] = set(op.needs)
            for k in op.needs:
                self._waiting.setdefault(k, []).append(op)
            if not op.needs:
                self.ready.add(op)
        self.remaining = len(self.ops)

    def offer(self, key: Hashable) -> None:
        for op in self._waiting.get(key, ()):
            miss = self._missing[op]
            miss.discard(key)
            if not miss:
                self.ready.add(op)

    def done(self, op: Op) -> None:
        self.ready.discard(op)
        self.remaining -= 1

    @property
    def finished(self) -> bool:
        return self.remaining == 0
