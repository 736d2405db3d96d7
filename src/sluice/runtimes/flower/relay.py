"""A management-service process trained on a Flower federation: the worker relays the worker protocol.

The operator names federations in the service configuration (:class:`FederationConfig`, under
``[federations.<name>]``): a SuperLink's address, its CA, how many SuperNodes serve it and which task.
For a job on one, the service's worker calls :func:`relay` instead of training itself:

1. it checks that the SuperLink answers (TCP and, unless ``insecure``, a TLS handshake verified with the
   federation's CA); one that does not is a refusal before training, naming the federation; so are
   requirements on the amount of training data (the nodes hold it);
2. it listens on ``control_host`` (a free port, an authentication key made for this run) and submits the job
   to the SuperLink with that address and key in the run configuration (``sluice-control``, ``sluice-key``);
3. the ServerApp (:mod:`sluice.runtimes.flower.app`) connects back, receives the worker spec (the agreed termination
   parameters and requirements, and the checkpoint to resume from) and trains under
   :func:`sluice.runtimes.remote.run_steered` over a :class:`~sluice.runtimes.flower.engine.FlowerEngine`: the same
   control plane, messages and checkpoints as a worker of the simulator;
4. from then on the worker passes every message on, both ways, unchanged.

A run the SuperLink does not start within ``start_timeout_s`` fails with the reason Flower gives; a
ServerApp that goes away without a report (the SuperLink was killed with it) fails the process with
``ENGINE_FAILURE`` and says whether the SuperLink still answers. When the service goes away, the worker
closes the ServerApp's connection, which cancels the training after its current round; the restarted
service resumes the process from its last checkpoint in a new Flower run, whose nodes get a dense
resynchronisation first.

The ServerApp must be able to reach ``control_host``: the service runs beside the SuperLink (the ServerApp
runs on the SuperLink's host) or on a host the SuperLink's host reaches.
"""

from __future__ import annotations

import socket
import ssl
import tempfile
import threading
import time
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from sluice.runtimes.flower.rounds import DEFAULT_EMPTY_ROUNDS
from sluice.schema import Section


class FederationConfig(Section):
    """``[federations.<name>]``: a Flower deployment the management service trains HFL jobs on."""

    superlink: str = Field(description="HOST:PORT of the SuperLink (its --port: the address flwr run and the "
                           "SuperNodes use)")
    root_certificates: str | None = Field(None, description="PEM CA the SuperLink's certificate is signed by")
    insecure: bool = Field(False, description="the SuperLink runs with --insecure (no TLS)")
    nodes: int = Field(1, ge=1, description="SuperNodes that must answer before training starts")
    task: str | None = Field(None, description="the task the nodes serve (task.name); a job naming another "
                             "is refused. None: any")
    control_host: str = Field("127.0.0.1", description="address the ServerApp connects back to (the service's "
                              "host as the SuperLink's host reaches it)")
    round_timeout_s: float = Field(60.0, gt=0, description="a node that has not answered by then drops out of "
                                   "the round")
    link_timeout_s: float = Field(30.0, gt=0, description="a SuperLink that does not answer a call by then is lost "
                                  "(ENGINE_FAILURE)")
    node_wait_s: float = Field(120.0, gt=0, description="how long the first round waits for the nodes")
    start_timeout_s: float = Field(120.0, gt=0, description="a run the SuperLink has not started by then fails")
    empty_rounds: int = Field(DEFAULT_EMPTY_ROUNDS, ge=1, description="a round no node answers is not an "
                              "iteration and is sent again; this many such rounds in a row end the job with "
                              "ENGINE_FAILURE, naming each node's last error")

    @field_validator("superlink")
    @classmethod
    def _address(cls, v: str) -> str:
        host, _, port = v.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"HOST:PORT, got {v!r}")
        return v

    @model_validator(mode="after")
    def _tls(self) -> FederationConfig:
        if not self.insecure and self.root_certificates is None:
            raise ValueError("root_certificates (the SuperLink's CA), or insecure = true for a SuperLink started "
                             "with --insecure")
        return self

    def run_config(self) -> dict[str, Any]:
        return {"round-timeout": self.round_timeout_s, "link-timeout": self.link_timeout_s,
                "node-wait": self.node_wait_s, "min-nodes": self.nodes, "empty-rounds": self.empty_rounds}


def unreachable(fed: FederationConfig, timeout_s: float = 10.0) -> str | None:
    """Why the SuperLink of ``fed`` cannot be reached (None when it answers, and, with TLS, proves it holds
    a certificate the federation's CA signed)."""
    host, _, port = fed.superlink.rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            if fed.insecure:
                return None
            ctx = ssl.create_default_context(cafile=fed.root_certificates)
            ctx.set_alpn_protocols(["h2"])
            with ctx.wrap_socket(sock, server_hostname=host):
                return None
    except (OSError, ssl.SSLError) as exc:
        return f"its SuperLink {fed.superlink} cannot be reached: {exc}"


def _accept(listener: Listener, out: list[Connection], ready: threading.Event) -> None:
    """The first connection that authenticates (the ServerApp's) into ``out``."""
    from multiprocessing import AuthenticationError

    while True:
        try:
            out.append(listener.accept())
            break
        except AuthenticationError:
            continue  # not the run's ServerApp
        except OSError:
            break
    ready.set()


