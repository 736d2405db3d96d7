"""``sluice dashboard [RUNS_DIR]``: the live dashboard of run directories in the browser."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from sluice.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboard",
        help="serve a live dashboard of run directories in the browser",
        description="Serve the dashboard of `sluice serve` for the run directories of `sluice run`, `sluice local`, "
        "`sluice split run` and Flower runs: RUNS_DIR itself when it is a run directory, else every run directory "
        "below it (two levels deep). Runs being written are shown live; several runs can be compared on one "
        "chart. Listens on 127.0.0.1.",
    )
    p.add_argument("runs_dir", nargs="?", default="runs", help="a run directory or a folder of them (default runs)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8050, help="port (default 8050; 0 picks a free one)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    root = Path(args.runs_dir)
    if not root.is_dir():
        raise ConfigError(f"{root} is not a folder")
    try:
        import uvicorn

        from sluice.dashboard import runs_app
    except ImportError as exc:
        raise ConfigError(f"the dashboard needs sluice[dashboard] (pip install 'sluice[dashboard]'): {exc}") from exc
    Console(stderr=True).print(f"dashboard of {root.resolve()} on http://{args.host}:{args.port}/", highlight=False)
    uvicorn.run(runs_app(root), host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0
