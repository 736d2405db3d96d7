"""``sluice run``: horizontal federated learning with compressed traffic both ways."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sluice.cli.common import add_config_arguments
from sluice.cli.control import report_table, status_writer, termination_for_run
from sluice.config import RunConfig, load_config
from sluice.control import ModelIdentity, ResourceSampler, TrainingProcess
from sluice.control.inbox import inbox_of
from sluice.hfl import HFLEngine
from sluice.plots import plot_accuracy
from sluice.runs import History, RunDir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="train across simulated terminals (horizontal FL)",
        description="Horizontal FL with rand-k uploads, server top-k with error feedback and per-terminal "
        "sparse downlink. With no config it runs the built-in default (digits, 20 terminals, "
        "Dirichlet 0.3, q=0.25, 150 rounds). Dense FedAvg baseline: "
        "--set compression.up=dense --set compression.down=dense",
    )
    add_config_arguments(p, out_default="runs/run-<timestamp>", example="train.rounds=50")
    p.set_defaults(func=_main)


def _mb(n: float) -> str:
    return f"{n / 1e6:.3f} MB"


def summarize(history: History, engine: HFLEngine, wall: float) -> dict:
    return {
        "final_accuracy": history.last("test_accuracy"),
        "best_accuracy": history.best("test_accuracy"),
        "total_bytes_up": history.cum_bytes_up,
        "total_bytes_down": history.cum_bytes_down,
        "rounds": len(history.records),
        "wall_seconds": round(wall, 3),
        "num_params": engine.num_params,
    }


def _main(args: argparse.Namespace) -> int:
    cfg: RunConfig = load_config(args.config, args.overrides)
    termination = termination_for_run(cfg.termination, cfg.train.rounds)
    cfg.train.rounds = termination.iterations  # [termination] iterations, when given, is the round limit
    console = Console()
    t_start = time.perf_counter()
    engine = HFLEngine(cfg)
    engine.start()
    d = engine.num_params
    console.print(
        f"[bold]sluice run[/]: {cfg.data.dataset}, {len(engine.data.clients)} terminals "
        f"({cfg.data.partition}), q={cfg.train.participation}, {cfg.train.rounds} rounds, d={d}; "
        f"up={cfg.compression.up}({cfg.compression.up_ratio}) down={cfg.compression.down}"
        f"({cfg.compression.down_ratio}) downlink={cfg.compression.downlink}"
    )
    history = History("round")
    with RunDir(args.out) as run:
        run.write_config(cfg.model_dump())
        columns = [TextColumn("[bold blue]round"), MofNCompleteColumn(), BarColumn(),
                   TextColumn("acc {task.fields[acc]}"), TextColumn("up {task.fields[up]}"),
                   TextColumn("down {task.fields[down]}"), TimeElapsedColumn()]
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("train", total=cfg.train.rounds, acc="-", up="0", down="0")

            def on_event(event, proc) -> None:
                run.log(history.add(event))
                acc = history.last("test_accuracy")
                progress.update(task, advance=1, acc=f"{acc:.4f}" if acc is not None else "-",
                                up=_mb(history.cum_bytes_up), down=_mb(history.cum_bytes_down))

            identity = ModelIdentity(id=f"hfl-{cfg.data.dataset}-mlp")
            report = TrainingProcess(
                engine, termination, cfg.requirements, identity, on_event=on_event, on_state=status_writer(run),
                save_path=run.path / "model.pt", sampler=ResourceSampler(), inbox=inbox_of(run.path),
                inbox_adapter=lambda d: (d.get("terminal", 0), d["X"], d["y"]),
            ).run()
        wall = time.perf_counter() - t_start
        summary = summarize(history, engine, wall)
        run.write_json("summary.json", summary)
        run.write_json("report.json", report.to_json())
        plot_accuracy(history.records, run.path)
    table = Table(title=f"Sluice run — {run.path}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        shown = _mb(value) if key.startswith("total_bytes") else (f"{value:.4f}" if isinstance(value, float)
                                                                   else str(value))
        table.add_row(key, shown)
    console.print(table)
    console.print(report_table(report))
    return 0
