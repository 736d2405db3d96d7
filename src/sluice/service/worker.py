"""Training processes in worker processes, and the supervisor that queues, starts and listens to them.

Each training process runs in its own OS process (never in the web server's threads): :func:`worker_main`
builds the job's engine and trains it through :class:`sluice.control.TrainingProcess` exactly as
``sluice run`` does (same termination parameters, requirements, preflight, causes, estimates and resource
sampler), and talks to the web server over one :class:`multiprocessing.connection.Connection`:

* worker → server: ``state`` (every change of state, with the live ``progress_status`` and the interim or
  final report), ``progress`` (after an iteration; at most every ``progress_interval_s`` unless the whole
  percent changed), ``ack`` (the answer to a command that can be refused), ``checkpoint`` (every
  ``checkpoint_every`` iterations: the engine's ``checkpoint()`` bytes and the process's
  :meth:`~sluice.control.TrainingProcess.checkpoint` as JSON bytes), ``done`` (the report and the saved
  model's bytes), ``refused`` (the parameters do not fit the engine: a metric it does not report, a
  threshold out of range; nothing was trained) and ``failed`` (the job could not be built, started or
  resumed);
* server → worker: ``cancel``, ``suspend``, ``resume``, ``update`` (termination parameters or
  requirements, from the next iteration) and ``data`` (training data, checked by the engine's
  ``check_data`` before it is queued; the ``ack`` carries the refusal).

A worker whose server goes away (the connection closes) cancels its training and exits.

A spec with ``resume`` (the last checkpoint of a process interrupted by a stopped service) restores the
engine and the process from it before training, and hands the engine only the uploads it had not taken
yet (the first ``data_taken`` of them are in the checkpoint); training then goes on from the checkpoint's
iteration exactly as it would have. A checkpoint that cannot be restored fails the process with the
reason.

:class:`Supervisor` starts at most ``max_concurrent`` workers; which queued process runs next is the
service's choice (``pick_next``: highest ``priority`` first). Workers start from a forkserver that has
torch and the engines preloaded (``worker_start = "forkserver"``), or by spawning a fresh interpreter.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

PRELOAD = ["torch", "numpy", "sklearn.datasets", "sklearn.model_selection", "sluice.data", "sluice.models",
           "sluice.control", "sluice.jobs", "sluice.local", "sluice.local.trainer", "sluice.hfl",
           "sluice.service.worker"]


def engine_data(kind: str, data: dict[str, Any]) -> Any:
    """What an engine of ``kind`` takes for uploaded arrays ``{"X", "y", "client"?}`` (the CLI's inbox
    adapter: horizontal FL gets ``(client, X, y)``, client 0 when none is named)."""
    import numpy as np

    X, y = np.asarray(data["X"]), np.asarray(data["y"])
    if kind == "hfl":
        return int(data.get("client", 0)), X, y
    return {"X": X, "y": y}


# --------------------------------------------------------------------------------------- worker side


class _Sender:
    """Messages to the service over ``conn``, from any thread; once the service is gone, none."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.gone = threading.Event()

    def __call__(self, msg: dict[str, Any]) -> None:
        if self.gone.is_set():
            return
        try:
            with self.lock:
                self.conn.send(msg)
        except (OSError, EOFError, BrokenPipeError):
            self.gone.set()


def _build(spec: dict[str, Any], send: _Sender) -> tuple[Any, Any]:
    """The engine and the :class:`~sluice.control.TrainingProcess` of ``spec``, reporting through ``send``."""
    from sluice.control import ResourceSampler, TrainingProcess
    from sluice.control.params import parse_requirements, parse_termination
    from sluice.jobs import job_from_dict

    job = job_from_dict(spec["kind"], spec["raw"])
    engine = job.build()
    if spec.get("termination") is not None:
        job.termination = parse_termination(spec["termination"])
    if spec.get("requirements") is not None:
        job.requirements = parse_requirements(spec["requirements"]) if spec["requirements"] else None
    termination = job.termination_for(engine)
    work = Path(spec.get("work_dir") or tempfile.mkdtemp(prefix="sluice-worker-"))
    work.mkdir(parents=True, exist_ok=True)
    interval = float(spec.get("progress_interval_s", 0.2))
    last = {"t": 0.0, "pct": None}

    def on_event(event: Any, proc: Any) -> None:
        now = time.monotonic()
        est = proc.estimator.estimate(proc.n, proc.elapsed_s)
        pct = None if est.progress_percent is None else int(est.progress_percent)
        if now - last["t"] >= interval or pct != last["pct"]:
            last["t"], last["pct"] = now, pct
            send({"kind": "progress", "status": proc.progress_status()})

    def on_state(state: Any, proc: Any, report: Any) -> None:
        send({"kind": "state", "state": state.value, "status": proc.progress_status(),
              "report": None if report is None else report.to_json()})

    def on_checkpoint(proc: Any) -> None:
        send({"kind": "checkpoint", "iteration": proc.n, "engine": engine.checkpoint(),
              "process": json.dumps(proc.checkpoint()).encode()})

    every = int(spec.get("checkpoint_every", 0)) if hasattr(engine, "checkpoint") else 0
    proc = TrainingProcess(engine, termination, job.requirements, job.model, on_event=on_event, on_state=on_state,
                           save_path=work / "model.pt", sampler=ResourceSampler(), checkpoint_every=every,
                           on_checkpoint=on_checkpoint)
    return engine, proc


