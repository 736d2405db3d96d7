"""What a :class:`sluice.control.TrainingProcess` says of its state: its reports, its live status and its
checkpoint, each built from the process's public attributes (``n``, ``elapsed_s``, ``latest``, ``history``,
the byte and resource counts, ``clients``, ``data_refused``...), and a checkpoint restored into them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluice.control._outcome import estimator_for, requirements_met
from sluice.control.eta import Estimate
from sluice.control.monitor import Firing
from sluice.control.params import Cause, ProcessState
from sluice.control.report import TrainingReport, json_ready
from sluice.engine import Engine
from sluice.errors import ConfigError

INADEQUATE = Cause.INADEQUATE_TRAINING_DATA.value


def estimate_fields(e: Estimate) -> dict[str, Any]:
    """The estimate as a :class:`~sluice.control.report.TrainingReport` and the live status name it."""
    return {
        "progress_percent": e.progress_percent,
        "estimated_remaining_iterations": e.remaining_iterations,
        "estimated_remaining_iterations_low": e.remaining_low,
        "estimated_remaining_iterations_high": e.remaining_high,
        "reach_probability": e.reach_probability,
        "estimated_remaining_s": e.remaining_s,
        "estimated_remaining_s_low": e.remaining_s_low,
        "estimated_remaining_s_high": e.remaining_s_high,
        "estimate_note": e.note,
    }


def estimate_line(e: Estimate) -> dict[str, Any]:
    """The estimate as a ``metrics.jsonl`` line carries it: ``remaining_iterations`` with
    ``remaining_iterations_low`` / ``_high`` (the 80 % interval), ``reach_probability`` and
    ``progress_percent``; ``remaining_reason`` says why when there is no estimate."""
    out = {"remaining_iterations": e.remaining_iterations, "remaining_iterations_low": e.remaining_low,
           "remaining_iterations_high": e.remaining_high, "reach_probability": e.reach_probability,
           "remaining_s": e.remaining_s, "remaining_s_low": e.remaining_s_low,
           "remaining_s_high": e.remaining_s_high, "progress_percent": e.progress_percent}
    return out if e.remaining_iterations is not None else {**out, "remaining_reason": e.note}


def engine_notes(engine: Engine) -> list[str]:
    """The engine's ``notes()`` (an engine may have none)."""
    fn = getattr(engine, "notes", None)
    return list(fn()) if callable(fn) else []


def engine_data_report(engine: Engine) -> dict[str, Any]:
    """The engine's ``data_report()`` (an engine may have none)."""
    fn = getattr(engine, "data_report", None)
    return dict(fn()) if callable(fn) else {}


def report_of(proc: Any, cause: Cause, detail: str, state: ProcessState, firing: Firing | None = None,
              model_path: str | None = None) -> TrainingReport:
    """The report of process ``proc`` as it stands, ending (or pausing) with ``cause`` in ``state``; its
    estimate counts the result as reached when the cause is CRITERION_MET."""
    e = proc.estimator.estimate(proc.n, proc.elapsed_s, reached=cause == Cause.CRITERION_MET)
    return TrainingReport(
        cause=cause, status=state, criterion=firing, detail=detail, model=proc.model,
        performance=dict(proc.latest), termination=proc.termination, requirements=proc.requirements,
        requirements_met=requirements_met(proc.requirements, proc.latest, proc.monitor.specs),
        duration_s=proc.elapsed_s, iterations=proc.n, **estimate_fields(e), model_path=model_path,
        bytes_up=proc.bytes_up, bytes_down=proc.bytes_down,
        resources_peak=dict(proc.peak), awaited_data=proc.awaited, data_refused=list(proc.data_refused),
        clients=proc.clients.reports(), data=engine_data_report(proc.engine), notes=engine_notes(proc.engine),
    )


def status_of(proc: Any, e: Estimate) -> dict[str, Any]:
    """The live status of process ``proc`` with its estimate ``e``
    (:meth:`~sluice.control.TrainingProcess.progress_status`), JSON-ready."""
    return json_ready({
        "status": proc.state.value,
        "progressPercentage": None if e.progress_percent is None else int(e.progress_percent),
        "progressStateInfo": {"RUNNING": "TRAINING"}.get(proc.state.value, proc.state.value),
        "resultStateInfo": proc.report.cause.value if proc.report else (
            INADEQUATE if proc.state == ProcessState.AWAITING_DATA else ""),
        "iterations": proc.n,
        "elapsed_s": proc.elapsed_s,
        "metrics": dict(proc.latest),
        **estimate_fields(e),
        "bytes_up": proc.bytes_up,
        "bytes_down": proc.bytes_down,
        "data_refused": list(proc.data_refused),
        "participating_clients": proc.clients.participating(),
    })


def checkpoint_of(proc: Any) -> dict[str, Any]:
    """The checkpoint of process ``proc`` (:meth:`~sluice.control.TrainingProcess.checkpoint`)."""
    return {
        "n": proc.n, "elapsed_s": proc.elapsed_s, "latest": dict(proc.latest),
        "history": [[n, dict(m), dt] for n, m, dt in proc.history], "bytes_up": proc.bytes_up,
        "bytes_down": proc.bytes_down, "peak": dict(proc.peak), "awaited": proc.awaited,
        "data_refused": list(proc.data_refused), "data_taken": proc.data_taken, "monitor": proc.monitor.state(),
        "clients": proc.clients.state(),
    }


def restore_into(proc: Any, state: Mapping[str, Any]) -> None:
    """Set process ``proc`` to the checkpoint ``state`` (:meth:`~sluice.control.TrainingProcess.restore`):
    its counts, metrics, criteria and clients, and an estimator fed the restored history; a state that is
    not a checkpoint is a :class:`ConfigError`."""
    try:
        proc.n = int(state["n"])
        proc.elapsed_s = float(state["elapsed_s"])
        proc.latest = {str(k): float(v) for k, v in state["latest"].items()}
        proc.history = [(int(n), {str(k): float(v) for k, v in m.items()}, float(dt))
                        for n, m, dt in state["history"]]
        proc.bytes_up, proc.bytes_down = int(state["bytes_up"]), int(state["bytes_down"])
        proc.peak = {str(k): float(v) for k, v in state["peak"].items()}
        proc.awaited, proc.intake.taken = int(state["awaited"]), int(state["data_taken"])
        proc.intake.refused = [str(x) for x in state["data_refused"]]
        proc.monitor.load_state(state["monitor"])
        proc.clients.load_state(state.get("clients", []))  # none in a checkpoint made before it was kept
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"not a training process checkpoint: {type(exc).__name__}: {exc}") from None
    proc.estimator = estimator_for(proc.termination, proc.requirements, proc.monitor, proc.past_iterations,
                                   proc.history)
