"""``sluice split``: pipelined split / vertical training across parties.

``sluice split run [CONFIG]`` runs a whole task on this machine: one process per follower plus the
leader here, over loopback gRPC (or threads with ``--set transport.kind=inproc``).
``sluice split party --role follower --listen ADDR [CONFIG]`` serves one task for a remote leader;
``sluice split party --role leader --connect ADDR [--connect ADDR2 ...] [CONFIG]`` leads one.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sluice.config import load_config
from sluice.errors import ConfigError
from sluice.runs import RunDir


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "split",
        help="pipelined split / vertical training across parties",
        description="Split (vertical) training with each batch cut into groups so that sends overlap "
        "compute, giving exactly the full-batch update.",
    )
    ssub = p.add_subparsers(dest="split_command", required=True, metavar="SUBCOMMAND")
    r = ssub.add_parser(
        "run",
        help="run leader and followers on this machine (separate processes, loopback gRPC)",
        description="With no config: breast cancer split as FATE does (leader x0-x9 + label, follower "
        "x10-x29), topology 6, G chosen automatically.",
    )
    _common(r)
    r.add_argument("--out", help="run directory (default: runs/split-<timestamp>)")
    r.set_defaults(func=_run)
    q = ssub.add_parser("party", help="serve (follower) or lead (leader) one task across hosts")
    _common(q)
    q.add_argument("--role", choices=["follower", "leader"], required=True)
    q.add_argument("--listen", help="follower: address to listen on (default: transport.listen)")
    q.add_argument("--connect", action="append", default=[], metavar="ADDR",
                   help="leader: a follower's address (repeat for several followers)")
    q.add_argument("--name", help="follower: name used in logs")
    q.add_argument("--out", help="leader: run directory (default: runs/split-<timestamp>)")
    q.add_argument("--ready-file", help=argparse.SUPPRESS)
    q.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    q.add_argument("--accept-timeout", type=float, default=600.0,
                   help="follower: seconds to wait for the leader to connect (default 600)")
    q.set_defaults(func=_party)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="TOML config file (default: built-in)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set pipeline.groups=4 (repeatable)")


def _load(args: argparse.Namespace) -> Any:
    from sluice.vfl.config import SplitConfig

    return load_config(args.config, args.overrides, model=SplitConfig)


def _mb(n: float) -> str:
    return f"{n / 1e6:.3f} MB"


def _train(cfg: Any, out: str | None, console: Console, runner: Any) -> int:
    """Shared by ``split run`` and ``split party --role leader``: progress bar, run directory, summary."""
    from sluice.vfl.plots import plot_loss

    with RunDir(out, prefix="split") as run:
        run.write_config(cfg.model_dump())
        cols = [TextColumn("[bold blue]step"), MofNCompleteColumn(), BarColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("acc {task.fields[acc]}"),
                TextColumn("{task.fields[ms]} ms/step"), TimeElapsedColumn()]
        records: list[dict[str, Any]] = []
        with Progress(*cols, console=console, transient=False) as progress:
            bar = progress.add_task("train", total=None, loss="-", acc="-", ms="-")

            def on_record(rec: dict[str, Any]) -> None:
                records.append(rec)
                run.log(rec)
                acc = rec.get("test_accuracy")
                progress.update(bar, advance=1, loss=f"{rec['loss']:.4f}",
                                acc=f"{acc:.4f}" if acc is not None else progress.tasks[0].fields["acc"],
                                ms=f"{1000 * rec['step_time_s']:.1f}")

            def set_total(n: int) -> None:
                progress.update(bar, total=n)

            result = runner(run.path, on_record, set_total)
        summary = result.summary
        run.write_json("summary.json", summary)
        try:
            plot_loss(result.records, run.path / "loss.png")
        except Exception:  # noqa: BLE001 - a missing plot must not fail a finished run
            pass
    table = Table(title=f"Sluice split — {run.path}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    keys = ("topology", "dataset", "steps", "groups", "final_loss", "final_test_accuracy", "final_test_auc",
            "mean_step_time_s", "total_bytes_up", "total_bytes_down", "wall_s")
    for key in keys:
        v = summary.get(key)
        shown = _mb(v) if key.startswith("total_bytes") and v is not None else (
            f"{v:.4f}" if isinstance(v, float) else str(v))
        table.add_row(key, shown)
    console.print(table)
    return 0


def _run(args: argparse.Namespace) -> int:
    from sluice.vfl.runner import run_inprocess, run_processes
    from sluice.vfl.task import build_task

    cfg = _load(args)
    console = Console()
    steps = build_task(cfg).steps
    console.print(
        f"[bold]sluice split run[/]: {cfg.data.dataset}, topology {cfg.topology}, {cfg.followers} "
        f"follower(s), {steps} steps, batch {cfg.train.batch_size}, G={cfg.pipeline.groups}, "
        f"transport {cfg.transport.kind}"
    )

    def runner(path: Path, on_record: Any, set_total: Any) -> Any:
        set_total(steps)
        if cfg.transport.kind == "inproc":
            return run_inprocess(cfg, on_record)
        return run_processes(cfg, path, on_record)

    return _train(cfg, args.out, console, runner)


def _party(args: argparse.Namespace) -> int:
    from sluice.vfl.runner import run_leader, serve_follower
    from sluice.vfl.task import build_task

    cfg = _load(args)
    console = Console(stderr=True)
    if args.role == "follower":
        if args.connect:
            raise ConfigError("--connect is for --role leader; a follower uses --listen")
        listen = args.listen or cfg.transport.listen
        t0 = time.perf_counter()
        out = serve_follower(
            cfg,
            listen,
            name=args.name,
            ready_file=args.ready_file,
            accept_timeout=args.accept_timeout,
            parent_pid=args.parent_pid,
            on_event=lambda m: console.print(f"[bold]sluice split party[/] ({args.name or 'follower'}): {m}"),
        )
        console.print(
            f"[bold]done[/]: {out['name']} trained {out['steps']} steps in {time.perf_counter() - t0:.1f} s; "
            f"sent {_mb(out['link']['bytes_sent'])}, received {_mb(out['link']['bytes_received'])}"
        )
        return 0
    if not args.connect:
        raise ConfigError("--role leader needs --connect ADDR for each follower")
    steps = build_task(cfg).steps

    def runner(path: Path, on_record: Any, set_total: Any) -> Any:
        set_total(steps)
        return run_leader(cfg, args.connect, on_record)

    return _train(cfg, args.out, Console(), runner)
