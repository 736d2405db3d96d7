"""Rounds in which no node answered: they train nothing, and a few of them in a row end the run.

A round of :class:`~sluice.runtimes.flower.engine.FlowerEngine` is *empty* when none of the nodes it sent a message to
replied with an upload or a simulated failure: each was silent past the round's deadline or answered with an
error, or no node serves any terminal of the federation any more. An empty round closes nothing and is not an
iteration: the server's model, round and sampling stay as they were, and the round is sent again to the
terminals it drew (a node that did not answer gets a dense resynchronisation, as after any drop). The bytes
of its messages are counted with the round that closes. After ``limit`` empty rounds in a row the engine
raises :class:`~sluice.errors.TrainingError`, which the control plane reports as ``ENGINE_FAILURE`` (exit 9),
with a cause naming each terminal's node and what it last did: its error, or no answer within the deadline.

A round's deadline is ``round_timeout_s``; the first sending of the engine's first round waits longer by the
longest ClientApp start-up the nodes measured when they answered the hello query, up to half the timeout
(so that ``limit`` empty rounds end the run within ``limit + 1`` timeouts): every Flower message starts a
fresh ClientApp process, which imports torch and builds its task before it can answer, and the first training
message also loads what training needs for the first time. Nodes slower than that answer no round; the
cause then gives their measured start-up and names the timeout to raise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sluice.engine import ClientRound
from sluice.errors import TrainingError

DEFAULT_EMPTY_ROUNDS = 3
"""Empty rounds in a row that end a run (``sluice run --empty-rounds``, ``empty_rounds`` of a federation)."""

_log = logging.getLogger("sluice.runtimes.flower")


@dataclass
class Try:
    """One sending of a round: its messages (terminal, Flower message), what came back, and why each terminal
    that did not answer did not (``problems``)."""

    deadline: float
    out: list[tuple[int, Any]] = field(default_factory=list)
    parts: dict[int, ClientRound] = field(default_factory=dict)
    bytes_down: int = 0
    flower_down: int = 0
    dropped: int = 0
    resynced: int = 0
    weights: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    bytes_up: int = 0
    flower_up: int = 0
    answered: int = 0  # replies with an upload or a simulated failure
    problems: dict[int, str] = field(default_factory=dict)


_UNAVAILABLE = (3, 4, 5)
"""Codes of the error replies the SuperLink makes itself (Flower's ``ErrorCode``: the message or its reply
expired, the node missed its heartbeats): the node did not answer, rather than answered with an error."""


def unavailable(reply: Any) -> bool:
    """Whether ``reply`` (an error reply) is the SuperLink's word that no answer came in time."""
    return int(reply.error.code) in _UNAVAILABLE


def error_text(reply: Any) -> str:
    """What a node's error reply says (Flower's reason, cut short)."""
    reason = " ".join(str(reply.error.reason).split())
    return reason if len(reason) <= 300 else reason[:297] + "..."


def silent_reason(reply: Any, deadline: float) -> str:
    """Why a terminal sent no upload, from its node's ``reply`` (None: none came within ``deadline`` s)."""
    if reply is None or (reply.has_error() and unavailable(reply)):
        return f"no answer within {deadline:g} s"
    return error_text(reply) if reply.has_error() else "an answer without content"


@dataclass
class Silence:
    """Counts empty rounds in a row and says why they were empty (see the module docstring)."""

    limit: int
    round_timeout_s: float
    streak: int = 0
    warm: bool = False  # the first round was sent once: no start-up allowance any more
    startup: dict[int, float] = field(default_factory=dict)  # node id -> its ClientApp start-up, in seconds
    problems: dict[int, str] = field(default_factory=dict)  # terminal -> what its node last did wrong

    def deadline(self, nodes: list[int]) -> float:
        """Seconds a round that messages ``nodes`` waits for their replies (the first call: with the start-up
        allowance)."""
        if self.warm:
            return self.round_timeout_s
        self.warm = True
        startup = max((self.startup.get(n, 0.0) for n in nodes), default=0.0)
        return self.round_timeout_s + min(startup, self.round_timeout_s / 2)

    def answered(self) -> None:
        self.streak = 0
        self.problems.clear()

    def empty(self, rnd: int, t: Try) -> None:
        """Count the empty try ``t`` of round ``rnd``; :class:`TrainingError` when it is the ``limit``-th in a
        row."""
        self.streak += 1
        self.problems.update(t.problems)
        if self.streak >= self.limit:
            raise TrainingError(self.cause(rnd, t.deadline))
        _log.warning("round %d: no node answered (%s); sending it again (%d of %d empty rounds in a row)", rnd,
                     self._who(), self.streak, self.limit)

    def _who(self) -> str:
        return "; ".join(f"terminal {c}: {why}" for c, why in sorted(self.problems.items())) or "no terminal drawn"

    def cause(self, rnd: int, deadline: float) -> str:
        startup = max(self.startup.values(), default=0.0)
        measured = (f"; their ClientApps took up to {startup:.1f} s to start, measured on the nodes"
                    if startup else "")
        return (f"no node answered in {self.streak} rounds in a row (round {rnd} sent {self.streak} times, the "
                f"limit: sluice run --empty-rounds, empty_rounds of a federation): {self._who()}. Nodes that are "
                f"slow to answer need a longer round timeout than {deadline:g} s (sluice run --round-timeout, "
                f"round_timeout_s of a federation){measured}; nodes that fail say why in their logs")
