"""One job trained under the control plane into a run directory: what ``sluice run``, ``sluice local``,
``sluice split run``, the Flower ServerApp and :func:`sluice.run_task` share.

:func:`run_job` builds the job's engine, trains it through :class:`sluice.control.TrainingProcess` with a
progress bar, and keeps a run directory: ``config.toml`` (the resolved job), ``metrics.jsonl`` (one line
per iteration), ``status.json`` (rewritten every iteration: state, progress, estimates), ``report.json``,
``summary.json``, the model and plots. Ctrl-C cancels after the current iteration (a ``CANCELLED`` report
and the model so far); a second Ctrl-C aborts. An error before training starts leaves no run directory.
The exit status is the report's (:data:`sluice.control.report.EXIT_CODES`): 0 only on success.
:func:`train_hfl` (the simulator) and :func:`train_local` train the jobs of those two engines with their
summaries and plots.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sluice.runs import History, RunDir

if TYPE_CHECKING:
    from sluice.control import TrainingProcess, TrainingReport
    from sluice.engine import Engine
    from sluice.runtimes.jobs import Job

Summarize = Callable[["History", "Engine", float], dict[str, Any]]
Plot = Callable[[list[dict[str, Any]], Path], None]


def mb(n: float) -> str:
    return f"{n / 1e6:.3f} MB"


def report_table(report: TrainingReport, title: str = "Training report") -> Table:
    table = Table(title=title)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    colour = "green" if report.ok else "red" if report.status.value == "FAILED" else "yellow"
    for key, value in report.rows():
        table.add_row(key, f"[{colour}]{value}[/]" if key == "cause" else value)
    return table


CLIENT_ROWS = 20
""":func:`client_table` shows at most this many clients (report.json holds them all)."""


def client_table(report: TrainingReport, title: str = "Clients", limit: int = CLIENT_ROWS) -> Table | None:
    """Each client's part in a federated training (the report's ``clients``), one row per client, the first
    ``limit`` of them; None when the report has no clients."""
    if not report.clients:
        return None
    table = Table(title=title)
    for name in ("client", "rounds", "dropped", "resynced", "samples", "training"):
        table.add_column(name, justify="right")
    table.add_column("last performance", overflow="fold")
    for c in report.clients[:limit]:
        perf = ", ".join(f"{k} {v:.4g}" for k, v in sorted(c.performance.items()))
        table.add_row(str(c.id), str(c.rounds), str(c.dropped), str(c.resynced), f"{c.samples:,}",
                      f"{c.training_s:.2f} s", perf or "-")
    if len(report.clients) > limit:
        table.caption = f"the first {limit} of {len(report.clients)} clients (all in report.json)"
    return table


def summary_table(summary: dict[str, Any], title: str) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        if isinstance(value, dict | list):
            continue
        shown = mb(value) if key.startswith("total_bytes") and value is not None else (
            f"{value:.4f}" if isinstance(value, float) else str(value))
        table.add_row(key, shown)
    return table


def eta_text(est: dict[str, Any]) -> str:
    """The live estimate of the iterations the target still needs: ``120 (90–160)``, ``>90`` (open above, no
    point estimate) or ``-``."""
    mid, lo, hi = (est.get(k) for k in ("remaining_iterations", "remaining_iterations_low",
                                          "remaining_iterations_high"))
    if mid is None:
        return "-" if lo is None else f">{lo}"
    return f"{mid} ({lo}–{'…' if hi is None else hi})"


def _past_runs(run: RunDir, kind: str, proc: TrainingProcess) -> list[int]:
    """When the runs of the same job shape in this run's parent directory met this run's target (the history
    its estimate of the remaining iterations learns from)."""
    import tomllib

    from sluice.control.history import job_shape, past_iterations, runs_dir_history, target_of

    target = target_of(proc.termination, proc.requirements, proc.model, proc.monitor.specs)
    if target is None:
        return []
    shape = job_shape(kind, tomllib.loads((run.path / "config.toml").read_text(encoding="utf-8")))
    return past_iterations(runs_dir_history(run.path.parent, kind, exclude=run.path), proc.model, target, shape)


def write_status(run: RunDir, proc: TrainingProcess) -> None:
    """``status.json``: the process's TS 28.105 ``ProcessMonitor`` plus Sluice's live estimates."""
    run.write_json("status.json", proc.progress_status())


class _CancelOnInterrupt:
    """While active, the first SIGINT cancels ``proc`` after its current iteration; the second aborts."""

    def __init__(self, proc: TrainingProcess, console: Console) -> None:
        self.proc, self.console = proc, console
        self.previous: Any = None
        self.hits = 0

    def _handler(self, signum: int, frame: Any) -> None:
        self.hits += 1
        if self.hits > 1:
            raise KeyboardInterrupt
        self.console.print("[yellow]cancelling after this iteration (Ctrl-C again to abort)[/]")
        self.proc.cancel()

    def __enter__(self) -> _CancelOnInterrupt:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def _progress_bar(engine: Engine, unit: str, console: Console, total: int | None) -> tuple[Progress, Any, str]:
    """A run's live bar (loss, the test score, the live estimate and, for an engine that counts bytes, the bytes
    each way), its task and the metric it shows: accuracy, or a regression task's RMSE."""
    metric, label = ("test_accuracy", "acc") if "test_accuracy" in engine.metrics else ("test_rmse", "rmse")
    columns = [TextColumn(f"[bold blue]{unit}"), MofNCompleteColumn(), BarColumn(),
               TextColumn("loss {task.fields[loss]}"), TextColumn(label + " {task.fields[score]}"),
               TextColumn("to target {task.fields[eta]}")]
    if engine.counts_bytes:
        columns += [TextColumn("up {task.fields[up]}"), TextColumn("down {task.fields[down]}")]
    columns.append(TimeElapsedColumn())
    progress = Progress(*columns, console=console, transient=False)
    task = progress.add_task("train", total=total, loss="-", score="-", up="0", down="0", eta="-")
    return progress, task, metric


