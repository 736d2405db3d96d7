"""``sluice report``: a run's training report as a table, JSON or a TS 28.105 ``MLTrainingReport``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console

from sluice.errors import DataError


def _report(args: argparse.Namespace) -> int:
    from sluice.control import TrainingReport
    from sluice.roles import threegpp
    from sluice.runtimes.training import client_table, report_table

    path = Path(args.run_dir) / "report.json"
    if not Path(args.run_dir).is_dir():
        raise DataError(f"run directory not found: {args.run_dir}")
    if not path.is_file():
        raise DataError(f"no report.json in {args.run_dir} (the run has not finished)")
    try:
        report = TrainingReport.model_validate_json(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DataError(f"{path} is not a training report: {exc}") from exc
    if args.json or args.three_gpp:
        print(json.dumps(threegpp.training_report(report) if args.three_gpp else report.to_json(), indent=2))
    else:
        console = Console()
        console.print(report_table(report, f"Training report — {args.run_dir}"))
        clients = client_table(report)
        if clients is not None:
            console.print(clients)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("report", help="show the training report of a run (and its clients, for federated training)")
    r.add_argument("run_dir")
    r.add_argument("--json", action="store_true", help="print JSON instead of a table")
    r.add_argument("--3gpp", dest="three_gpp", action="store_true",
                   help="print the report as a TS 28.105 MLTrainingReport (JSON)")
    r.set_defaults(func=_report)
