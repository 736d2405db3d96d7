"""The life of a training process (an ``MLTrainingProcess``) as pure transitions:
``transition(record, event) -> (record, effects)``.

No server, database, thread or worker here. Two producers carry out the effects (start a worker, a command
for it, a report to write, a checkpoint to keep or drop) of the same transitions: the management service
reads a :class:`ProcessRecord` from a process's stored ``internal`` fields, applies an event and writes the
record back; the in-memory producer's :class:`~sluice.roles.handles.ProcessHandle` keeps its record and
runs its :class:`~sluice.control.TrainingProcess` in a thread instead of a worker.

Phases (:class:`Phase`, stored as ``internal.phase``)::

    proposed --Agreed--> queued --Started--> starting --Iteration--> running --Ended--> ended
       (negotiated)        ^                     |                      |
                           +----- Interrupted (worker lost; resumes) ---+

Beside the phase a record has two flags: ``suspended`` (asked to pause; a queued one is not started,
a starting or running one is told to suspend) and ``cancelling`` (cancel asked, not yet ended: a process
without a worker ends at once, one with a worker is told to cancel and ends with its last message).

=====================  ==================================  =========================================
event                  from                                to, effects
=====================  ==================================  =========================================
Created                (none)                              proposed (negotiated) or queued
Agreed                 proposed                            queued; else :class:`Refused` (409)
Started                queued, not suspended, not being    starting; :class:`StartWorker`
                       cancelled
Iteration(state)       starting (state not NOT_STARTED)    running; in every other phase no change
AwaitingData           starting / running                  running (the process waits for data)
Suspend(on)            queued                              suspended flag only
                       starting / running                  flag; :class:`SendWorker` suspend/resume
                       proposed / ended                    :class:`Refused` (409)
Checkpointed(it)       any but ended                       :class:`KeepCheckpoint`; ended: nothing
Ended(refused)         any but ended                       ended; :class:`DropCheckpoint`
Interrupted            starting / running                  queued with ``resume`` (from the
                                                           checkpoint, or 0 when restartable), or
                                                           :class:`EndWith` FAILED / CANCELLED
Cancel                 proposed / queued                   cancelling; :class:`EndWith` CANCELLED
                       starting / running                  cancelling; :class:`SendWorker` cancel
                       ended                               nothing
=====================  ==================================  =========================================

The request's ``requestStatus`` follows its latest process (:func:`request_status`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, NamedTuple

RESTARTABLE = ("local", "hfl", "split", "chain")
"""Engine kinds a process of which may train again from scratch when it was interrupted before any
checkpoint (they train here, from their configuration alone; a chain follows the requests its producers
hold under its chain id, which its process determines)."""


class Phase(StrEnum):
    """Where a process is in its life (the stored ``internal.phase``)."""

    PROPOSED = "proposed"
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    ENDED = "ended"

    @property
    def pending(self) -> bool:
        """No worker yet: awaiting agreement or queued."""
        return self in (Phase.PROPOSED, Phase.QUEUED)

    @property
    def active(self) -> bool:
        """A worker trains it (or is starting to)."""
        return self in (Phase.STARTING, Phase.RUNNING)

    @classmethod
    def of(cls, internal: dict[str, Any]) -> Phase:
        """The phase stored in a process's ``internal`` fields."""
        return cls(internal["phase"])


@dataclass(frozen=True)
class Resume:
    """A process that lost its worker and trains again: from the checkpoint of iteration ``from_`` (0: from
    scratch); iterations up to ``seen`` were already shown to the consumer."""

    from_: int = 0
    seen: int = 0

    def to_json(self) -> dict[str, int]:
        return {"from": self.from_, "seen": self.seen}

    @classmethod
    def of(cls, doc: Any) -> Resume | None:
        if not doc:
            return None
        return cls(from_=int(doc.get("from", 0) or 0), seen=int(doc.get("seen", 0) or 0))


