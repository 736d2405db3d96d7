"""What every training command shares: its arguments, and running one job under the control plane.

:func:`run_job` builds the job's engine, trains it through :class:`sluice.control.TrainingProcess` with a
progress bar, and keeps a run directory: ``config.toml`` (the resolved job), ``metrics.jsonl`` (one line
per iteration), ``status.json`` (rewritten every iteration: state, progress, estimates), ``report.json``,
``summary.json``, the model and plots. Ctrl-C cancels after the current iteration (a ``CANCELLED`` report
and the model so far); a second Ctrl-C aborts. An error before training starts leaves no run directory.
The exit status is the report's (:data:`sluice.control.report.EXIT_CODES`): 0 only on success.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sluice.runs import History, RunDir

if TYPE_CHECKING:
    from sluice.control import TrainingProcess, TrainingReport
    from sluice.engine import Engine
    from sluice.jobs import Job

Summarize = Callable[["History", "Engine", float], dict[str, Any]]
Plot = Callable[[list[dict[str, Any]], Path], None]


def add_config_arguments(p: argparse.ArgumentParser, *, out_default: str | None, example: str) -> None:
    """``[config]``, ``--out DIR`` (when ``out_default`` is given) and repeatable ``--set key=value``."""
    p.add_argument("config", nargs="?", help="TOML config file (default: built-in)")
    if out_default is not None:
        p.add_argument("--out", help=f"run directory (default: {out_default})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a config value, e.g. --set {example} (repeatable)")


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
    from sluice.control import ResourceSampler, TrainingProcess
    from sluice.control.inbox import inbox_of

    t_start = time.perf_counter()
    engine = engine if engine is not None else job.build()
    termination = job.termination_for(engine)
    history = History(unit)
    run = RunDir(out, prefix=prefix)
    try:
        # the test score shown: accuracy, or a regression task's RMSE
        metric, label = ("test_accuracy", "acc") if "test_accuracy" in engine.metrics else ("test_rmse", "rmse")
        columns = [TextColumn(f"[bold blue]{unit}"), MofNCompleteColumn(), BarColumn(),
                   TextColumn("loss {task.fields[loss]}"), TextColumn(label + " {task.fields[score]}")]
        if engine.counts_bytes:
            columns += [TextColumn("up {task.fields[up]}"), TextColumn("down {task.fields[down]}")]
        columns.append(TimeElapsedColumn())
        progress = Progress(*columns, console=console, transient=False)
        task = progress.add_task("train", total=termination.iterations, loss="-", score="-", up="0", down="0")

        def on_event(event: Any, proc: TrainingProcess) -> None:
            run.log(history.add(event))
            write_status(run, proc)
            score, loss = history.last(metric), history.last("train_loss")
            progress.update(task, completed=proc.n, score=f"{score:.4f}" if score is not None else "-",
                            loss=f"{loss:.4f}" if loss is not None else "-",
                            up=mb(history.cum_bytes_up), down=mb(history.cum_bytes_down))

        def on_state(state: Any, proc: TrainingProcess, report: TrainingReport | None) -> None:
            write_status(run, proc)
            if state.value == "AWAITING_DATA":
                progress.console.print(
                    f"[yellow]awaiting data[/] ({report.detail if report else ''}); add some with "
                    f"`sluice data add {run.path} FILE.npz` within {proc.termination.data_wait_s:g} s"
                )

        proc = TrainingProcess(
            engine, termination, job.requirements, job.model, on_event=on_event, on_state=on_state,
            save_path=run.path / "model.pt", sampler=ResourceSampler(), inbox=inbox_of(run.path),
            inbox_adapter=inbox_adapter,
        )
        run.write_config(job.dump())
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
