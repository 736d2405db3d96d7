"""Training processes running in the background, and the registry that finds them by id.

A :class:`ProcessHandle` runs one :class:`sluice.control.TrainingProcess` in its own thread and is the
only way other threads touch it: every query answers from a snapshot the training thread takes after
each iteration and each change of state (state, iterations, latest metrics, the TS 28.105
``ProcessMonitor``), and every control (update, suspend, resume, cancel, add data) goes through the
process's thread-safe controls, taking effect at the next iteration. :meth:`ProcessHandle.wait` blocks
until the report exists. A run that raises ends with an ``ENGINE_FAILURE`` report and keeps the error.

The handle's life is the management service's: the transitions of :mod:`sluice.control.lifecycle`
(:attr:`ProcessHandle.phase`: queued → starting → running → ended), whose effects the handle carries out
with a thread where the service has a worker. A handle is queued until :meth:`~ProcessHandle.start`; one
suspended while queued starts when resumed; one cancelled while queued ends ``CANCELLED`` without
training; a control the phase refuses (suspending an ended process) raises :class:`ConfigError`.

A :class:`ProcessRegistry` holds handles under unique string ids; an unknown id raises
:class:`UnknownProcessError` naming the ids it has.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from sluice.control.lifecycle import (
    Cancel,
    Created,
    Effect,
    Ended,
    EndWith,
    Event,
    Iteration,
    Phase,
    ProcessRecord,
    Refused,
    SendWorker,
    Started,
    StartWorker,
    Suspend,
    created,
    transition,
)
from sluice.control.params import Cause, ProcessState, Requirements, Termination
from sluice.control.process import TrainingProcess
from sluice.control.report import TrainingReport
from sluice.engine import IterationEvent
from sluice.errors import ConfigError, SluiceError
from sluice.roles import threegpp

DoneCallback = Callable[["ProcessHandle"], None]
_ENDED = (ProcessState.FINISHED, ProcessState.FAILED, ProcessState.CANCELLED)
_REFUSED = (Cause.INSUFFICIENT_TRAINING_SAMPLES, Cause.INSUFFICIENT_COMPUTE)  # before training, as the service


class UnknownProcessError(SluiceError, KeyError):
    """No training process has the id asked for."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ProcessHandle:
    """One training process running in a background thread; see the module docstring.

    ``process`` must not have run yet. ``trigger`` and ``agreement`` record why the process runs and the
    parameters it was agreed with; ``on_done`` runs in the training thread once the report exists, before
    :meth:`wait` returns.
    """

    def __init__(
        self,
        process: TrainingProcess,
        id: str | None = None,
        *,
        trigger: str = "CONSUMER_REQUEST",
        agreement: Any = None,
        on_done: DoneCallback | None = None,
    ) -> None:
        if process.state != ProcessState.NOT_STARTED:
            raise ConfigError(f"a handle takes a process that has not run yet; this one is {process.state.value}")
        self.id = id or new_process_id()
        self.process = process
        self.model = process.model
        self.trigger = trigger
        self.agreement = agreement
        self._on_done = on_done
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._report: TrainingReport | None = None
        self._record = created(Created())
        self._start_asked = False  # start() while suspended in the queue: it starts when resumed
        self._user_event, self._user_state = process.on_event, process.on_state
        process.on_event, process.on_state = self._on_event, self._on_state
        self._snap: tuple[ProcessState, int, dict[str, float], dict[str, Any]] = self._take()
        self._thread = threading.Thread(target=self._run, name=f"sluice-process-{self.id}", daemon=True)

    # ----------------------------------------------------------------------------------- lifecycle
    def start(self) -> ProcessHandle:
        """Start training in the background (a handle suspended while queued: once resumed); return at once."""
        with self._lock:
            before = self._record
            if before.phase is not Phase.QUEUED or self._start_asked:
                what = "was cancelled before it started" if before.phase is Phase.ENDED and not (
                    self._thread.is_alive() or self._thread.ident) else "was already started"
                raise ConfigError(f"process {self.id} {what}")
            self._start_asked = True
        self._apply(Started())
        return self

    def _apply(self, event: Event) -> tuple[Effect, ...]:
        """Carry out the effects of ``event`` on this handle's record; the ones left to the caller
        (:class:`Refused`)."""
        with self._lock:
            before = self._record
            self._record, effects = transition(before, event)
        left: list[Effect] = []
        for effect in effects:
            if isinstance(effect, StartWorker):
                self._thread.start()
            elif isinstance(effect, SendWorker):
                {"cancel": self.process.cancel, "suspend": self.process.suspend,
                 "resume": self.process.resume}[effect.cmd]()
            elif isinstance(effect, EndWith):
                self._end_unstarted(effect)
            else:
                left.append(effect)
        if isinstance(event, Suspend) and not event.on and self._start_asked and self.phase is Phase.QUEUED:
            self._apply(Started())  # resumed in the queue after start(): it starts now
        return tuple(left)

    @property
    def phase(self) -> Phase:
        """Where the process is in its life (:class:`~sluice.control.lifecycle.Phase`)."""
        with self._lock:
            return self._record.phase

    @property
    def record(self) -> ProcessRecord:
        """The lifecycle record: the phase and the ``suspended`` and ``cancelling`` flags."""
        with self._lock:
            return self._record

    def wait(self, timeout: float | None = None) -> TrainingReport | None:
        """Block until the process ends (at most ``timeout`` seconds); its report, or None on timeout."""
        self._done.wait(timeout)
        with self._lock:
            return self._report

    def done(self) -> bool:
        """Whether the process has ended and its report exists."""
        return self._done.is_set()

    # ----------------------------------------------------------------------------------- queries
    @property
    def state(self) -> ProcessState:
        with self._lock:
            return self._snap[0]

    @property
    def iterations(self) -> int:
        """Iterations done so far."""
        with self._lock:
            return self._snap[1]

    @property
    def latest(self) -> dict[str, float]:
        """Metrics of the latest iteration (a copy)."""
        with self._lock:
            return dict(self._snap[2])

    def progress_status(self) -> dict[str, Any]:
        """TS 28.105 ``ProcessMonitor`` as of the latest iteration or change of state (a copy)."""
        with self._lock:
            return dict(self._snap[3])

    @property
    def request_status(self) -> str:
        """TS 28.105 ``RequestStatus`` of the request this process serves."""
        return threegpp.request_status(True, self.state)

    @property
    def report(self) -> TrainingReport | None:
        """The report once the process has ended, else None (interim reports: :attr:`process`)."""
        with self._lock:
            return self._report

    @property
    def error(self) -> BaseException | None:
        """The exception the run raised, if it raised one."""
        with self._lock:
            return self._error

    # ----------------------------------------------------------------------------------- controls
    def update(
        self,
        termination: Termination | dict[str, Any] | None = None,
        requirements: Requirements | dict[str, Any] | None = None,
    ) -> None:
        """New termination parameters or requirements (a dict is merged in), from the next iteration."""
        self._check_running("update")
        self.process.update(termination, requirements)

    def suspend(self) -> None:
        """Pause after the current iteration until :meth:`resume` (a queued process: do not start it until then)."""
        self._control(Suspend(True), "suspend")

    def resume(self) -> None:
        self._control(Suspend(False), "resume")

    def cancel(self) -> None:
        """End after the current iteration with a ``CANCELLED`` report; a queued process ends at once, without
        training; nothing happens once ended."""
        self._apply(Cancel())

    def _control(self, event: Event, what: str) -> None:
        for effect in self._apply(event):
            if isinstance(effect, Refused):
                self._check_running(what)
                raise ConfigError(f"process {self.id}: {effect.reason}; it cannot {what}")

    def add_data(self, data: Any) -> None:
        """More training data for the engine, taken at the next iteration or while awaiting data."""
        self._check_running("take data")
        self.process.add_data(data)

    def _check_running(self, what: str) -> None:
        if self.phase is Phase.ENDED:
            raise ConfigError(f"process {self.id} has ended ({self.state.value}); it cannot {what} any more")

    # ----------------------------------------------------------------------------------- training thread
    def _take(self) -> tuple[ProcessState, int, dict[str, float], dict[str, Any]]:
        p = self.process
        return p.state, p.n, dict(p.latest), p.progress_status()

    def _refresh(self) -> None:
        snap = self._take()
        with self._lock:
            self._snap = snap

    def _on_event(self, event: IterationEvent, process: TrainingProcess) -> None:
        self._refresh()
        if self._user_event is not None:
            self._user_event(event, process)

    def _on_state(self, state: ProcessState, process: TrainingProcess, report: TrainingReport | None) -> None:
        self._refresh()
        if state not in _ENDED:  # the end is applied once the report is kept
            self._apply(Iteration(state.value))
        if self._user_state is not None:
            self._user_state(state, process, report)

    def _run(self) -> None:
        report: TrainingReport | None = None
        error: BaseException | None = None
        try:
            report = self.process.run()
        except BaseException as exc:  # noqa: BLE001 - kept for the caller, reported as ENGINE_FAILURE
            error = exc
            report = self._failure(exc)
        self._finish(report, error)

    def _finish(self, report: TrainingReport, error: BaseException | None) -> None:
        try:
            with self._lock:
                self._report, self._error = report, error
                if error is not None or self._record.phase is Phase.QUEUED:
                    status = threegpp.process_monitor(report.status, report.progress_percent, report.cause.value)
                    self._snap = (report.status, report.iterations, self._snap[2], status)
            self._apply(Ended(refused=report.iterations == 0 and report.cause in _REFUSED))
            if self._on_done is not None:
                self._on_done(self)
        finally:
            self._done.set()

    def _end_unstarted(self, end: EndWith) -> None:
        """A process cancelled in the queue: its report, with no training."""
        p = self.process
        self._finish(TrainingReport(cause=Cause(end.cause), status=ProcessState(end.status), detail=end.detail,
                                    model=p.model, iterations=end.iterations), None)

    def _failure(self, exc: BaseException) -> TrainingReport:
        p = self.process
        if p.report is not None and p.report.status in _ENDED:
            return p.report
        return TrainingReport(
            cause=Cause.ENGINE_FAILURE, status=ProcessState.FAILED, detail=f"{type(exc).__name__}: {exc}",
            model=p.model, performance=dict(p.latest), duration_s=p.elapsed_s, iterations=p.n,
            bytes_up=p.bytes_up, bytes_down=p.bytes_down,
        )


