"""``sluice local``: centralised training under requirements and termination parameters."""

from __future__ import annotations

import argparse

from rich.console import Console

from sluice.cli.common import add_config_arguments


def _local(args: argparse.Namespace) -> int:
    from sluice.runtimes.jobs import load_job
    from sluice.runtimes.training import train_local

    return train_local(load_job("local", args.config, args.overrides), args.out, Console())


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "local", help="centralised training under requirements and termination parameters",
        description="Train a task's model (a built-in task by default, or a [task] of your own) in one place, "
        "stopping when [termination] or [requirements] say so; writes config.toml, metrics.jsonl, status.json, "
        "report.json and model.pt.",
    )
    add_config_arguments(p, out_default="runs/local-<timestamp>", example="termination.performance.accuracy=0.95")
    p.set_defaults(func=_local)