class _Notes:
    """The engine's notes (settings it chose, a stall it noticed), each printed once when first seen."""

    def __init__(self, console: Console) -> None:
        self.console, self.said = console, 0

    def new(self, proc: Any) -> dict[str, list[str]]:
        """``{"notes": [...]}`` with the notes said since the last call (for the iteration's log line), or {}."""
        fresh = proc.notes()[self.said:]
        self.said += len(fresh)
        for note in fresh:
            self.console.print(f"[yellow]note[/]: {escape(note)}")
        return {"notes": fresh} if fresh else {}


def run_job(
    job: Job,
    out: str | None,
    *,
    console: Console,
    unit: str,
    prefix: str,
    summarize: Summarize | None = None,
    plot: Plot | None = None,
    inbox_adapter: Callable[[dict[str, Any]], Any] | None = None,
    describe: Callable[[Engine], str] | None = None,
    engine: Engine | None = None,
) -> int:
    """Train ``job`` (or the ready ``engine`` built for it) under the control plane; return the exit status."""
    from sluice.control import ProcessHooks, ProcessOptions, ResourceSampler, TrainingProcess
    from sluice.control.inbox import inbox_of

    t_start = time.perf_counter()
    engine = engine if engine is not None else job.build()
    termination = job.termination_for(engine)
    history = History(unit)
    run = RunDir(out, prefix=prefix)
    try:
        progress, task, metric = _progress_bar(engine, unit, console, termination.iterations)
        notes = _Notes(progress.console)

        def on_event(event: Any, proc: TrainingProcess) -> None:
            est = proc.estimate_record()
            run.log({**history.add(event), **est, **notes.new(proc)})
            write_status(run, proc)
            score, loss = history.last(metric), history.last("train_loss")
            progress.update(task, completed=proc.n, score=f"{score:.4f}" if score is not None else "-",
                            loss=f"{loss:.4f}" if loss is not None else "-", eta=eta_text(est),
                            up=mb(history.cum_bytes_up), down=mb(history.cum_bytes_down))

        def on_state(state: Any, proc: TrainingProcess, report: TrainingReport | None) -> None:
            write_status(run, proc)
            if state.value == "AWAITING_DATA":
                progress.console.print(
                    f"[yellow]awaiting data[/] ({report.detail if report else ''}); add some with "
                    f"`sluice data add {run.path} FILE.npz` within {proc.termination.data_wait_s:g} s"
                )

        proc = TrainingProcess(
            engine, termination, job.requirements, job.model, hooks=ProcessHooks(on_event=on_event, on_state=on_state),
            options=ProcessOptions(save_path=run.path / "model.pt", sampler=ResourceSampler(),
                                   inbox=inbox_of(run.path), inbox_adapter=inbox_adapter),
        )
        run.write_config(job.dump())
        proc.use_history(_past_runs(run, prefix, proc))
        if describe is not None:
            engine.start()  # idempotent; a description may need the engine's data and model
            console.print(describe(engine))
        with progress, _CancelOnInterrupt(proc, console):
            report = proc.run()
    except BaseException:
        if run.path.joinpath("report.json").exists() or history.records:
            run.close()
        else:
            run.discard()
        raise
    with run:
        summary = summarize(history, engine, time.perf_counter() - t_start) if summarize else None
        if summary is not None:
            run.write_json("summary.json", summary)
        run.write_json("report.json", report.to_json())
        if plot is not None and history.records:
            try:
                plot(history.records, run.path)
            except Exception as exc:  # noqa: BLE001 - a missing plot must not fail a finished run
                console.print(f"[yellow]no plot: {exc}[/]")
    if summary is not None:
        console.print(summary_table(summary, f"Sluice {job.kind} — {run.path}"))
    console.print(report_table(report, f"Training report — {run.path}"))
    return report.exit_code


