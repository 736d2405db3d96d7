"""``sluice certs``: a CA and the certificates signed by it, for TLS across hosts.

Two uses:

- ``sluice certs DIR [--host ADDR ...] [--client NAME ...]``: a Flower SuperLink's certificate
  (``server.pem`` / ``server.key``, naming its addresses, and always 127.0.0.1 and localhost, where the
  SuperLink's own executor connects to it), and client certificates for mutual TLS of ``sluice serve
  --tls-client-ca``, all in ``DIR``.
- ``sluice certs DIR --follower [NAME=]ADDR[,ADDR...] ... [--leader NAME]``: split training across hosts
  (``sluice split party``) with mutual TLS: a server certificate for each follower (it listens; the
  certificate names the addresses the leader connects to) and a client certificate for the leader (it
  connects). Each party's files go into ``DIR/<name>/`` (``ca.pem``, ``<name>.pem``, ``<name>.key``), to be
  copied to that party's host; the CA's key ``DIR/ca.key`` stays where it was made.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from sluice.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "certs",
        help="make a CA and certificates: a Flower SuperLink's, or each party's for split training (mutual TLS)",
        description="Flower: write ca.pem (+ ca.key), server.pem and server.key into DIR; the certificate names "
        "every --host and 127.0.0.1 and localhost, where the SuperLink's own executor connects. Start the SuperLink "
        "with --ssl-ca-certfile DIR/ca.pem --ssl-certfile DIR/server.pem --ssl-keyfile DIR/server.key and give "
        "every SuperNode (and sluice run --runtime flower --superlink) --root-certificates ca.pem. "
        "Split training across hosts (--follower): write the CA into DIR and, for each follower and the "
        "leader, a folder DIR/NAME/ with ca.pem, NAME.pem and NAME.key: copy it to that party's host (as "
        "certs/ for examples/split_party_follower.toml and examples/split_party_leader.toml). A follower "
        "gets a server certificate naming its addresses, the leader a client certificate.",
    )
    p.add_argument("dir", help="directory for the files")
    p.add_argument("--host", dest="hosts", action="append", default=[], metavar="NAME_OR_IP",
                   help="Flower: an address the SuperLink is reached at (repeatable); 127.0.0.1 and localhost "
                   "are always named")
    p.add_argument("--days", type=int, default=365, help="validity in days (default 365)")
    p.add_argument("--force", action="store_true", help="replace existing files (a new CA)")
    p.add_argument("--client", dest="clients", action="append", default=[], metavar="NAME",
                   help="also NAME.pem / NAME.key, a client certificate signed by the CA (mutual TLS of "
                   "sluice serve --tls-client-ca; repeatable)")
    p.add_argument("--follower", dest="followers", action="append", default=[], metavar="[NAME=]ADDR[,ADDR]",
                   help="split training: a follower's server certificate, naming every address (IP or DNS "
                   "name) the leader connects to it at; NAME defaults to 'follower' (name each one when there "
                   "are several; repeatable)")
    p.add_argument("--leader", metavar="NAME",
                   help="split training: the leader's client certificate is NAME.pem (default 'leader')")
    p.set_defaults(func=_main)


def _followers(specs: list[str]) -> dict[str, list[str]]:
    """``[NAME=]ADDR[,ADDR...]`` of each ``--follower`` as {name: addresses}."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        name, sep, hosts = spec.partition("=")
        if not sep:
            if len(specs) > 1:
                raise ConfigError(f"name each follower when there are several: --follower NAME={spec}")
            name, hosts = "follower", spec
        name = name.strip()
        if name in out:
            raise ConfigError(f"follower {name!r} is named twice")
        out[name] = [h.strip() for h in hosts.split(",") if h.strip()]
    return out


LOOPBACK = ("127.0.0.1", "localhost")
"""Named in every SuperLink certificate: a SuperLink started with ``--host 0.0.0.0`` runs its ServerApps
through an executor (``flower-superexec``) that connects to it at 127.0.0.1 with the same certificate; without
that name the executor cannot connect, and no run ever starts."""


def _main(args: argparse.Namespace) -> int:
    if args.followers or args.leader:
        return _split(args)
    from sluice.runtimes.flower.certs import make_certificates, make_client_certificate

    hosts = list(dict.fromkeys([h.strip() for h in args.hosts] + list(LOOPBACK)))
    files = make_certificates(args.dir, hosts, days=args.days, overwrite=args.force)
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"CA: {files.ca}\nSuperLink certificate: {files.cert} (names {', '.join(hosts)})\n"
                  f"SuperLink key: {files.key}")
    for name in args.clients:
        client = make_client_certificate(args.dir, name, days=args.days)
        console.print(f"client certificate: {client.cert}, key: {client.key}")
    return 0


def _split(args: argparse.Namespace) -> int:
    from sluice.runtimes.flower.certs import make_split_certificates

    if not args.followers:
        raise ConfigError("--leader is for split training: also give --follower [NAME=]ADDR for each follower")
    if args.hosts or args.clients:
        raise ConfigError("--host and --client make a Flower SuperLink's certificates; for split training give "
                          "only --follower (and --leader)")
    parties = make_split_certificates(args.dir, _followers(args.followers), args.leader or "leader",
                                      days=args.days, overwrite=args.force)
    console = Console(highlight=False, soft_wrap=True)
    ca = parties[0].folder.parent
    console.print(f"CA: {ca / 'ca.pem'} (its key {ca / 'ca.key'} stays here: it signs new certificates)")
    for party in parties:
        what = (f"server certificate for {', '.join(party.hosts)}" if party.role == "follower"
                else "client certificate")
        console.print(f"{party.role} {party.name} ({what}): copy {party.folder}/ to its host as certs/ "
                      f"({party.files.ca.name}, {party.files.cert.name}, {party.files.key.name})")
    return 0
