"""``sluice run``: horizontal federated learning with compressed traffic both ways."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from sluice.cli.common import add_config_arguments, run_job


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="train across simulated clients (horizontal FL)",
        description="Horizontal FL with unbiased sampled uploads (2 % of the coordinates as signs), server top-k "
        "with error feedback and a per-client sparse downlink, on the job's task ([task]: a built-in or your "
        "own factory). With no config it runs the built-in default (digits, 20 clients, Dirichlet 0.3, "
        "q=0.25, 150 rounds). Dense FedAvg baseline: "
        "--set compression.up=dense --set compression.down=dense",
    )
    add_config_arguments(p, out_default="runs/run-<timestamp>", example="train.rounds=50")
    f = p.add_argument_group("Flower runtime (pip install 'sluice[flower]')")
    f.add_argument("--runtime", choices=("sim", "flower"), default="sim",
                   help="sim: in-process simulation (default); flower: Flower's deployment engine, a SuperLink "
                   "and one SuperNode per client on 127.0.0.1 (TLS), or the SuperLink given by --superlink")
    f.add_argument("--nodes", type=int, help="local SuperNodes to start (default: one per client)")
    f.add_argument("--superlink", metavar="HOST:PORT", help="submit to this running SuperLink instead")
    f.add_argument("--root-certificates", metavar="CA.pem", help="CA that signed the SuperLink's certificate")
    f.add_argument("--insecure", action="store_true", help="no TLS (only with a SuperLink started --insecure)")
    f.add_argument("--round-timeout", type=float, default=60.0, metavar="S",
                   help="a node that has not answered after S seconds counts as dropped in that round")
    f.add_argument("--link-timeout", type=float, default=30.0, metavar="S",
                   help="a SuperLink that does not answer for S seconds ends the run with ENGINE_FAILURE")
    p.set_defaults(func=_main)


def inbox_item(data: dict[str, Any]) -> tuple[int, Any, Any]:
    """An inbox file as the HFL engine takes it: ``(client, X, y)``, client 0 when the file names none."""
    return data.get("client", 0), data["X"], data["y"]


def summarize(history: Any, engine: Any, wall: float) -> dict[str, Any]:
    """``summary.json`` of a run; on a scenario also its model type and the last value of each of its
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


def _describe(engine: Any) -> str:
    cfg = engine.cfg
    c = cfg.compression
    task = engine.data.task
    split = "the task's own" if task.per_client else cfg.data.partition or task.partition.method
    if task.model_type is not None:
        split += f", {task.model_type}"
    up = "dense" if c.up == "dense" else f"{c.up}({c.up_ratio})"
    share = c.down_ratio if c.down_ratio is not None else f"{c.down_budget}·M/N"
    down = "dense" if c.down == "dense" else f"{c.down}({share})"
    return (f"[bold]sluice run[/]: {escape(task.name)}, {len(engine.data.clients)} clients ({split}), "
            f"q={cfg.train.participation}, d={engine.num_params}; up={up} down={down} downlink={c.downlink}")


def _main(args: argparse.Namespace) -> int:
    from sluice.jobs import load_job

    flower_only = [name for name, value in (("--nodes", args.nodes), ("--superlink", args.superlink),
                                            ("--root-certificates", args.root_certificates),
                                            ("--insecure", args.insecure)) if value]
    if flower_only and args.runtime != "flower":
        from sluice.errors import ConfigError

        raise ConfigError(f"{', '.join(flower_only)} only apply with --runtime flower")
    job = load_job("hfl", args.config, args.overrides)
    if args.runtime == "flower":
        from sluice.flower.runner import FlowerOptions, run_on_flower

        opts = FlowerOptions(nodes=args.nodes, insecure=args.insecure, superlink=args.superlink,
                             root_certificates=args.root_certificates, round_timeout_s=args.round_timeout,
                             link_timeout_s=args.link_timeout)
        return run_on_flower(job, args.out, opts, console=Console())
    return train_hfl(job, args.out, Console())


def train_hfl(job: Any, out: str | None, console: Console) -> int:
    """Train an ``hfl`` job in the simulator into run directory ``out``; the exit status."""
    from sluice.plots import plot_accuracy, plot_metrics

    engine = job.build()

    def plot(records: list[dict[str, Any]], run_dir: Path) -> None:
        """Accuracy, and a scenario's type-specific errors, against the round and the megabytes sent."""
        plot_accuracy(records, run_dir)
        plot_metrics(records, run_dir, list(engine.data.metric_fns) if engine.data is not None else [])

    return run_job(job, out, console=console, unit="round", prefix="run", summarize=summarize,
                   plot=plot, describe=_describe, inbox_adapter=inbox_item, engine=engine)
