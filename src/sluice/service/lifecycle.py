"""The process lifecycle of the service: :mod:`sluice.control.lifecycle` (the pure transitions that the service
and the in-memory producer both carry out), under the name the service's modules import it by."""

from __future__ import annotations

from sluice.control.lifecycle import (
    RESTARTABLE,
    Agreed,
    AwaitingData,
    Cancel,
    Checkpointed,
    Created,
    DropCheckpoint,
    Effect,
    Ended,
    EndWith,
    Event,
    Interrupted,
    Iteration,
    KeepCheckpoint,
    Outcome,
    Phase,
    ProcessRecord,
    Refused,
    Resume,
    SendWorker,
    Started,
    StartWorker,
    Suspend,
    created,
    request_status,
    transition,
)

__all__ = ["RESTARTABLE", "Phase", "Resume", "ProcessRecord", "Created", "Agreed", "Started", "Iteration",
           "AwaitingData", "Suspend", "Checkpointed", "Ended", "Interrupted", "Cancel", "Event", "StartWorker",
           "SendWorker", "KeepCheckpoint", "DropCheckpoint", "EndWith", "Refused", "Effect", "Outcome", "created",
           "transition", "request_status"]