# ------------------------------------------------------------------------------------- the two trainers


def inbox_item(data: dict[str, Any]) -> tuple[int, Any, Any]:
    """An inbox file as the HFL engine takes it: ``(client, X, y)``, client 0 when the file names none."""
    return data.get("client", 0), data["X"], data["y"]


def summarize_hfl(history: Any, engine: Any, wall: float) -> dict[str, Any]:
    """``summary.json`` of an HFL run; on a scenario also its model type and the last value of each of its
    type-specific errors (``final_<metric>``)."""
    out = {
        "final_accuracy": history.last("test_accuracy"),
        "best_accuracy": history.best("test_accuracy"),
        "total_bytes_up": history.cum_bytes_up,
        "total_bytes_down": history.cum_bytes_down,
        "rounds": len(history.records),
        "wall_seconds": round(wall, 3),
        "num_params": engine.num_params,
    }
    data = engine.data
    if data.model_type is not None:
        out["model_type"] = data.model_type
        out.update({f"final_{name}": history.last(name) for name in data.metric_fns})
    return out


def _describe_hfl(engine: Any) -> str:
    cfg = engine.cfg
    c = cfg.compression
    task = engine.data.task
    split = "the task's own" if task.per_client else cfg.data.partition or task.partition.method
    if task.model_type is not None:
        split += f", {task.model_type}"
    up = "dense" if c.up == "dense" else f"{c.up}({c.up_ratio:.4g})"
    if c.uplink is not None:
        up = f"{escape(c.uplink)}({c.up_ratio:.4g})"
    down = "dense"
    if c.down != "dense":
        down = f"{c.down}({c.down_ratio:.4g})" if c.down_ratio is not None else f"{c.down}({c.budget:.4g}·M/N)"
    return (f"[bold]sluice run[/]: {escape(task.name)}, {len(engine.data.clients)} clients ({split}), "
            f"q={cfg.train.participation}, d={engine.num_params}; up={up} down={down} downlink={c.downlink}")


def train_hfl(job: Any, out: str | None, console: Console) -> int:
    """Train an ``hfl`` job in the simulator into run directory ``out``; the exit status."""
    from sluice.runtimes.plots import plot_accuracy, plot_metrics

    engine = job.build()

    def plot(records: list[dict[str, Any]], run_dir: Path) -> None:
        """Accuracy, and a scenario's type-specific errors, against the round and the megabytes sent."""
        plot_accuracy(records, run_dir)
        plot_metrics(records, run_dir, list(engine.data.metric_fns) if engine.data is not None else [])

    return run_job(job, out, console=console, unit="round", prefix="run", summarize=summarize_hfl,
                   plot=plot, describe=_describe_hfl, inbox_adapter=inbox_item, engine=engine)


def train_local(job: Any, out: str | None, console: Console) -> int:
    """Train a ``local`` job into run directory ``out``; the exit status."""
    engine = job.build()

    def plot(records: list[dict[str, Any]], run_dir: Path) -> None:
        """A scenario's type-specific errors against the iteration (nothing for the embedded datasets)."""
        from sluice.runtimes.plots import plot_metrics

        plot_metrics(records, run_dir, list(engine.metric_fns), key="iteration", bytes_axis=False)

    def summarize(history: Any, engine: Any, wall: float) -> dict[str, Any]:
        """``summary.json``: the last value of each test metric, the iterations, the time and the model size."""
        last = history.records[-1] if history.records else {}
        return {**{f"final_{k}": v for k, v in last.items() if k.startswith("test_") or k in engine.metric_fns},
                "iterations": len(history.records), "wall_seconds": round(wall, 3), "num_params": engine.num_params}

    return run_job(job, out, console=console, unit="iteration", prefix="local", plot=plot, engine=engine,
                   summarize=summarize)
