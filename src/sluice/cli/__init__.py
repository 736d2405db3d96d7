"""Command-line entry point: ``sluice <command> ...``.

Each sub-command lives in its own module with a ``register(subparsers)`` function. Building the parser
imports no engine, torch, scikit-learn, matplotlib or gRPC: a command imports what it needs when it runs,
so ``--help`` and ``--version`` answer at once. Errors a user can cause (:class:`sluice.errors.SluiceError`)
are printed without a traceback and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.markup import escape

from sluice import __version__
from sluice.errors import SluiceError
from sluice.tensorboard import configure as configure_log_to

from . import certs as _certs
from . import consumer as _consumer
from . import dashboard as _dashboard
from . import data as _data
from . import local as _local
from . import report as _report
from . import run as _run
from . import serve as _serve
from . import split as _split
from . import tokens as _tokens

_COMMANDS = [_run, _split, _local, _data, _report, _certs, _serve, _tokens, _consumer, _dashboard]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice", description="Sluice: train models across parties that cannot pool their data or bandwidth."
    )
    parser.add_argument("--version", action="version", version=f"sluice {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _COMMANDS:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        configure_log_to(getattr(args, "log_to", None))
        return int(args.func(args) or 0)
    except SluiceError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("[yellow]interrupted[/]")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
