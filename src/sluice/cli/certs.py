"""``sluice certs``: a CA and a SuperLink certificate for a Flower deployment across hosts."""

from __future__ import annotations

import argparse

from rich.console import Console


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "certs",
        help="make a CA and a SuperLink certificate for Flower (TLS)",
        description="Write ca.pem (+ ca.key), server.pem and server.key into DIR. Start the SuperLink with "
        "--ssl-ca-certfile DIR/ca.pem --ssl-certfile DIR/server.pem --ssl-keyfile DIR/server.key and give "
        "every SuperNode (and sluice run --runtime flower --superlink) --root-certificates ca.pem.",
    )
    p.add_argument("dir", help="directory for the files")
    p.add_argument("--host", dest="hosts", action="append", default=[], metavar="NAME_OR_IP",
                   help="an address the SuperLink is reached at (repeatable; default 127.0.0.1 and localhost)")
    p.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    p.add_argument("--force", action="store_true", help="replace existing files")
    p.add_argument("--client", dest="clients", action="append", default=[], metavar="NAME",
                   help="also NAME.pem / NAME.key, a client certificate signed by the CA (mutual TLS of "
                   "sluice serve --tls-client-ca; repeatable)")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    from sluice.flower.certs import make_certificates, make_client_certificate

    files = make_certificates(args.dir, args.hosts or ["127.0.0.1", "localhost"], days=args.days,
                              overwrite=args.force)
    console = Console()
    console.print(f"CA: {files.ca}\nSuperLink certificate: {files.cert}\nSuperLink key: {files.key}")
    for name in args.clients:
        client = make_client_certificate(args.dir, name, days=args.days)
        console.print(f"client certificate: {client.cert}, key: {client.key}")
    return 0
