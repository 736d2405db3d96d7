"""``sluice data add`` (check more training data against a run and queue it) and ``sluice data describe``
(statistics and plots of a generated scenario)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from sluice.errors import DataError

_ENDED = ("FINISHED", "FAILED", "CANCELLED")


def _engine_data(kind: str, data: dict[str, Any]) -> Any:
    """What a run of engine ``kind`` hands its engine for an inbox file (the run's inbox adapter)."""
    if kind == "hfl":
        from sluice.runtimes.training import inbox_item

        return inbox_item(data)
    if "client" in data:
        raise DataError(f"a client is for federated runs (engine hfl); this run's engine is {kind}")
    return data


def _check_for_run(run_dir: Path, data: dict[str, Any]) -> None:
    """Refuse ``data`` (arrays read by :func:`sluice.control.inbox.load_arrays`) when the run in ``run_dir``
    cannot take it: the run's job is rebuilt from its ``config.toml`` (the dataset is loaded, nothing is
    trained) and its engine's ``check_data`` judges feature count, label range and client id."""
    from sluice.config import read_toml
    from sluice.runtimes.jobs import job_from_dict

    path = run_dir / "config.toml"
    if not path.is_file():
        raise DataError(f"no config.toml in {run_dir}: not the run directory of a training")
    raw = read_toml(path)
    kind = raw.get("engine")
    if not isinstance(kind, str):
        raise DataError(f"{path} names no engine kind (no top-level engine key), so the data cannot be "
                        "checked against the run; only runs started by this version of Sluice take data")
    item = _engine_data(kind, data)
    engine = job_from_dict(kind, raw).build()
    try:
        check = getattr(engine, "check_data", None)
        if check is None:
            raise DataError(f"{kind} runs take no added data")
        check(item)
    finally:
        engine.stop()


def _data_add(args: argparse.Namespace) -> int:
    from sluice.control import inbox as _inbox

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise DataError(f"run directory not found: {run_dir}")
    data = _inbox.load_arrays(args.file)
    if args.client is not None:
        if args.client < 0:
            raise DataError(f"--client must be >= 0, got {args.client}")
        data["client"] = args.client
    status = run_dir / "status.json"
    state = json.loads(status.read_text(encoding="utf-8")).get("status", "") if status.is_file() else ""
    if state in _ENDED:
        raise DataError(f"the run in {run_dir} has ended ({state}); it takes no more data")
    _check_for_run(run_dir, data)
    dest = _inbox.put(run_dir, args.file, client=args.client)
    console = Console()
    console.print(f"queued {data['X'].shape[0]} samples for {run_dir} ({dest.name})")
    if state and state != "AWAITING_DATA":
        console.print(f"[yellow]the run is {state}: the data waits in its inbox until the run next runs "
                      "short of data[/]")
    return 0


def _data_describe(args: argparse.Namespace) -> int:
    """Generate scenario ``args.dataset`` (``--set`` parameters of its section, ``--seed``), print its
    statistics and write its plots into ``--out`` (default ``runs/data-<dataset>-<timestamp>``)."""
    from sluice.config import apply_overrides
    from sluice.data import scenarios
    from sluice.data.config import scenario_params
    from sluice.errors import ConfigError
    from sluice.runs import new_run_path

    spec = scenarios.get_spec(args.dataset)
    try:
        params = scenario_params(args.dataset, apply_overrides({}, args.overrides))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    data = scenarios.load_scenario(args.dataset, params, seed=args.seed)
    out = Path(args.out) if args.out else new_run_path(f"data-{args.dataset}")
    out.mkdir(parents=True, exist_ok=True)
    lines, paths = spec.describe(data, out)
    console = Console()
    console.print(f"[bold]{args.dataset}[/] (seed {args.seed}): {data.task}, model type {data.model_type}",
                  highlight=False)
    for line in lines:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    for path in paths:
        console.print(f"plot: {path}", highlight=False, markup=False, soft_wrap=True)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser("data", help="hand more training data to a run; describe a generated scenario")
    dsub = d.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    a = dsub.add_parser(
        "add", help="check a .npz file (arrays X and y) against a run and queue it",
        description="Check FILE against the run (feature count, label range, finite values, client id) and "
        "queue it in the run's inbox; the run takes it when it awaits data. A file the run cannot take is "
        "refused (exit 2) and nothing is queued.",
    )
    a.add_argument("run_dir", help="run directory of the training")
    a.add_argument("file", help=".npz file with arrays X (samples x features), y and, for federated runs, "
                   "optionally client (an integer)")
    a.add_argument("--client", type=int, default=None,
                   help="federated runs: the client that gets the data (default: the file's client, else 0)")
    a.set_defaults(func=_data_add)
    s = dsub.add_parser(
        "describe", help="generate a scenario, print its statistics and plot it",
        description="Generate a network-analytics scenario (coverage, energy or kpi_anomaly) with the "
        "parameters given by --set (its [data.scenario] keys; defaults otherwise), print its statistics and "
        "write its plots; the paths are printed.",
    )
    s.add_argument("dataset", help="scenario: coverage, energy or kpi_anomaly")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a generator parameter of the scenario (repeatable)")
    s.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    s.add_argument("--out", help="directory for the plots (default: runs/data-<dataset>-<timestamp>)")
    s.set_defaults(func=_data_describe)
