"""A training process steered over a connection: the worker protocol of the management service.

:func:`run_steered` builds a job's engine (or takes one built by its caller, as the Flower ServerApp does) and
trains it through :class:`sluice.control.TrainingProcess` exactly as ``sluice run`` does (same termination
parameters, requirements, preflight, causes, estimates and resource sampler), talking to whoever steers it
over one :class:`multiprocessing.connection.Connection`:

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

A spec's ``history`` (the service's past runs of the job's shape ``history_shape``, as
:class:`~sluice.control.history.RunRecord` JSON) becomes the history of the process's remaining-iteration
estimate: the iterations of those runs that met a target at least as strict as the process's.

A process whose server goes away (the connection closes: the service stopped or was killed) cancels its
training and exits. An engine whose training runs elsewhere (a chain: its producers' requests) is first told
to ``detach``: it leaves that training running, for the restarted service to follow to its end.

A spec with ``resume`` (the last checkpoint of a process interrupted by a stopped service) restores the
engine and the process from it before training, and hands the engine only the uploads it had not taken
yet (the first ``data_taken`` of them are in the checkpoint); training then goes on from the checkpoint's
iteration exactly as it would have. A checkpoint that cannot be restored fails the process with the
reason.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any


def engine_data(kind: str, data: dict[str, Any]) -> Any:
    """What an engine of ``kind`` takes for uploaded arrays ``{"X", "y", "client"?}`` (the CLI's inbox
    adapter: horizontal FL gets ``(client, X, y)``, client 0 when none is named)."""
    import numpy as np

    X, y = np.asarray(data["X"]), np.asarray(data["y"])
    if kind == "hfl":
        return int(data.get("client", 0)), X, y
    return {"X": X, "y": y}


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


def _build(spec: dict[str, Any], send: _Sender, engine: Any = None) -> tuple[Any, Any]:
    """The engine and the :class:`~sluice.control.TrainingProcess` of ``spec``, reporting through ``send``."""
    from sluice.control import ProcessHooks, ProcessOptions, ResourceSampler, TrainingProcess
    from sluice.control.params import parse_requirements, parse_termination
    from sluice.runtimes.jobs import job_from_dict

    job = job_from_dict(spec["kind"], spec["raw"])
    engine = job.build() if engine is None else engine
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
    hooks = ProcessHooks(on_event=on_event, on_state=on_state, on_checkpoint=on_checkpoint, checkpoint_every=every)
    proc = TrainingProcess(engine, termination, job.requirements, job.model, hooks=hooks,
                           options=ProcessOptions(save_path=work / "model.pt", sampler=ResourceSampler()))
    if spec.get("history"):
        from sluice.control.history import RunHistory, RunRecord, past_iterations, target_of

        hist = RunHistory()
        for record in spec["history"]:
            hist.add(RunRecord.model_validate(record))
        target = target_of(proc.termination, proc.requirements, proc.model, proc.monitor.specs)
        proc.use_history(past_iterations(hist, proc.model, target, spec.get("history_shape")))
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
            detach = getattr(engine, "detach", None)
            if callable(detach):  # what it trains elsewhere is not the consumer's cancel: it goes on
                detach()
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


def run_steered(spec: dict[str, Any], conn: Connection, engine: Any = None) -> None:
    """Run one training process (see the module docstring); ``spec`` holds the job, the agreed
    termination parameters and requirements, and the data uploaded for it so far; ``engine``, when given,
    is the job's engine already built."""
    send = _Sender(conn)
    kind = spec["kind"]
    try:
        engine, proc = _build(spec, send, engine)
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
