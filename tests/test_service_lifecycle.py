"""The process lifecycle of the management service and the in-memory producer (sluice.control.lifecycle) as pure
transitions: no server, database, thread or worker."""

from __future__ import annotations

import pytest

from sluice.control.lifecycle import (
    Agreed,
    AwaitingData,
    Cancel,
    Checkpointed,
    Created,
    DropCheckpoint,
    Ended,
    EndWith,
    Interrupted,
    Iteration,
    KeepCheckpoint,
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


def rec(phase: Phase, **kw: object) -> ProcessRecord:
    return ProcessRecord(phase=phase, kind=kw.pop("kind", "local"), **kw)  # type: ignore[arg-type]


def test_a_process_runs_from_queued_to_ended() -> None:
    r = created(Created(kind="local"))
    assert r.phase is Phase.QUEUED and request_status(r, "NOT_STARTED") == "NOT_STARTED"
    r, fx = transition(r, Started())
    assert r.phase is Phase.STARTING and fx == (StartWorker(),)
    assert request_status(r, "NOT_STARTED") == "NOT_STARTED"
    r, fx = transition(r, Iteration("NOT_STARTED"))
    assert r.phase is Phase.STARTING and fx == ()
    r, fx = transition(r, Iteration("RUNNING"))
    assert r.phase is Phase.RUNNING and request_status(r, "RUNNING") == "IN_PROGRESS"
    r, fx = transition(r, Checkpointed(3))
    assert fx == (KeepCheckpoint(3),)
    r, fx = transition(r, Ended())
    assert r.phase is Phase.ENDED and fx == (DropCheckpoint(),)
    assert request_status(r, "FINISHED") == "FINISHED"
    assert request_status(r, "FAILED") == "FINISHED"


def test_an_ended_process_takes_no_more_events() -> None:
    r = rec(Phase.ENDED)
    for event in (Ended(), Checkpointed(1), Iteration("RUNNING"), Cancel(), Started(),
                  Interrupted("the service stopped", checkpoint=2)):
        assert transition(r, event) == (r, ())
    assert transition(r, Suspend(True)).effects == (Refused("the process has ended"),)


def test_a_negotiated_process_waits_for_agreement() -> None:
    r = created(Created(negotiated=True))
    assert r.phase is Phase.PROPOSED
    assert transition(r, Started()) == (r, ())  # the queue never picks it
    assert isinstance(transition(r, Suspend(True)).effects[0], Refused)
    r, fx = transition(r, Agreed())
    assert r.phase is Phase.QUEUED and fx == ()
    again = transition(r, Agreed())
    assert again.record == r and again.effects == (
        Refused("there is no proposal to answer: the parameters are agreed"),)


def test_suspend_a_queued_process_holds_it_in_the_queue() -> None:
    r = created(Created(suspended=True))
    assert r.suspended and request_status(r, "SUSPENDED") == "SUSPENDED"
    assert transition(r, Started()) == (r, ())
    r, fx = transition(r, Suspend(False))
    assert not r.suspended and fx == ()  # no worker to tell
    assert transition(r, Started()).effects == (StartWorker(),)


def test_suspend_a_running_process_tells_its_worker() -> None:
    r = rec(Phase.RUNNING)
    r, fx = transition(r, Suspend(True))
    assert r.suspended and fx == (SendWorker("suspend"),)
    assert request_status(r, "SUSPENDED") == "SUSPENDED"
    assert request_status(r, "RUNNING") == "IN_PROGRESS"  # until the worker says it has suspended
    r, fx = transition(r, Suspend(False))
    assert not r.suspended and fx == (SendWorker("resume"),)


def test_awaiting_data_is_running() -> None:
    r, _ = transition(rec(Phase.STARTING), AwaitingData())
    assert r.phase is Phase.RUNNING and request_status(r, "AWAITING_DATA") == "IN_PROGRESS"


def test_cancel_without_a_worker_ends_at_once() -> None:
    for phase in (Phase.PROPOSED, Phase.QUEUED):
        r, fx = transition(rec(phase), Cancel())
        assert r.cancelling and r.phase is phase
        assert fx == (EndWith("CANCELLED", "CANCELLED", "cancelled before training started", 0),)
        assert request_status(r, "NOT_STARTED") == "CANCELLING"
        assert transition(r, Started()) == (r, ())  # the queue never picks it meanwhile
        r, _ = transition(r, Ended())
        assert request_status(r, "CANCELLED") == "CANCELLED"


def test_cancel_while_waiting_to_resume_keeps_the_checkpoints_iterations() -> None:
    r = rec(Phase.QUEUED, resume=Resume(from_=4, seen=6))
    _, fx = transition(r, Cancel())
    assert fx == (EndWith("CANCELLED", "CANCELLED", "cancelled while waiting to resume from the checkpoint of "
                          "iteration 4", 4),)


def test_cancel_with_a_worker_tells_it() -> None:
    for phase in (Phase.STARTING, Phase.RUNNING):
        r, fx = transition(rec(phase), Cancel())
        assert r.cancelling and r.phase is phase and fx == (SendWorker("cancel"),)


def test_a_process_that_lost_its_worker_resumes_from_its_checkpoint() -> None:
    r = rec(Phase.RUNNING, kind="hfl")
    r, fx = transition(r, Interrupted("the service stopped", checkpoint=4, done=6))
    assert fx == () and r.phase is Phase.QUEUED
    assert r.resume == Resume(from_=4, seen=6) and r.restarts == 1 and r.deaths == 0
    assert request_status(r, "RUNNING") == "IN_PROGRESS"
    r, _ = transition(r, Started())
    r, _ = transition(r, Iteration("RUNNING"))
    r, fx = transition(r, Interrupted("its worker exited with code -9", checkpoint=5, done=5, limit=2))
    assert r.resume == Resume(from_=5, seen=6) and r.restarts == 2 and r.deaths == 1
    assert r.changes(rec(Phase.RUNNING, kind="hfl")) == {
        "phase": "queued", "restarts": 2, "deaths": 1, "resume": {"from": 5, "seen": 6}}


def test_a_restartable_process_without_a_checkpoint_starts_again() -> None:
    r, fx = transition(rec(Phase.STARTING, kind="local"), Interrupted("the service stopped"))
    assert fx == () and r.phase is Phase.QUEUED and r.resume == Resume(0, 0)


def test_a_process_that_cannot_resume_ends() -> None:
    r = rec(Phase.RUNNING, kind="vfl")
    _, (end,) = transition(r, Interrupted("the service stopped", done=3))
    assert isinstance(end, EndWith) and (end.status, end.cause, end.iterations) == ("FAILED", "ENGINE_FAILURE", 3)
    assert "a vfl job cannot train again from scratch" in end.detail
    _, (end,) = transition(rec(Phase.RUNNING, deaths=2), Interrupted("its worker died", checkpoint=1, limit=2))
    assert isinstance(end, EndWith) and end.status == "FAILED" and "after 2 resumed runs" in end.detail
    _, (end,) = transition(rec(Phase.RUNNING, cancelling=True), Interrupted("the service stopped", checkpoint=1))
    assert isinstance(end, EndWith) and (end.status, end.cause) == ("CANCELLED", "CANCELLED")
    assert end.detail == "cancelled; the service stopped before the process ended"


def test_refused_before_training_is_cancelled_for_the_request() -> None:
    r, _ = transition(rec(Phase.STARTING), Ended(refused=True))
    assert r.refused and request_status(r, "FAILED") == "CANCELLED"


def test_the_record_reads_and_writes_the_stored_fields() -> None:
    stored = {"phase": "running", "kind": "hfl", "suspended": True, "resume": {"from": 2, "seen": 3},
              "restarts": 1, "request": "x"}
    r = ProcessRecord.of(stored)
    assert r == ProcessRecord(Phase.RUNNING, "hfl", suspended=True, restarts=1, resume=Resume(2, 3))
    assert ProcessRecord.of({**stored, **r.changes()}) == r
    assert Phase("queued").pending and Phase.RUNNING.active and not Phase.ENDED.active
    with pytest.raises(ValueError):
        Phase.of({"phase": "paused"})
    with pytest.raises(TypeError):
        transition(r, object())  # type: ignore[arg-type]
