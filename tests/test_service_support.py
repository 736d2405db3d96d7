"""What the service tests share: a real ``sluice serve`` on a free loopback port with a real SQLite file, a
loopback notification receiver, small jobs, and response checks against the OpenAPI bundle.

Every server runs in its own process group; leaving a ``running_server`` block ends the whole group (the
server, its forkserver and its workers), also when the test failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

BASE = "/ProvMnS/v1920"
HTTP_TIMEOUT_S = 120  # a create validates the job by building its engine: tens of seconds on a loaded machine
TF = "SubNetwork=SN1/MLTrainingFunction=TF1"
SCHEMA = {"MLTrainingRequest": "MLTrainingRequest-Single", "MLTrainingProcess": "MLTrainingProcess-Single",
          "MLTrainingReport": "MLTrainingReport-Single", "MLModel": "MLModel-Single",
          "NtfSubscriptionControl": "NtfSubscriptionControl-Single",
          "MLTrainingFunction": "MLTrainingFunction-Single", "MLModelRepository": "MLModelRepository-Single"}
NOTIFY_SCHEMA = {"notifyMOICreation": "NotifyMoiCreation", "notifyMOIAttributeValueChanges":
                 "NotifyMoiAttributeValueChanges", "notifyMOIDeletion": "NotifyMoiDeletion"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_job(iterations: int = 5) -> dict[str, Any]:
    """A small local job (digits, one hidden layer of 16) as a request's sluice-job vsData."""
    return {"engine": "local", "seed": 0, "train": {"iterations": iterations, "batch_size": 64, "lr": 0.1},
            "model": {"hidden": [16]}}


def request_body(rid: str | None, job: dict[str, Any] | None = None, *, termination: dict[str, Any] | None = None,
                 requirements: dict[str, Any] | None = None, decided_by: str | None = None,
                 attributes: dict[str, Any] | None = None) -> dict[str, Any]:
    vs = [{"id": "sluice-job", "attributes": {"vsData": job or local_job()}}]
    if requirements is not None:
        vs.append({"id": "sluice-requirements", "attributes": {"vsData": requirements}})
    if termination is not None:
        vs.append({"id": "sluice-termination", "attributes": {"vsData": termination}})
    if decided_by is not None:
        vs.append({"id": "sluice-negotiation", "attributes": {"vsData": {"decidedBy": decided_by}}})
    body: dict[str, Any] = {"attributes": attributes or {}, "VsDataContainer": vs}
    if rid is not None:
        body["id"] = rid
    return body


def check(schema: str, body: Any) -> Any:
    """``body`` after checking it against bundle schema ``schema`` (fails the test otherwise)."""
    from sluice.service.schema import SchemaViolation, check_response

    try:
        check_response(schema, body)
    except SchemaViolation as exc:
        raise AssertionError(f"{schema}: {exc.message}\n{json.dumps(body, indent=1)[:3000]}") from exc
    return body


def checked(resp: httpx.Response, status: int | tuple[int, ...], schema: str | None = None) -> Any:
    """The JSON of ``resp`` after checking its status and (for every body) its schema: errors against the
    3GPP error body of the method, resources against their class."""
    want = (status,) if isinstance(status, int) else status
    assert resp.status_code in want, f"{resp.request.method} {resp.request.url}: {resp.status_code} {resp.text}"
    if not resp.content:
        return None
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    if resp.status_code >= 400:
        method = resp.request.method
        schema = schema or {"GET": "ErrorResponseGet", "PATCH": "PatchErrorResponse"}.get(method,
                                                                                          "ErrorResponseDefault")
        assert "type" in body
    elif schema is None and isinstance(body, dict) and body.get("objectClass") in SCHEMA:
        schema = SCHEMA[body["objectClass"]]
    if schema is not None:
        check(schema, body)
    return body


