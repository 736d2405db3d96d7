"""A throwaway PostgreSQL server for tests and benchmarks of the service's store.

:func:`running_postgres` runs ``initdb`` into a new temporary directory, starts the server with ``pg_ctl``
on ``127.0.0.1`` and a free port (Unix socket in the same directory, ``trust`` authentication, no fsync:
nothing in it is meant to survive), creates one database and yields a :class:`PostgresServer` whose
``url`` is the SQLAlchemy URL of that database (``postgresql+psycopg://postgres@127.0.0.1:PORT/NAME``,
psycopg 3). :meth:`PostgresServer.new_database` creates another, empty database on the same server. On
leaving the block the server is stopped (``pg_ctl stop -m fast``, ``-m immediate`` if that fails) and the
directory removed, also when the block raised.

``initdb`` refuses to run as root, so as root every server command runs as the ``postgres`` user
(``runuser -u postgres --``) and the directory is handed to that user; otherwise they run as the caller.
The binaries are taken from ``pg_config --bindir`` when it holds ``initdb`` and ``pg_ctl``, else from the
newest ``/usr/lib/postgresql/<major>/bin`` (Debian's layout), else from ``PATH``. On Debian or Ubuntu
``apt-get install -y postgresql`` provides them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import SluiceError

_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_START_TRIES = 3


class PostgresUnavailable(SluiceError):
    """No PostgreSQL server can be started here (binaries missing, no ``postgres`` user, start failed)."""


def find_bindir() -> Path:
    """The directory holding PostgreSQL's ``initdb`` and ``pg_ctl``; raises :class:`PostgresUnavailable`."""
    candidates: list[Path] = []
    if shutil.which("pg_config"):
        done = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=False)
        if done.returncode == 0 and done.stdout.strip():
            candidates.append(Path(done.stdout.strip()))

    def major(p: Path) -> tuple[int, str]:
        ver = p.parent.name
        return (int(ver), ver) if ver.isdigit() else (0, ver)

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=major, reverse=True)
    which = shutil.which("pg_ctl")
    if which:
        candidates.append(Path(which).resolve().parent)
    for c in candidates:
        if (c / "initdb").is_file() and (c / "pg_ctl").is_file():
            return c
    raise PostgresUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl) not found in `pg_config --bindir`, /usr/lib/postgresql/*/bin "
        "or PATH; install them (Debian/Ubuntu: apt-get install -y postgresql)")


def check_name(name: str) -> None:
    """A database name must be 1-63 lower-case letters, digits and ``_``, not starting with a digit (so it
    needs no quoting in SQL or URLs); raises ``ValueError`` otherwise."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"database name {name!r}: use 1-63 of a-z, 0-9 and _, not starting with a digit")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    """A running server: ``host``/``port`` over TCP, superuser ``user`` (no password), ``url`` of its first
    database."""

    host: str
    port: int
    user: str
    database: str
    root: Path

    @property
    def url(self) -> str:
        return self.url_of(self.database)

    def url_of(self, name: str) -> str:
        """The SQLAlchemy URL of database ``name`` on this server."""
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{name}"

    def new_database(self, name: str) -> str:
        """Create the empty database ``name`` (see :func:`check_name`) and return its URL."""
        check_name(name)
        import psycopg

        with psycopg.connect(host=self.host, port=self.port, user=self.user, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_of(name)


def _runner() -> list[str]:
    """The prefix that runs a server command as a user ``initdb`` accepts."""
    if os.geteuid() != 0:
        return []
    import pwd

    try:
        pwd.getpwnam("postgres")
    except KeyError as exc:
        raise PostgresUnavailable("running as root and there is no `postgres` user to run initdb as") from exc
    if not shutil.which("runuser"):
        raise PostgresUnavailable("running as root and `runuser` (util-linux) is missing")
    return ["runuser", "-u", "postgres", "--"]


def _run(cmd: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "LC_ALL": "C", "LANG": "C"})


def _log_tail(log: Path) -> str:
    try:
        return log.read_text(encoding="utf-8", errors="replace")[-2000:]
    except OSError:
        return ""


@contextmanager
def running_postgres(database: str = "sluice", *, timeout_s: float = 60.0) -> Iterator[PostgresServer]:
    """Start a throwaway server with database ``database``; see the module docstring."""
    check_name(database)
    bindir = find_bindir()
    prefix = _runner()
    root = Path(tempfile.mkdtemp(prefix="sluice-pg-"))
    data, log = root / "data", root / "server.log"
    started = False
    try:
        if prefix:
            shutil.chown(root, "postgres", "postgres")
        done = _run([*prefix, str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                     "-E", "UTF8", "--no-locale", "--no-sync"], root, timeout_s)
        if done.returncode != 0:
            raise PostgresUnavailable(f"initdb failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}")
        for _ in range(_START_TRIES):  # the free port may be taken between choosing and binding it
            port = _free_port()
            opts = (f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
                    "-c full_page_writes=off")
            done = _run([*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w",
                         "-t", str(int(timeout_s)), "-o", opts, "start"], root, timeout_s + 10)
            if done.returncode == 0:
                started = True
                break
        if not started:
            raise PostgresUnavailable(f"pg_ctl start failed ({done.returncode}): {done.stderr[-1000:]}\n"
                                      f"{_log_tail(log)}")
        server = PostgresServer("127.0.0.1", port, "postgres", database, root)
        server.new_database(database)
        yield server
    finally:
        try:
            if (data / "postmaster.pid").exists():  # also a server whose start timed out
                for mode in ("fast", "immediate"):
                    try:
                        done = _run([*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", mode, "-w", "stop"],
                                    root, timeout_s)
                    except subprocess.TimeoutExpired:
                        continue  # a stop that hangs: try the next, harsher mode
                    if done.returncode == 0:
                        break
        finally:
            shutil.rmtree(root, ignore_errors=True)
