"""``sluice serve``: the AI/ML management service (TS 28.105 training management over TS 28.532 ProvMnS)."""

from __future__ import annotations

import argparse
import socket
import ssl
from typing import Any

from rich.console import Console

from sluice.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="run the ML training management service (ProvMnS REST)",
        description="Serve TS 28.532 ProvMnS for the TS 28.105 training classes: consumers create "
        "MLTrainingRequest resources, the service trains each in a worker process and reports through "
        "MLTrainingProcess, MLTrainingReport, MLModel and notifications. Everything is stored in a database "
        "(default: a SQLite file in the working directory). It listens on 127.0.0.1 unless told otherwise; "
        "another address needs TLS and tokens (or client certificates), or --insecure.",
    )
    p.add_argument("config", nargs="?", help="TOML file of service settings (default: built-in)")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--database", help="SQLAlchemy URL of the store (default sqlite:///sluice-service.db)")
    p.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (chain)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert (default: in the certificate file)")
    p.add_argument("--tls-client-ca", help="mutual TLS: clients must present a certificate signed by this CA")
    p.add_argument("--tokens-file", help="bearer tokens (sluice token add); callers then need one")
    p.add_argument("--insecure", action="store_true",
                   help="listen on a non-loopback --host without TLS or authentication anyway")
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
    for key, attr in (("host", "host"), ("port", "port"), ("database", "database"), ("tls.cert", "tls_cert"),
                      ("tls.key", "tls_key"), ("tls.client_ca", "tls_client_ca"), ("auth.tokens_file", "tokens_file")):
        value = getattr(args, attr)
        if value is not None:
            overrides.append(f"{key}={value!r}" if isinstance(value, str) else f"{key}={value}")
    if args.insecure:
        overrides.append("insecure=true")
    cfg = load_service_config(args.config, overrides)
    problem = cfg.exposure_problem()
    if problem is not None:
        raise ConfigError(problem)
    cfg.tls.files()  # they exist and go together
    if cfg.port == 0:
        cfg = cfg.model_copy(update={"port": free_port(cfg.host)})

    if cfg.worker_start == "forkserver":  # the workers' torch loads there while the web server loads here
        from sluice.service.worker import warm_forkserver

        warm_forkserver()
    import uvicorn

    from sluice.service.app import create_app

    app = create_app(cfg)
    url = f"{'https' if cfg.tls.cert else 'http'}://{cfg.host}:{cfg.port}{cfg.base_path}"
    console = Console()
    console.print(f"[bold]sluice serve[/]: {url}/SubNetwork={cfg.subnetwork}/MLTrainingFunction="
                  f"{cfg.training_function}  (store {cfg.database}, {cfg.max_concurrent} at a time"
                  f"{', tokens' if cfg.auth.enabled else ''}{', mutual TLS' if cfg.tls.client_ca else ''})")
    tls: dict[str, Any] = {}
    if cfg.tls.cert is not None:
        tls = {"ssl_certfile": cfg.tls.cert, "ssl_keyfile": cfg.tls.key}
        if cfg.tls.client_ca is not None:
            tls.update(ssl_ca_certs=cfg.tls.client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning", access_log=False, **tls)
    return 0
