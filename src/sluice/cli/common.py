"""Arguments every config-driven command shares."""

from __future__ import annotations

import argparse


def add_config_arguments(p: argparse.ArgumentParser, *, out_default: str, example: str) -> None:
    """``[config]``, ``--out DIR`` and repeatable ``--set key=value``."""
    p.add_argument("config", nargs="?", help="TOML config file (default: built-in)")
    p.add_argument("--out", help=f"run directory (default: {out_default})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a config value, e.g. --set {example} (repeatable)")
