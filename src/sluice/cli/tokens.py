"""``sluice token ...``: bearer tokens of the management service (``sluice serve --tokens-file F``)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table


def _add(args: argparse.Namespace) -> int:
    from sluice.service.auth import add_token

    token = add_token(args.file, args.consumer, admin=args.admin)
    print(token)
    Console(stderr=True).print(f"token of [bold]{args.consumer}[/] ({'admin' if args.admin else 'consumer'}) added "
                               f"to {args.file}; it is shown only this once (the file keeps its SHA-256)")
    return 0


def _list(args: argparse.Namespace) -> int:
    from sluice.service.auth import read_tokens_file

    table = Table(title=f"Tokens in {args.file}")
    for col in ("consumer", "role", "sha256"):
        table.add_column(col)
    for e in read_tokens_file(args.file):
        table.add_row(e.consumer, e.role, e.token_sha256[:16] + "…")
    Console().print(table)
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from sluice.errors import ConfigError
    from sluice.service.auth import revoke_tokens

    n = revoke_tokens(args.file, args.consumer)
    if n == 0:
        raise ConfigError(f"{args.file} holds no token of {args.consumer}")
    Console().print(f"revoked {n} token(s) of {args.consumer}; a running service notices at once")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("token", help="add, list or revoke bearer tokens of the management service",
                       description="Tokens let consumers call `sluice serve --tokens-file FILE`. A token is "
                       "printed once when added; FILE keeps only its SHA-256, the consumer it names and its role.")
    ts = p.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    q = ts.add_parser("add", help="make a token for a consumer and print it",
                      description="make a token for a consumer and print it")
    q.add_argument("--consumer", required=True, help="the consumer the token names (letters, digits, _.@-)")
    q.add_argument("--admin", action="store_true", help="the token sees and changes every consumer's resources")
    q.set_defaults(func=_add)
    q = ts.add_parser("list", help="list the consumers and roles of a tokens file",
                      description="list the consumers and roles of a tokens file")
    q.set_defaults(func=_list)
    q = ts.add_parser("revoke", help="remove every token of a consumer",
                      description="remove every token of a consumer")
    q.add_argument("--consumer", required=True)
    q.set_defaults(func=_revoke)
    for q in ts.choices.values():
        q.add_argument("--file", required=True, help="the tokens file (TOML, [[token]] tables)")
