"""Training in the background: process handles (query, update, suspend, resume, cancel, wait) and the
registry of processes by id."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from sluice.control import (
    Cause,
    ModelIdentity,
    ProcessHooks,
    ProcessState,
    ReplayEngine,
    Termination,
    TrainingProcess,
)
from sluice.control.lifecycle import Phase
from sluice.engine import IterationEvent
from sluice.errors import ConfigError, SluiceError, TrainingError
from sluice.roles import (
    ProcessHandle,
    ProcessRegistry,
    Producer,
    RequestRefused,
    TrainingRequest,
    UnknownProcessError,
)

TIMEOUT = 20.0


class GatedEngine(ReplayEngine):
    """Accuracy rises by 0.01 an iteration; every iteration waits for a permit from the test."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__([{"test_accuracy": 0.01 * i} for i in range(1, 101)], counts_bytes=False)
        self.gate = threading.Semaphore(0)
        self.fail_at = fail_at

    def allow(self, k: int = 1) -> None:
        for _ in range(k):
            self.gate.release()

    def iterate(self) -> IterationEvent:
        if not self.gate.acquire(timeout=TIMEOUT):
            raise TrainingError("the test never let this iteration run")
        if self.calls + 1 == self.fail_at:
            raise RuntimeError("simulated engine crash")
        return super().iterate()


def _until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _handle(eng: GatedEngine, termination: dict[str, Any], **kw: Any) -> ProcessHandle:
    return ProcessHandle(TrainingProcess(eng, termination, hooks=ProcessHooks(**kw)), "p-1").start()


# ------------------------------------------------------------------------------------- handles
def test_handle_runs_in_background_and_answers_queries() -> None:
    eng = GatedEngine()
    seen: list[int] = []
    h = _handle(eng, {"iterations": 5}, on_event=lambda ev, p: seen.append(ev.iteration))
    assert not h.done() and h.report is None and h.wait(0.05) is None  # start returned, nothing trained yet
    assert h.iterations == 0 and h.request_status in ("NOT_STARTED", "TRAINING_IN_PROGRESS")
    eng.allow(2)
    _until(lambda: h.iterations == 2, "two iterations")
    assert h.state == ProcessState.RUNNING and h.request_status == "TRAINING_IN_PROGRESS"
    assert h.latest == {"test_accuracy": pytest.approx(0.02)}
    status = h.progress_status()
    assert status["status"] == "RUNNING" and status["progressPercentage"] == 40  # 2 of 5 iterations
    assert not h.done()
    eng.allow(3)
    report = h.wait(TIMEOUT)
    assert report is not None and h.done() and h.report is report
    assert report.cause == Cause.CRITERION_MET and report.iterations == 5 and seen == [1, 2, 3, 4, 5]
    assert h.state == ProcessState.FINISHED and h.progress_status()["resultStateInfo"] == "CRITERION_MET"
    assert h.request_status == "FINISHED" and eng.stopped and h.error is None


def test_suspend_resume_update_and_cancel_while_running() -> None:
    eng = GatedEngine()
    h = _handle(eng, {"iterations": 1000})
    eng.allow(1)
    _until(lambda: h.iterations == 1, "the first iteration")
    h.suspend()
    eng.allow(1)  # the iteration in flight completes, then the process pauses
    _until(lambda: h.state == ProcessState.SUSPENDED, "SUSPENDED")
    assert h.iterations == 2 and eng.suspended and h.request_status == "SUSPENDED"
    eng.allow(5)
    time.sleep(0.1)
    assert h.iterations == 2  # no iteration while suspended
    h.update({"performance": {"accuracy": 0.04}})
    h.resume()
    report = h.wait(TIMEOUT)
    assert report is not None and report.cause == Cause.CRITERION_MET
    assert report.fired == "performance.test_accuracy" and report.iterations == 4  # the updated target fired
    assert report.termination is not None and report.termination.performance["test_accuracy"].threshold == 0.04

    eng = GatedEngine()
    h = _handle(eng, {"iterations": 1000})
    eng.allow(3)
    _until(lambda: h.iterations == 3, "three iterations")
    h.cancel()
    eng.allow(1)
    report = h.wait(TIMEOUT)
    assert report is not None and report.cause == Cause.CANCELLED and report.status == ProcessState.CANCELLED
    assert report.iterations in (3, 4) and h.request_status == "CANCELLED"
    h.cancel()  # nothing happens once ended
    with pytest.raises(ConfigError, match="has ended"):
        h.update({"iterations": 5})
    with pytest.raises(ConfigError, match="already started"):
        h.start()


def test_engine_failure_ends_with_a_report_and_keeps_the_error() -> None:
    eng = GatedEngine(fail_at=3)
    h = _handle(eng, {"iterations": 10})
    eng.allow(3)
    report = h.wait(TIMEOUT)
    assert report is not None and report.cause == Cause.ENGINE_FAILURE and report.status == ProcessState.FAILED
    assert report.iterations == 2 and "simulated engine crash" in report.detail
    assert h.state == ProcessState.FAILED
    with pytest.raises(ConfigError, match="has not run yet"):
        ProcessHandle(h.process)


