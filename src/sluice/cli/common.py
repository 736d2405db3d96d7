"""What every training command shares: its arguments. Training one job under the control plane into a run
directory is :func:`sluice.training.run_job`, which the Flower ServerApp and :func:`sluice.run_task` use too.
"""

from __future__ import annotations

import argparse


def add_config_arguments(p: argparse.ArgumentParser, *, out_default: str | None, example: str) -> None:
    """``[config]``, ``--out DIR`` (when ``out_default`` is given) and repeatable ``--set key=value``."""
    p.add_argument("config", nargs="?", help="TOML config file (default: built-in)")
    if out_default is not None:
        p.add_argument("--out", help=f"run directory (default: {out_default})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a config value, e.g. --set {example} (repeatable)")
