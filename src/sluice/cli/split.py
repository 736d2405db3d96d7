"""``sluice split``: pipelined split / vertical training across parties.

``sluice split run [CONFIG]`` runs a whole task on this machine: one process per follower plus the
leader here, over loopback gRPC (or threads with ``--set transport.kind=inproc``).
``sluice split party --role follower --listen ADDR [CONFIG]`` serves one task for a remote leader;
``sluice split party --role leader --connect ADDR [--connect ADDR2 ...] [CONFIG]`` leads one.

The leader trains under the control plane like ``sluice run``: the config may hold ``[model]`` (id,
version, type), ``[requirements]`` and ``[termination]``; the run directory gets ``report.json``,
``status.json``, ``metrics.jsonl`` (one line per step), ``steps.jsonl`` (every step's full record),
``summary.json`` and ``loss.png``; the exit status is the report's.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from sluice.cli.common import add_config_arguments
from sluice.errors import ConfigError
from sluice.runs import new_run_path
from sluice.runtimes.training import mb, run_job


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
        "x10-x29), topology 6, G chosen automatically, 30 epochs (stop earlier with "
        "--set termination.iterations=N or any other [termination] criterion).",
    )
    add_config_arguments(r, out_default="runs/split-<timestamp>", example="pipeline.groups=4")
    r.set_defaults(func=_run)
    q = ssub.add_parser("party", help="serve (follower) or lead (leader) one task across hosts")
    add_config_arguments(q, out_default=None, example="transport.timeout_s=60")
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


def summarize(history: Any, engine: Any, wall: float) -> dict[str, Any]:
    """``summary.json``: the engine's summary of the steps it ran."""
    return engine.summary(wall)


def plot(records: list[dict[str, Any]], run_dir: Path, names: list[str] | None = None) -> None:
    """``loss.png`` and, on a scenario, its type-specific errors (``names``) against the step and the
    megabytes sent."""
    from sluice.runtimes.plots import plot_metrics
    from sluice.split.plots import plot_loss

    plot_loss(records, run_dir)
    plot_metrics(records, run_dir, names or [], key="step")


def _run_dir(out: str | None) -> Path:
    """``out``, or a new ``runs/split-<timestamp>``: chosen before the run starts, because the leader's
    follower processes log into it."""
    return Path(out) if out is not None else new_run_path("split")


def _lead(args: argparse.Namespace, command: str, connect: list[str] | None) -> int:
    """``split run`` and ``split party --role leader``: the leader trains under the control plane."""
    from sluice.runtimes.jobs import load_job
    from sluice.split import SplitEngine

    job = load_job("split", args.config, args.overrides)
    cfg = job.config
    out = _run_dir(args.out)
    steps = job.termination.iterations if job.termination is not None else None
    engine = SplitEngine(cfg, connect=connect, run_dir=out, steps=steps)

    def describe(engine: Any) -> str:
        where = f"followers at {', '.join(connect)}" if connect else f"transport {cfg.transport.kind}"
        plan = engine.plan
        return (f"[bold]sluice split {command}[/]: {engine.task.name}, topology {cfg.topology}, {cfg.followers} "
                f"follower(s), {len(plan.train_ids) + len(plan.test_ids):,} aligned rows of the leader's "
                f"{len(engine.task.table.ids):,}, {engine.default_iterations} steps planned, batch "
                f"{cfg.train.batch_size}, G={cfg.pipeline.groups}, {where}")

    names = [n for n in engine.metrics if not n.startswith(("train_", "test_")) and n != "idle_leader_s"]
    existed = out.exists()
    try:
        return run_job(job, str(out), console=Console(), unit="step", prefix="split", summarize=summarize,
                       plot=lambda records, run_dir: plot(records, run_dir, names), describe=describe, engine=engine)
    except BaseException:
        engine.stop()  # followers started for a task refused before training end here
        if not existed and not (out / "report.json").exists():  # nothing trained: nothing left behind
            shutil.rmtree(out, ignore_errors=True)
        raise


def _run(args: argparse.Namespace) -> int:
    return _lead(args, "run", None)


def _party(args: argparse.Namespace) -> int:
    if args.role == "leader":
        if not args.connect:
            raise ConfigError("--role leader needs --connect ADDR for each follower")
        return _lead(args, "party", args.connect)
    if args.connect:
        raise ConfigError("--connect is for --role leader; a follower uses --listen")
    from sluice.runtimes.jobs import load_job
    from sluice.split.runner import serve_follower

    cfg = load_job("split", args.config, args.overrides).config
    console = Console(stderr=True)
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
        f"sent {mb(out['link']['bytes_sent'])}, received {mb(out['link']['bytes_received'])}"
    )
    return 0