@dataclass(frozen=True)
class ProcessRecord:
    """The lifecycle fields of a process (a typed view of its stored ``internal``)."""

    phase: Phase
    kind: str | None = None
    suspended: bool = False
    cancelling: bool = False
    refused: bool = False
    restarts: int = 0
    deaths: int = 0
    resume: Resume | None = None

    @classmethod
    def of(cls, internal: dict[str, Any]) -> ProcessRecord:
        return cls(phase=Phase.of(internal), kind=internal.get("kind"), suspended=bool(internal.get("suspended")),
                   cancelling=bool(internal.get("cancelling")), refused=bool(internal.get("refused")),
                   restarts=int(internal.get("restarts", 0) or 0), deaths=int(internal.get("deaths", 0) or 0),
                   resume=Resume.of(internal.get("resume")))

    def changes(self, before: ProcessRecord | None = None) -> dict[str, Any]:
        """The ``internal`` fields that differ from ``before`` (all of them when None), as stored."""
        out: dict[str, Any] = {}
        for name in ("phase", "suspended", "cancelling", "refused", "restarts", "deaths", "resume"):
            value = getattr(self, name)
            if before is not None and value == getattr(before, name):
                continue
            out[name] = (value.value if isinstance(value, Phase) else
                         value.to_json() if isinstance(value, Resume) else value)
        return out


# ------------------------------------------------------------------ events
@dataclass(frozen=True)
class Created:
    """A new process: it awaits agreement on a producer's proposal (``negotiated``) or is queued."""

    negotiated: bool = False
    suspended: bool = False
    kind: str | None = None


@dataclass(frozen=True)
class Agreed:
    """The consumer accepted (or modified) the proposal."""


@dataclass(frozen=True)
class Started:
    """The queue picked the process: a worker starts it."""


@dataclass(frozen=True)
class Iteration:
    """The worker reported its state (``RUNNING``, ``SUSPENDED``, ``AWAITING_DATA``...)."""

    state: str = "RUNNING"


@dataclass(frozen=True)
class AwaitingData:
    """The worker waits for more training data."""


@dataclass(frozen=True)
class Suspend:
    """Suspend (``on``) or resume."""

    on: bool = True


@dataclass(frozen=True)
class Checkpointed:
    """The worker took a checkpoint at ``iteration``."""

    iteration: int = 0


@dataclass(frozen=True)
class Ended:
    """The process ended (``refused``: before training, for want of data, compute or a buildable job)."""

    refused: bool = False


@dataclass(frozen=True)
class Interrupted:
    """The worker was lost (the service stopped: ``limit`` None; it died: ``limit`` = workers it may lose).
    ``checkpoint``: the iteration of the last checkpoint, None without one; ``done``: iterations reported."""

    why: str
    checkpoint: int | None = None
    done: int = 0
    limit: int | None = None


@dataclass(frozen=True)
class Cancel:
    """The consumer cancelled."""


Event = Created | Agreed | Started | Iteration | AwaitingData | Suspend | Checkpointed | Ended | Interrupted | Cancel


# ------------------------------------------------------------------ effects
@dataclass(frozen=True)
class StartWorker:
    """Start a worker for the process (resuming from its checkpoint when it has ``resume``)."""


@dataclass(frozen=True)
class SendWorker:
    """A command for the process's worker: ``cancel``, ``suspend`` or ``resume``."""

    cmd: str


@dataclass(frozen=True)
class KeepCheckpoint:
    iteration: int


@dataclass(frozen=True)
class DropCheckpoint:
    pass


@dataclass(frozen=True)
class EndWith:
    """End the process now, without a worker: ``status`` CANCELLED or FAILED, ``cause`` (a 3GPP cause)."""

    status: str
    cause: str
    detail: str
    iterations: int = 0


@dataclass(frozen=True)
class Refused:
    """The event does not apply in this phase: the consumer is told why (HTTP ``code``)."""

    reason: str
    code: int = 409


Effect = StartWorker | SendWorker | KeepCheckpoint | DropCheckpoint | EndWith | Refused


class Outcome(NamedTuple):
    """``(record, effects)``: the record after an event and what must be done for it, in order."""

    record: ProcessRecord
    effects: tuple[Effect, ...] = ()


def created(event: Created) -> ProcessRecord:
    """The record of a new process."""
    phase = Phase.PROPOSED if event.negotiated else Phase.QUEUED
    return ProcessRecord(phase=phase, kind=event.kind, suspended=event.suspended)