def _command(msg: dict[str, Any], kind: str, engine: Any, proc: Any) -> bool:
    """Carry out one command of the service; False for ``stop``."""
    from sluice.control.params import parse_termination

    cmd = msg.get("cmd")
    if cmd == "cancel":
        proc.cancel()
    elif cmd == "suspend":
        proc.suspend()
    elif cmd == "resume":
        proc.resume()
    elif cmd == "update":
        term = msg.get("termination")
        if term is not None and msg.get("replace"):
            term = parse_termination(term)
        proc.update(term, msg.get("requirements"))
    elif cmd == "data":
        item = engine_data(kind, msg["data"])
        check = getattr(engine, "check_data", None)
        if check is None:
            raise ValueError(f"{kind} training takes no added data")
        check(item)
        proc.add_data(item)
    return cmd != "stop"


def _reader(conn: Connection, send: _Sender, kind: str, engine: Any, proc: Any) -> None:
    """The service's commands, each acknowledged (with the error of a refusal) when it carries a token."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            send.gone.set()
            proc.cancel()
            return
        token = msg.get("token")
        try:
            if not _command(msg, kind, engine, proc):
                return
            if token is not None:
                send({"kind": "ack", "token": token, "ok": True})
        except Exception as exc:  # noqa: BLE001 - the refusal goes back to the consumer
            if token is not None:
                send({"kind": "ack", "token": token, "ok": False, "error": str(exc)})


def _resume(resume: dict[str, Any], kind: str, engine: Any, proc: Any) -> None:
    if not hasattr(engine, "restore"):
        raise TypeError(f"the {kind} engine cannot restore a checkpoint")
    engine.restore(resume["engine"])  # before start: a split engine loads it as its parties start,
    # a chain follows its producers' requests instead of creating new ones
    proc.restore(json.loads(resume["process"]))


def worker_main(spec: dict[str, Any], conn: Connection) -> None:
    """Run one training process (see the module docstring); ``spec`` holds the job, the agreed
    termination parameters and requirements, and the data uploaded for it so far."""
    send = _Sender(conn)
    kind = spec["kind"]
    try:
        engine, proc = _build(spec, send)
    except Exception as exc:  # noqa: BLE001 - reported to the service as a refusal with its reason
        from sluice.errors import ConfigError

        if isinstance(exc, ConfigError):  # parameters the engine cannot honour: refused, nothing failed
            send({"kind": "refused", "error": str(exc)})
        else:
            send({"kind": "failed", "error": f"{type(exc).__name__}: {exc}", "before_training": True})
        conn.close()
        return
    uploads = list(spec.get("uploads", []))
    resume = spec.get("resume")
    if resume is not None:
        try:
            _resume(resume, kind, engine, proc)
            uploads = uploads[proc.data_taken:]
        except Exception as exc:  # noqa: BLE001 - the process fails with the reason
            send({"kind": "failed", "before_training": False, "error": "could not resume from the checkpoint of "
                  f"iteration {resume.get('iteration')}: {type(exc).__name__}: {exc}"})
            conn.close()
            return
    for item in uploads:
        proc.add_data(engine_data(kind, item))
    threading.Thread(target=_reader, args=(conn, send, kind, engine, proc), name="sluice-worker-commands",
                     daemon=True).start()
    try:
        report = proc.run()
    except Exception as exc:  # noqa: BLE001 - engine start or preflight raised
        send({"kind": "failed", "error": f"{type(exc).__name__}: {exc}", "before_training": proc.n == 0,
              "trace": traceback.format_exc(limit=5)})
        return
    model = None
    if report.model_path and Path(report.model_path).is_file():
        model = Path(report.model_path).read_bytes()
    send({"kind": "done", "report": report.to_json(), "model": model,
          "model_name": Path(report.model_path).name if report.model_path else None})
    try:
        conn.close()
    except OSError:
        pass


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
    """

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
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._tokens = itertools.count(1)
        self._acks: dict[int, tuple[threading.Event, dict[str, Any]]] = {}
        self._thread = threading.Thread(target=self._loop, name="sluice-supervisor", daemon=True)

    def start(self) -> Supervisor:
        if self.start_method == "forkserver":  # load the preloaded modules now, not on the first request
            from multiprocessing import forkserver

            threading.Thread(target=forkserver.ensure_running, name="sluice-forkserver", daemon=True).start()
        self._thread.start()
        return self

    def wake(self) -> None:
        """Look at the queue now (a process was queued, resumed or re-prioritised)."""
        self._wake.set()

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
        self.on_message(w.ldn, msg)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._fill()
            except Exception:  # noqa: BLE001 - a database hiccup: try again on the next turn
                traceback.print_exc()
            with self._lock:
                live = {w.conn: w for w in self.workers.values()}
            if not live:
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            ready = wait(list(live), timeout=0.05)
            for conn in ready:
                w = live[conn]  # type: ignore[index]
                try:
                    while conn.poll():
                        self._handle(w, conn.recv())
                except (EOFError, OSError):
                    self._reap(w)
                except Exception:  # noqa: BLE001 - keep serving the other workers
                    traceback.print_exc()
            for w in list(live.values()):
                with self._lock:
                    current = self.workers.get(w.ldn) is w
                if not current:
                    continue
                try:
                    if not w.process.is_alive() and not w.conn.poll():
                        self._reap(w)
                except OSError:
                    self._reap(w)
            if self._wake.is_set():
                self._wake.clear()

    def _reap(self, w: Worker) -> None:
        w.process.join(1.0)
        with self._lock:
            if self.workers.get(w.ldn) is not w:
                return
            self.workers.pop(w.ldn, None)
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
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
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
