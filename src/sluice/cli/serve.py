"""``sluice serve``: the AI/ML management service (TS 28.105 training management over TS 28.532 ProvMnS)."""

from __future__ import annotations

import argparse
import socket

from rich.console import Console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run the ML training management service (ProvMnS REST)",
        description="Serve TS 28.532 ProvMnS for the TS 28.105 training classes: consumers create "
        "MLTrainingRequest resources, the service trains each in a worker process and reports through "
        "MLTrainingProcess, MLTrainingReport, MLModel and notifications. Everything is stored in a database "
        "(default: a SQLite file in the working directory).",
    )
    p.add_argument("config", nargs="?", help="TOML file of service settings (default: built-in)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--database", help="SQLAlchemy URL of the store (default sqlite:///sluice-service.db)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting, e.g. --set max_concurrent=4 (repeatable)")
    p.set_defaults(func=_main)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _main(args: argparse.Namespace) -> int:
    from sluice.service.config import load_service_config

    overrides = list(args.overrides)
    for key in ("host", "port", "database"):
        value = getattr(args, key)
        if value is not None:
            overrides.append(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}")
    cfg = load_service_config(args.config, overrides)
    if cfg.port == 0:
        cfg = cfg.model_copy(update={"port": free_port(cfg.host)})

    import uvicorn

    from sluice.service.app import create_app

    app = create_app(cfg)
    url = f"http://{cfg.host}:{cfg.port}{cfg.base_path}"
    console = Console()
    console.print(f"[bold]sluice serve[/]: {url}/SubNetwork={cfg.subnetwork}/MLTrainingFunction="
                  f"{cfg.training_function}  (store {cfg.database}, {cfg.max_concurrent} at a time)")
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning", access_log=False)
    return 0
