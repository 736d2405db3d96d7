"""``sluice run``: horizontal federated learning with compressed traffic both ways."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="train across simulated terminals (horizontal FL)")
    p.add_argument("config", nargs="?", help="TOML config file (default: built-in)")
    p.add_argument("--out", help="run directory (default: runs/run-<timestamp>)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    raise NotImplementedError
