"""Training processes in worker processes, and the supervisor that queues, starts and listens to them.

Each training process runs in its own OS process (never in the web server's threads): :func:`worker_main`
runs it with :func:`sluice.runtimes.remote.run_steered` (the worker protocol: messages both ways over one
:class:`multiprocessing.connection.Connection`), or, for a job on one of the service's Flower federations,
relays that protocol to the Flower run that trains it (:mod:`sluice.runtimes.flower.relay`).

:class:`Supervisor` starts at most ``max_concurrent`` workers; which queued process runs next is the
service's choice (``pick_next``: highest ``priority`` first). Workers start from a forkserver that has
torch and the engines preloaded (``worker_start = "forkserver"``), or by spawning a fresh interpreter.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from sluice.runtimes.remote import run_steered

PRELOAD = ["torch", "numpy", "sklearn.datasets", "sklearn.model_selection", "sluice.data", "sluice.models",
           "sluice.control", "sluice.runtimes.jobs", "sluice.local", "sluice.local.trainer", "sluice.hfl",
           "sluice.runtimes.remote", "sluice.service.worker",
           # what a worker imports later, on its way to the first iteration: torch's optimizers import
           # torch._dynamo when the first one is built (about 1 s of CPU in every worker otherwise); the
           # tasks, datasets and engines a default job builds; the probe of what an engine reports
           "torch._dynamo", "sluice.tasks.builtin", "sluice.tasks.resolve", "sluice.data.scenarios",
           "sluice.local.config", "sluice.hfl.engine", "sluice.service.capabilities"]


def warm_forkserver() -> None:
    """Start the workers' forkserver, with :data:`PRELOAD` imported, in the background (at most once)."""
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    threading.Thread(target=forkserver.ensure_running, name="sluice-forkserver", daemon=True).start()


def worker_main(spec: dict[str, Any], conn: Connection) -> None:
    """Run the training process of ``spec`` in this worker, or on its Flower federation when it names one."""
    if spec.get("federation") is not None:
        from sluice.runtimes.flower.relay import relay

        relay(spec, conn)
    else:
        run_steered(spec, conn)


# --------------------------------------------------------------------------------------- server side


@dataclass
class Worker:
    """One running worker, as the supervisor sees it."""

    ldn: str
    process: Any
    conn: Connection
    started: float = field(default_factory=time.time)
    ended: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class WorkerGone(Exception):
    """The worker of a process is not running (it ended or never started)."""