def new_process_id() -> str:
    """A fresh process id (16 random hex digits)."""
    return uuid.uuid4().hex[:16]


class ProcessRegistry:
    """Training processes by id (thread-safe)."""

    def __init__(self) -> None:
        self._handles: dict[str, ProcessHandle] = {}
        self._lock = threading.Lock()

    def add(self, handle: ProcessHandle) -> ProcessHandle:
        """Register ``handle`` under its id; an id already taken is a :class:`ConfigError`."""
        with self._lock:
            if handle.id in self._handles:
                raise ConfigError(f"a training process with id {handle.id!r} is already registered")
            self._handles[handle.id] = handle
        return handle

    def get(self, process_id: str) -> ProcessHandle:
        """The process with id ``process_id``; :class:`UnknownProcessError` when there is none."""
        with self._lock:
            handle = self._handles.get(process_id)
            if handle is not None:
                return handle
            known = sorted(self._handles)
        shown = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "") if known else "none"
        raise UnknownProcessError(f"no training process with id {process_id!r}; known ids: {shown}")

    def remove(self, process_id: str) -> ProcessHandle:
        """Forget the process ``process_id`` (it is cancelled first if it still runs)."""
        handle = self.get(process_id)
        handle.cancel()
        with self._lock:
            self._handles.pop(process_id, None)
        return handle

    def list(self, *, active: bool | None = None) -> list[ProcessHandle]:
        """Every registered process in registration order; ``active`` keeps only running (True) or ended
        (False) ones."""
        with self._lock:
            handles = list(self._handles.values())
        return handles if active is None else [h for h in handles if h.done() != active]

    def __contains__(self, process_id: object) -> bool:
        with self._lock:
            return process_id in self._handles

    def __len__(self) -> int:
        with self._lock:
            return len(self._handles)

    def __iter__(self) -> Iterator[ProcessHandle]:
        return iter(self.list())