def _hang_up(app: Connection) -> None:
    """End the ServerApp's connection now: the ServerApp sees it end (and cancels), and a thread blocked reading
    it wakes (closing the descriptor alone would do neither while that read is blocked)."""
    try:
        sock = socket.socket(fileno=app.fileno())
    except OSError:
        return  # already closed
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()


def _pass_on(src: Connection, dst: Connection, on_end: Any) -> None:
    """Every message of ``src`` to ``dst`` until either closes; then ``on_end()``."""
    try:
        while True:
            dst.send(src.recv())
    except (EOFError, OSError):
        pass
    on_end()


def relay(spec: dict[str, Any], conn: Connection) -> None:
    """Train ``spec`` (a worker spec whose ``federation`` is ``{"name", "config"}``) on its federation, relaying
    the worker protocol between the service (``conn``) and the Flower run (see the module docstring)."""
    import os

    from sluice.runtimes.flower.deploy import DeploymentError, submit, write_connection
    from sluice.runtimes.flower.engine import node_data_refusal
    from sluice.runtimes.jobs import job_from_dict

    name = spec["federation"]["name"]
    if spec["federation"]["config"] is None:
        conn.send({"kind": "failed", "before_training": True, "error": f"federation {name!r} is no longer in this "
                   "service's configuration"})
        return
    fed = FederationConfig.model_validate(spec["federation"]["config"])
    problem = node_data_refusal(spec.get("requirements")) or unreachable(fed)
    if problem is not None:
        conn.send({"kind": "refused", "error": f"federation {name!r}: {problem}"})
        return
    key = os.urandom(32)
    with tempfile.TemporaryDirectory(prefix="sluice-relay-") as tmp, \
            Listener((fed.control_host, 0), authkey=key) as listener:
        work = Path(tmp)
        home = work / "flwr-home"
        write_connection(home, "sluice", fed.superlink, None if fed.insecure else Path(fed.root_certificates))
        host, port = listener.address[0], listener.address[1]
        try:
            sub = submit(job_from_dict("hfl", spec["raw"]).dump(), Path(""), work, home, run_config={
                **fed.run_config(), "sluice-control": f"{host}:{port}", "sluice-key": key.hex()})
        except DeploymentError as exc:
            conn.send({"kind": "failed", "before_training": True, "error": f"federation {name!r}: {exc}"})
            return
        app, waiting = _await_app(listener, fed, home, sub.run_id, conn, name)
        if app is None:
            return
        app.send({**spec, "work_dir": None})
        for cmd in waiting:
            app.send(cmd)
        _serve(conn, app, fed, name, sub.run_id)


def _await_app(listener: Listener, fed: FederationConfig, home: Path, run_id: int, conn: Connection,
               name: str) -> tuple[Connection | None, list[dict[str, Any]]]:
    """The ServerApp's connection once it connects, and the service's commands that came meanwhile; no
    connection (the failure sent) when the run did not start in time or ended first, or the service went
    away (the run is stopped)."""
    from sluice.runtimes.flower.deploy import run_status, stop_run

    got: list[Connection] = []
    waiting: list[dict[str, Any]] = []
    ready = threading.Event()
    threading.Thread(target=_accept, args=(listener, got, ready), daemon=True, name="sluice-relay-accept").start()
    end = time.monotonic() + fed.start_timeout_s
    look = time.monotonic() + 10.0
    status = ""
    while not ready.wait(0.2):
        try:
            while conn.poll():
                waiting.append(conn.recv())
        except (EOFError, OSError):  # the service went away
            stop_run(home, run_id)
            return None, waiting
        if time.monotonic() > look:  # a run that ended before its ServerApp connected will not connect
            look = time.monotonic() + 10.0
            status = str(run_status(home, run_id).get("status") or status)
        if time.monotonic() > end or status.startswith("finished"):
            stop_run(home, run_id)
            status = str(run_status(home, run_id).get("status") or status or "unknown")
            conn.send({"kind": "failed", "before_training": True, "error": f"federation {name!r}: Flower run "
                       f"{run_id} did not start Sluice's ServerApp within {fed.start_timeout_s:g} s (status {status})"})
            return None, waiting
    return (got[0] if got else None), waiting


def _serve(conn: Connection, app: Connection, fed: FederationConfig, name: str, run_id: int) -> None:
    """Relay both ways until the ServerApp is done; a ServerApp gone without its last word fails the process."""
    threading.Thread(target=_pass_on, args=(conn, app, lambda: _hang_up(app)), daemon=True,
                     name="sluice-relay-commands").start()
    last: dict[str, Any] = {}
    try:
        while True:
            msg = app.recv()
            last = msg
            conn.send(msg)
            if msg.get("kind") in ("done", "failed", "refused"):
                return
    except (EOFError, OSError):
        pass
    if last.get("kind") not in ("done", "failed", "refused"):
        link = unreachable(fed, timeout_s=5.0)
        why = f"; {link}" if link else ""
        try:
            conn.send({"kind": "failed", "before_training": False, "error": f"federation {name!r}: the ServerApp "
                       f"of Flower run {run_id} went away without a report{why}"})
        except OSError:
            pass  # the service is gone too