class Supervisor:
    """Starts queued processes in workers (at most ``max_concurrent``) and hands their messages on.

    ``pick_next()`` returns the spec of the next process to start (and marks it started) or None;
    ``on_message(ldn, msg)`` gets every message but acks, in this supervisor's thread; a worker that
    exits without ``done`` or ``failed`` produces ``{"kind": "died", "exitcode": n}``.

    The loop sleeps until something happens: a worker's message or exit, or :meth:`wake` (a socket in the
    same ``wait`` as the workers' connections). It asks ``pick_next`` only when the queue may have changed:
    at start, after :meth:`wake`, when a worker ended (a place freed) and after a ``pick_next`` that raised;
    never on a timer.
    """

    #: seconds between checks of workers that exited without closing their connection (a fallback: an exit
    #: closes it, and the loop wakes on that at once)
    reap_every_s = 0.5

    def __init__(self, max_concurrent: int, pick_next: Callable[[], dict[str, Any] | None],
                 on_message: Callable[[str, dict[str, Any]], None], *, start_method: str = "forkserver",
                 call_timeout_s: float = 30.0) -> None:
        self.max_concurrent = max_concurrent
        self.pick_next = pick_next
        self.on_message = on_message
        self.call_timeout_s = call_timeout_s
        self.start_method = start_method
        self.ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self.ctx.set_forkserver_preload(PRELOAD)
        self.workers: dict[str, Worker] = {}
        self._lock = threading.Lock()
        self._registered = threading.Condition(self._lock)
        self._wake = threading.Event()  # the queue may have changed: ask pick_next
        self._wake.set()  # processes queued before the service started
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stop = threading.Event()
        self._tokens = itertools.count(1)
        self._acks: dict[int, tuple[threading.Event, dict[str, Any]]] = {}
        self._thread = threading.Thread(target=self._loop, name="sluice-supervisor", daemon=True)

    def start(self) -> Supervisor:
        if self.start_method == "forkserver":  # load the preloaded modules now, not on the first request
            warm_forkserver()
        self._thread.start()
        return self

    def wake(self) -> None:
        """Look at the queue now (a process was queued, resumed or re-prioritised)."""
        self._wake.set()
        try:
            self._wake_w.send(b"w")
        except OSError:  # full (the loop is awake and will look) or closed (stopped)
            pass

    def alive(self) -> bool:
        """Whether the loop that starts and listens to workers runs."""
        return self._thread.is_alive() and not self._stop.is_set()

    def running(self) -> list[str]:
        with self._lock:
            return [w.ldn for w in self.workers.values() if not w.ended]

    # ------------------------------------------------------------------ commands
    def send(self, ldn: str, cmd: dict[str, Any], wait_s: float = 30.0) -> None:
        """Send ``cmd`` to the worker of ``ldn``; a process just picked from the queue may not have its worker
        yet: wait up to ``wait_s`` for it."""
        deadline = time.monotonic() + wait_s
        with self._registered:
            while (w := self.workers.get(ldn)) is None and time.monotonic() < deadline:
                self._registered.wait(max(0.0, deadline - time.monotonic()))
        if w is None or w.ended:
            raise WorkerGone(ldn)
        try:
            with w.lock:
                w.conn.send(cmd)
        except (OSError, EOFError, BrokenPipeError) as exc:
            raise WorkerGone(ldn) from exc

    def call(self, ldn: str, cmd: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send a command that the worker acknowledges; its ``ack`` (``ok``, ``error``)."""
        token = next(self._tokens)
        ev = threading.Event()
        box: dict[str, Any] = {}
        with self._lock:
            self._acks[token] = (ev, box)
        try:
            self.send(ldn, {**cmd, "token": token})
            if not ev.wait(timeout or self.call_timeout_s):
                return {"ok": False, "error": "the training process did not answer in time", "timeout": True}
            return box
        finally:
            with self._lock:
                self._acks.pop(token, None)

    # ------------------------------------------------------------------ loop
    def _launch(self, spec: dict[str, Any]) -> None:
        parent, child = self.ctx.Pipe(duplex=True)
        p = self.ctx.Process(target=worker_main, args=(spec, child), name=f"sluice-worker-{spec['process']}",
                             daemon=True)
        p.start()
        child.close()
        with self._registered:
            self.workers[spec["process"]] = Worker(spec["process"], p, parent)
            self._registered.notify_all()

    def _fill(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                n = sum(1 for w in self.workers.values() if not w.ended)
            if n >= self.max_concurrent:
                return
            spec = self.pick_next()
            if spec is None:
                return
            try:
                self._launch(spec)
            except Exception as exc:  # noqa: BLE001 - the process fails with the reason, the service goes on
                self.on_message(spec["process"], {"kind": "failed", "error": f"worker did not start: {exc}",
                                                  "before_training": True})

    def _handle(self, w: Worker, msg: dict[str, Any]) -> None:
        if msg.get("kind") == "ack":
            with self._lock:
                entry = self._acks.get(msg.get("token", -1))
            if entry is not None:
                entry[1].update(msg)
                entry[0].set()
            return
        if msg.get("kind") in ("done", "failed", "refused"):
            w.ended = True
            self._wake.set()  # its place is free
        self.on_message(w.ldn, msg)

    def _loop(self) -> None:
        next_reap = time.monotonic() + self.reap_every_s
        while not self._stop.is_set():
            if self._wake.is_set():
                self._wake.clear()
                try:
                    self._fill()
                except Exception:  # noqa: BLE001 - a database hiccup: try again on the next turn
                    traceback.print_exc()
                    self._wake.set()
            with self._lock:
                live = {w.conn: w for w in self.workers.values()}
            timeout = self.reap_every_s if live else None
            if self._wake.is_set():
                timeout = self.reap_every_s  # pick_next raised: try again soon, not at once
            ready = wait([*live, self._wake_r], timeout=timeout)
            for conn in ready:
                if conn is self._wake_r:
                    self._drain_wake()
                    continue
                self._read(live[conn])  # type: ignore[index]
            if live and time.monotonic() >= next_reap:
                next_reap = time.monotonic() + self.reap_every_s
                self._reap_exited(list(live.values()))

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:  # nothing more to read (or closed by stop)
            pass

    def _read(self, w: Worker) -> None:
        try:
            while w.conn.poll():
                self._handle(w, w.conn.recv())
        except (EOFError, OSError):
            self._reap(w)
        except Exception:  # noqa: BLE001 - keep serving the other workers
            traceback.print_exc()

    def _reap_exited(self, workers: list[Worker]) -> None:
        for w in workers:
            with self._lock:
                current = self.workers.get(w.ldn) is w
            if not current:
                continue
            try:
                if not w.process.is_alive() and not w.conn.poll():
                    self._reap(w)
            except OSError:
                self._reap(w)

    def _reap(self, w: Worker) -> None:
        w.process.join(1.0)
        with self._lock:
            if self.workers.get(w.ldn) is not w:
                return
            self.workers.pop(w.ldn, None)
        self._wake.set()  # its place is free (a died one is queued again)
        try:
            w.conn.close()
        except OSError:
            pass
        if not w.ended:
            w.ended = True
            self.on_message(w.ldn, {"kind": "died", "exitcode": w.process.exitcode})

    def stop(self, grace_s: float = 5.0) -> None:
        """Cancel every worker, wait ``grace_s`` for them, then end the rest."""
        self._stop.set()
        self.wake()
        if self._thread.is_alive():
            self._thread.join(5.0)
        for sock in (self._wake_r, self._wake_w):
            sock.close()
        with self._lock:
            workers = list(self.workers.values())
        for w in workers:
            try:
                with w.lock:
                    w.conn.close()
            except OSError:
                pass
        deadline = time.time() + grace_s
        for w in workers:
            w.process.join(max(0.0, deadline - time.time()))
        for w in workers:
            if w.process.is_alive():
                w.process.terminate()
                w.process.join(2.0)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(2.0)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
