"""What every training command shares: its arguments. Training one job under the control plane into a run
directory is :func:`sluice.runtimes.training.run_job`, which the Flower ServerApp and :func:`sluice.run_task` use too.
"""

from __future__ import annotations

import argparse


def add_config_arguments(p: argparse.ArgumentParser, *, out_default: str | None, example: str) -> None:
    """``[config]``, repeatable ``--set key=value`` and, for a command that trains into a run directory
    (``out_default`` given), ``--out DIR`` and ``--log-to KIND DIR``."""
    from sluice.tensorboard import add_option as add_log_to

    p.add_argument("config", nargs="?", help="TOML config file (default: built-in)")
    if out_default is not None:
        p.add_argument("--out", help=f"run directory (default: {out_default})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a config value, e.g. --set {example} (repeatable)")
    if out_default is not None:
        add_log_to(p)