def transition(record: ProcessRecord, event: Event) -> Outcome:
    """The record after ``event``, and what must be done for it. Never raises: an event that does not apply
    leaves the record as it is, with a :class:`Refused` effect where the consumer asked for it."""
    match event:
        case Created():
            return Outcome(created(event))
        case Agreed():
            return _agreed(record)
        case Started():
            if record.phase is not Phase.QUEUED or record.suspended or record.cancelling:
                return Outcome(record)
            return Outcome(replace(record, phase=Phase.STARTING), (StartWorker(),))
        case Iteration(state=state):
            if record.phase is Phase.STARTING and state != "NOT_STARTED":
                return Outcome(replace(record, phase=Phase.RUNNING))
            return Outcome(record)
        case AwaitingData():
            return transition(record, Iteration("AWAITING_DATA"))
        case Suspend(on=on):
            return _suspend(record, on)
        case Checkpointed(iteration=it):
            return Outcome(record, () if record.phase is Phase.ENDED else (KeepCheckpoint(it),))
        case Ended(refused=refused):
            if record.phase is Phase.ENDED:
                return Outcome(record)
            return Outcome(replace(record, phase=Phase.ENDED, refused=refused), (DropCheckpoint(),))
        case Interrupted():
            return _interrupted(record, event)
        case Cancel():
            return _cancel(record)
    raise TypeError(f"not a lifecycle event: {event!r}")


def _agreed(record: ProcessRecord) -> Outcome:
    if record.phase is not Phase.PROPOSED:
        return Outcome(record, (Refused("there is no proposal to answer: the parameters are agreed"),))
    return Outcome(replace(record, phase=Phase.QUEUED))


def _suspend(record: ProcessRecord, on: bool) -> Outcome:
    if record.phase is Phase.ENDED:
        return Outcome(record, (Refused("the process has ended"),))
    if record.phase is Phase.PROPOSED:
        return Outcome(record, (Refused("the process awaits agreement on its parameters; accept or modify the "
                                        "proposal first"),))
    after = replace(record, suspended=on)
    if record.phase is Phase.QUEUED:
        return Outcome(after)
    return Outcome(after, (SendWorker("suspend" if on else "resume"),))


def _cancel(record: ProcessRecord) -> Outcome:
    if record.phase is Phase.ENDED:
        return Outcome(record)
    after = replace(record, cancelling=True)
    if record.phase.pending:
        done = record.resume.from_ if record.resume else 0
        detail = (f"cancelled while waiting to resume from the checkpoint of iteration {done}" if done
                  else "cancelled before training started")
        return Outcome(after, (EndWith("CANCELLED", "CANCELLED", detail, done),))
    return Outcome(after, (SendWorker("cancel"),))


def _interrupted(record: ProcessRecord, event: Interrupted) -> Outcome:
    """A process that lost its worker goes back to the queue to resume from its last checkpoint, or from
    scratch when it has none and its engine trains here (:data:`RESTARTABLE`); one that can do neither, was
    being cancelled, or already lost ``limit`` workers, ends (FAILED with the reason, or CANCELLED)."""
    if not record.phase.active:
        return Outcome(record)
    deaths = record.deaths + (event.limit is not None)
    spent = event.limit is not None and deaths > event.limit
    if record.cancelling or spent or (event.checkpoint is None and record.kind not in RESTARTABLE):
        if record.cancelling:
            end = EndWith("CANCELLED", "CANCELLED", f"cancelled; {event.why} before the process ended", event.done)
        elif spent:
            end = EndWith("FAILED", "ENGINE_FAILURE", f"{event.why} while this process trained, after "
                          f"{event.limit} resumed runs", event.done)
        else:
            end = EndWith("FAILED", "ENGINE_FAILURE", f"{event.why} while this process trained; {event.done} "
                          "iterations were done, no checkpoint was taken and a "
                          f"{record.kind} job cannot train again from scratch", event.done)
        return Outcome(replace(record, deaths=deaths), (end,))
    seen = max(event.done, record.resume.seen if record.resume else 0)
    resume = Resume(from_=event.checkpoint or 0, seen=seen)
    return Outcome(replace(record, phase=Phase.QUEUED, resume=resume, restarts=record.restarts + 1, deaths=deaths))


def request_status(record: ProcessRecord, process_status: str | None) -> str:
    """The ``requestStatus`` of a request whose latest process is ``record`` with ``progressStatus.status``
    ``process_status``: NOT_STARTED (proposed, queued, starting), IN_PROGRESS (running, awaiting data, or
    waiting to resume), SUSPENDED, CANCELLING (cancel asked, not yet ended), FINISHED, CANCELLED (cancelled,
    or refused before training)."""
    if record.phase is Phase.ENDED:
        return "CANCELLED" if process_status == "CANCELLED" or record.refused else "FINISHED"
    if record.cancelling:
        return "CANCELLING"
    if record.phase is not Phase.RUNNING:
        if record.suspended:
            return "SUSPENDED"
        return "IN_PROGRESS" if record.resume else "NOT_STARTED"
    return "SUSPENDED" if process_status == "SUSPENDED" else "IN_PROGRESS"