# ------------------------------------------------------------------------------------- registry
def test_registry_by_id() -> None:
    reg = ProcessRegistry()
    engines = [GatedEngine(), GatedEngine()]
    handles = [reg.add(ProcessHandle(TrainingProcess(e, {"iterations": 1}))) for e in engines]
    assert len({h.id for h in handles}) == 2 and all(isinstance(h.id, str) and h.id for h in handles)
    assert reg.get(handles[1].id) is handles[1] and handles[0].id in reg and len(reg) == 2
    assert reg.list() == handles and reg.list(active=False) == []  # not started: not ended either
    with pytest.raises(UnknownProcessError, match="no training process with id 'nope'") as err:
        reg.get("nope")
    assert isinstance(err.value, SluiceError) and isinstance(err.value, KeyError)
    assert handles[0].id in str(err.value)
    with pytest.raises(ConfigError, match="already registered"):
        reg.add(handles[0])
    handles[0].start()
    engines[0].allow(1)
    handles[0].wait(TIMEOUT)
    assert reg.list(active=False) == [handles[0]]
    assert reg.remove(handles[1].id) is handles[1] and handles[1].id not in reg
    with pytest.raises(UnknownProcessError):
        reg.remove(handles[1].id)


# ------------------------------------------------------------------------------------- producer
def test_producer_start_returns_a_handle_at_once() -> None:
    eng = GatedEngine()
    p = Producer("p", lambda model, req: eng)
    model = ModelIdentity(id="m")
    h = p.start(TrainingRequest(model=model, termination=Termination(iterations=3)))
    assert not h.done() and p.process(h.id) is h and p.processes.list(active=True) == [h]
    assert h.agreement is not None and h.agreement.decided_by == "consumer"
    # one model trains in one process at a time; its new data goes to that process
    with pytest.raises(RequestRefused, match=f"being trained by process {h.id}") as refused:
        p.start(TrainingRequest(model=model, termination=Termination(iterations=3)))
    assert refused.value.response.request_status == "CANCELLED"
    upd = p.data_updated("m", {"X": [[1.0]], "y": [0]})
    assert upd.accepted and upd.process_id == h.id
    eng.allow(3)
    answer = p.answer(h)
    assert answer.accepted and answer.process_id == h.id and answer.report.iterations == 3
    assert answer.request_status == "FINISHED"
    assert eng.data == [{"X": [[1.0]], "y": [0]}]
    assert [r.iterations for r in p.history.records] == [3] and p.models["m"] == model
    with pytest.raises(UnknownProcessError, match="known ids: " + h.id):
        p.process("other")
    # the model is free again: a second request trains (and is a second process)
    eng.allow(3)
    second = p.request(TrainingRequest(model=model, termination=Termination(iterations=3)))
    assert second.accepted and second.process_id != h.id and len(p.processes) == 2


def test_producer_start_refuses_with_the_answer() -> None:
    p = Producer("p", lambda model, req: GatedEngine())
    with pytest.raises(RequestRefused, match="needs the consumer's termination") as refused:
        p.start(TrainingRequest(model=ModelIdentity(id="m")))
    assert not refused.value.response.accepted and len(p.processes) == 0
    with pytest.raises(RequestRefused, match="GatedEngine reports test_accuracy"):
        p.start(TrainingRequest(model=ModelIdentity(id="m"), termination=Termination(performance={"f1": 0.9})))
    # the refusals released the model: a valid request starts
    h = p.start(TrainingRequest(model=ModelIdentity(id="m"), termination=Termination(iterations=1)))
    h.cancel()
    h.process.engine.allow(1)
    assert h.wait(TIMEOUT) is not None


# ------------------------------------------------------------------------------------- lifecycle
def test_a_handle_goes_through_the_lifecycle_of_the_service() -> None:
    eng = GatedEngine()
    h = ProcessHandle(TrainingProcess(eng, {"iterations": 2}), "p-1")
    assert h.phase is Phase.QUEUED and not h.record.suspended
    h.start()
    eng.allow(1)
    _until(lambda: h.iterations == 1, "the first iteration")
    assert h.phase is Phase.RUNNING
    eng.allow(1)
    assert h.wait(TIMEOUT) is not None and h.phase is Phase.ENDED
    with pytest.raises(ConfigError, match="has ended"):
        h.suspend()
    with pytest.raises(ConfigError, match="has ended"):
        h.resume()


def test_a_handle_cancelled_in_the_queue_ends_without_training() -> None:
    eng = GatedEngine()
    done: list[ProcessHandle] = []
    h = ProcessHandle(TrainingProcess(eng, {"iterations": 5}), "p-1", on_done=done.append)
    h.cancel()
    report = h.wait(0)
    assert report is not None and report.cause == Cause.CANCELLED and report.status == ProcessState.CANCELLED
    assert report.iterations == 0 and "before training started" in report.detail
    assert h.done() and done == [h] and h.phase is Phase.ENDED and h.state == ProcessState.CANCELLED
    assert h.request_status == "CANCELLED" and not eng.started
    with pytest.raises(ConfigError, match="cancelled before it started"):
        h.start()


def test_a_handle_suspended_in_the_queue_starts_when_resumed() -> None:
    eng = GatedEngine()
    h = ProcessHandle(TrainingProcess(eng, {"iterations": 1}), "p-1")
    h.suspend()
    h.start()
    assert h.phase is Phase.QUEUED and h.record.suspended and not eng.started
    with pytest.raises(ConfigError, match="already started"):
        h.start()
    h.resume()
    assert h.phase in (Phase.STARTING, Phase.RUNNING)
    eng.allow(1)
    report = h.wait(TIMEOUT)
    assert report is not None and report.cause == Cause.CRITERION_MET and report.iterations == 1