@dataclass
class Server:
    port: int
    db: Path
    proc: subprocess.Popen
    log: Path
    database: str = ""
    """SQLAlchemy URL of the store (``sqlite:///{db}`` unless another database was given)."""
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False))
    scheme: str = "http"

    @property
    def root(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def function(self) -> str:
        return f"{self.root}{BASE}/{TF}"

    def uri(self, ldn: str) -> str:
        return f"{self.root}{BASE}/{ldn}"

    def req(self, rid: str) -> str:
        return f"{self.function}/MLTrainingRequest={rid}"

    def proc_uri(self, pid: str) -> str:
        return f"{self.function}/MLTrainingProcess={pid}"

    def dn(self, dn: str) -> str:
        return self.uri(dn.replace(",", "/"))

    def get(self, url: str, **params: Any) -> Any:
        return checked(self.http.get(url, params=params or None), 200)

    def patch(self, url: str, body: Any, status: int | tuple[int, ...] = 200,
              ctype: str = "application/merge-patch+json") -> Any:
        return checked(self.http.patch(url, content=json.dumps(body), headers={"Content-Type": ctype}), status)

    def process_of(self, rid: str) -> dict[str, Any]:
        tree = self.get(self.function, scopeType="BASE_NTH_LEVEL", scopeLevel=1, filter="MLTrainingProcess")
        dn = f"SubNetwork=SN1,MLTrainingFunction=TF1,MLTrainingRequest={rid}"
        procs = [p for p in tree.get("MLTrainingProcess", []) if dn in p["attributes"]["trainingRequestRef"]]
        assert procs, f"no process for {rid}"
        return procs[-1]

    def wait_for(self, url: str, pred: Any, timeout: float = 60.0, interval: float = 0.1) -> Any:
        t0 = time.monotonic()
        last = None
        while time.monotonic() - t0 < timeout:
            last = self.get(url)
            if pred(last):
                return last
            time.sleep(interval)
        raise AssertionError(f"timed out waiting on {url}; last: {json.dumps(last)[:2000]}\n{self.log_text()}")

    def wait_status(self, rid: str, statuses: tuple[str, ...], timeout: float = 60.0) -> Any:
        return self.wait_for(self.req(rid), lambda b: b["attributes"]["requestStatus"] in statuses, timeout)

    def log_text(self) -> str:
        try:
            return self.log.read_text(encoding="utf-8")[-4000:]
        except OSError:
            return ""


def start_server(tmp: Path, *, name: str = "svc", port: int | None = None, db: Path | None = None,
                 database: str | None = None, extra: tuple[str, ...] = (), token: str | None = None,
                 tls: Any = None, env: dict[str, str] | None = None) -> Server:
    """``sluice serve`` on ``port`` (default a free one) with its store in SQLite file ``db`` (default
    ``tmp/<name>.db``), or at SQLAlchemy URL ``database`` when given (e.g. a PostgreSQL database; restart a
    server on the same store with ``database=srv.database``). ``token``: the bearer token ``srv.http``
    sends; ``tls``: the SSL context ``srv.http`` verifies an HTTPS server with (``extra`` names the server's
    certificate); ``env``: variables added to the server's environment (its workers inherit them)."""
    port = port or free_port()
    db = db or tmp / f"{name}.db"
    database = database or f"sqlite:///{db}"
    log = tmp / f"{name}-{port}.log"
    cmd = [sys.executable, "-m", "sluice", "serve", "--port", str(port), "--database", database,
           "--set", "max_concurrent=2", "--set", "progress_interval_s=0.05", "--set", "notify_backoff_s=0.2", *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=tmp, env=env, start_new_session=True)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    http = httpx.Client(timeout=HTTP_TIMEOUT_S, trust_env=False, headers=headers, verify=True if tls is None else tls)
    srv = Server(port, db, proc, log, database, http, "http" if tls is None else "https")
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        if proc.poll() is not None:
            raise AssertionError(f"sluice serve exited with {proc.returncode}:\n{srv.log_text()}")
        try:
            if srv.http.get(srv.uri("SubNetwork=SN1")).status_code == 200:
                return srv
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    stop_server(srv)
    raise AssertionError(f"sluice serve did not answer within 60 s:\n{srv.log_text()}")


def stop_server(srv: Server, *, kill: bool = False) -> None:
    """End the server's whole process group: SIGTERM (or SIGKILL when ``kill``), then SIGKILL for what is left."""
    srv.http.close()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(srv.proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
    try:
        srv.proc.wait(20)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(srv.proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        srv.proc.wait(5)


@contextlib.contextmanager
def running_server(tmp: Path, **kw: Any) -> Iterator[Server]:
    srv = start_server(tmp, **kw)
    try:
        yield srv
    finally:
        stop_server(srv)


class Receiver:
    """A notification recipient on a loopback port: records every POSTed JSON body, answers 204. With
    ``tls`` (a server-side SSL context) it listens for HTTPS."""

    def __init__(self, tls: Any = None) -> None:
        self.got: list[dict[str, Any]] = []
        self.times: list[float] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                n = int(self.headers.get("Content-Length", "0"))
                data = self.rfile.read(n)
                if len(data) < n:  # the sender died mid-request (a test kills servers): nothing was delivered
                    return
                body = json.loads(data or b"{}")
                with outer.lock:
                    outer.got.append(body)
                    outer.times.append(time.time())
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        scheme = "http" if tls is None else "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/notify"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def of(self, *, href_contains: str = "", ntype: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [n for n in self.got if href_contains in n.get("href", "")
                    and (ntype is None or n["notificationType"] == ntype)]

    def wait(self, pred: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            with self.lock:
                hits = [n for n in self.got if pred(n)]
            if hits:
                return hits
            time.sleep(0.05)
        with self.lock:
            seen = [(n["notificationType"], n["href"].rpartition("/")[2]) for n in self.got]
        raise AssertionError(f"no matching notification within {timeout} s; got {seen}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
