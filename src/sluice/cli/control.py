"""Control-plane commands: ``sluice local`` (centralised training under termination parameters),
``sluice data add`` (more training data for a run that awaits it) and ``sluice report`` (show a report).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sluice.cli.common import add_config_arguments
from sluice.config import Section, load_config
from sluice.control import (
    ModelIdentity,
    ProcessState,
    Requirements,
    ResourceSampler,
    Termination,
    TrainingProcess,
    TrainingReport,
)
from sluice.control import inbox as _inbox
from sluice.errors import ConfigError, DataError
from sluice.runs import History, RunDir

# ------------------------------------------------------------------------------------------- helpers


def termination_for_run(termination: Termination | None, rounds: int) -> Termination:
    """The run's termination parameters: ``rounds`` is the iteration limit unless ``[termination]`` gives
    ``iterations`` itself."""
    t = termination or Termination()
    if t.iterations is None:
        t = t.model_copy(update={"iterations": rounds})
    return t


def report_table(report: TrainingReport, title: str = "Training report") -> Table:
    table = Table(title=title)
    table.add_column("field")
    table.add_column("value", overflow="fold")
    colour = "green" if report.ok else "yellow" if report.cause == "PERFORMANCE_NOT_MET" else "red"
    for key, value in report.rows():
        table.add_row(key, f"[{colour}]{value}[/]" if key == "cause" else value)
    return table


def status_writer(run: RunDir) -> Any:
    """An ``on_state`` callback that keeps ``status.json`` (a TS 28.105 ProcessMonitor) up to date."""

    def on_state(state: ProcessState, proc: TrainingProcess, report: TrainingReport | None) -> None:
        status = proc.progress_status()
        status["status"] = state.value
        if report is not None:
            status["resultStateInfo"] = report.cause.value
            status["detail"] = report.detail
        run.write_json("status.json", status)

    return on_state


# ------------------------------------------------------------------------------------------- sluice local


class LocalData(Section):
    dataset: Literal["digits", "breast_cancer", "mnist"] = "digits"
    test_fraction: float = Field(0.2, gt=0, lt=1)
    max_train_samples: int | None = Field(None, ge=1, description="start with only this many samples")


class LocalModel(Section):
    hidden: list[int] = Field(default_factory=lambda: [64])
    id: str = "local-mlp"
    version: str = "1"
    type: str | None = None


class LocalTrain(Section):
    iterations: int = Field(30, ge=1, description="epochs; the default iteration limit")
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    batch_size: int = Field(32, ge=1)
    min_samples: int = Field(1, ge=0, description="fewer samples = inadequate training data")


class LocalRunConfig(Section):
    seed: int = 0
    data: LocalData = Field(default_factory=LocalData)
    model: LocalModel = Field(default_factory=LocalModel)
    train: LocalTrain = Field(default_factory=LocalTrain)
    requirements: Requirements | None = None
    termination: Termination | None = None


def _local(args: argparse.Namespace) -> int:
    from sluice.data import load_dataset
    from sluice.local import LocalTrainer

    cfg = load_config(args.config, args.overrides, model=LocalRunConfig)
    try:
        identity = ModelIdentity(id=cfg.model.id, version=cfg.model.version, type=cfg.model.type)
    except ValueError as exc:
        raise ConfigError(f"model: {exc}") from exc
    termination = termination_for_run(cfg.termination, cfg.train.iterations)
    ds = load_dataset(cfg.data.dataset, seed=cfg.seed, test_fraction=cfg.data.test_fraction)
    n = cfg.data.max_train_samples or len(ds.y_train)
    engine = LocalTrainer(ds.X_train[:n], ds.y_train[:n], ds.X_test, ds.y_test, num_classes=ds.num_classes,
                          hidden=cfg.model.hidden, lr=cfg.train.lr, momentum=cfg.train.momentum,
                          batch_size=cfg.train.batch_size, min_samples=cfg.train.min_samples, seed=cfg.seed)
    console = Console()
    history = History("iteration")
    with RunDir(args.out, prefix="local") as run:
        run.write_config(cfg.model_dump())
        on_status = status_writer(run)
        columns = [TextColumn("[bold blue]iteration"), MofNCompleteColumn(), BarColumn(),
                   TextColumn("acc {task.fields[acc]}"), TimeElapsedColumn()]
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("train", total=termination.iterations, acc="-")

            def on_event(event: Any, proc: TrainingProcess) -> None:
                run.log(history.add(event))
                acc = event.metrics.get("test_accuracy")
                progress.update(task, completed=proc.n, acc=f"{acc:.4f}" if acc is not None else "-")

            def on_state(state: ProcessState, proc: TrainingProcess, report: TrainingReport | None) -> None:
                on_status(state, proc, report)
                if state == ProcessState.AWAITING_DATA:
                    progress.console.print(
                        f"[yellow]awaiting data[/] ({report.detail if report else ''}); add some with "
                        f"`sluice data add {run.path} FILE.npz` within {termination.data_wait_s:g} s"
                    )

            report = TrainingProcess(
                engine, termination, cfg.requirements, identity, on_event=on_event, on_state=on_state,
                save_path=run.path / "model.pt", sampler=ResourceSampler(), inbox=_inbox.inbox_of(run.path),
            ).run()
        run.write_json("report.json", report.to_json())
    console.print(report_table(report, f"Training report — {run.path}"))
    return 0


# ------------------------------------------------------------------------------------------- data / report


def _data_add(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise DataError(f"run directory not found: {run_dir}")
    dest = _inbox.put(run_dir, args.file, terminal=args.terminal)
    state = ""
    status = run_dir / "status.json"
    if status.is_file():
        state = json.loads(status.read_text(encoding="utf-8")).get("status", "")
    console = Console()
    arrays = _inbox.load_arrays(dest)
    console.print(f"queued {arrays['X'].shape[0]} samples for {run_dir} ({dest.name})")
    if state and state != ProcessState.AWAITING_DATA.value:
        console.print(f"[yellow]the run is {state}, not awaiting data; it takes them when it next waits[/]")
    return 0


def _report(args: argparse.Namespace) -> int:
    path = Path(args.run_dir) / "report.json"
    if not path.is_file():
        raise DataError(f"no report.json in {args.run_dir} (the run has not finished)")
    try:
        report = TrainingReport.model_validate_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DataError(f"{path} is not a training report: {exc}") from exc
    if args.json:
        print(json.dumps(report.to_3gpp() if args.three_gpp else report.to_json(), indent=2))
    else:
        Console().print(report_table(report, f"Training report — {args.run_dir}"))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "local", help="centralised training under requirements and termination parameters",
        description="Train an MLP on one embedded dataset in one place, stopping when [termination] or "
        "[requirements] say so; writes config.toml, metrics.jsonl, status.json, report.json and model.pt.",
    )
    add_config_arguments(p, out_default="runs/local-<timestamp>", example="termination.performance.accuracy=0.95")
    p.set_defaults(func=_local)

    d = sub.add_parser("data", help="hand more training data to a run")
    dsub = d.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    a = dsub.add_parser("add", help="queue a .npz file (arrays X and y) for a run awaiting data")
    a.add_argument("run_dir", help="run directory of the training that awaits data")
    a.add_argument("file", help=".npz file with arrays X (samples x features) and y")
    a.add_argument("--terminal", type=int, default=None, help="federated runs: the terminal that gets it")
    a.set_defaults(func=_data_add)

    r = sub.add_parser("report", help="show the training report of a run")
    r.add_argument("run_dir")
    r.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r.add_argument("--3gpp", dest="three_gpp", action="store_true",
                   help="with --json: as a TS 28.105 MLTrainingReport")
    r.set_defaults(func=_report)
