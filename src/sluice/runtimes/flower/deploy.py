"""Flower deployments for Sluice: a local one on 127.0.0.1 (SuperLink + N SuperNodes as processes), and the
submission of a Sluice job to any SuperLink.

:class:`LocalDeployment` picks free ports, makes a CA and a SuperLink certificate in its directory (TLS
unless ``tls=False``), starts ``flower-superlink`` (runtime dependency installation disabled) and one
``flower-supernode`` per terminal (``--node-config partition-id=<c>``), each in its own process group with
its log in the directory, and stops every process it started, with their descendants, in :meth:`stop`
(also when used as a context manager that exits on an error or Ctrl-C).

:func:`submit` writes the Flower App (a ``pyproject.toml`` naming :mod:`sluice.runtimes.flower.app`) and the run
configuration (the job as JSON, the run directory, the timeouts) and starts the run with ``flwr run``;
:func:`watch` follows the run directory the ServerApp writes until its report is there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sluice.errors import SluiceError
from sluice.runtimes.flower import protocol as P
from sluice.runtimes.flower.certs import CertFiles, make_certificates

FLOWER_VERSION = "1.41.0"


class DeploymentError(SluiceError):
    """A Flower process could not be started, or the run could not be submitted or followed."""


STARTED_BY_NAME = ("flower-superexec", "flwr-serverapp", "flwr-clientapp")
"""Flower executables the SuperLink and the SuperNodes start by name, from their ``PATH``."""


def _bin(name: str) -> str:
    """A Flower executable of this Python's environment."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        by_name = (" (the SuperLink and the SuperNodes start it by name: Flower's processes get that directory first "
                   "on their PATH)" if name in STARTED_BY_NAME else "")
        raise DeploymentError(f"{name} not found next to {sys.executable}{by_name}; install Flower with "
                              f"pip install 'sluice[flower]' (flwr=={FLOWER_VERSION}) in that environment")
    return str(path)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION = re.compile(r"^[\w.]*(Error|Exception): ")
_MISSING = re.compile(r"No such file or directory: '([^'/]+)'")


def log_reason(log: Path | None) -> str:
    """The last exception a Flower log records (else its last ``ERROR`` line): why a process exited or a run did
    not start. An executable it could not find is named, with what to do."""
    if log is None or not log.exists():
        return ""
    lines = [_ANSI.sub("", line).strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines()]
    for pattern in (_EXCEPTION, re.compile(r"^ERROR\b")):
        found = [line for line in lines if pattern.search(line)]
        if found:
            missing = _MISSING.search(found[-1])
            return found[-1] + (f" ({missing.group(1)}, which it starts by name, is not on its PATH: put the bin "
                                "directory of the environment Flower is installed in first on PATH)" if missing else "")
    return ""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def flower_env(home: Path) -> dict[str, str]:
    """Environment of every Flower process: this environment's executables first, telemetry off, no
    installation of app dependencies at run time, Flower's state under ``home``, the deprecation warnings of
    Flower's own dependencies (typer, click) out of the log ``sluice run`` shows unless ``PYTHONWARNINGS`` says
    otherwise. Flower's other settings (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``...) pass through from this
    environment."""
    env = dict(os.environ)
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update({"FLWR_TELEMETRY_ENABLED": "0", "FLWR_HOME": str(home),
                "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "PYTHONUNBUFFERED": "1"})
    return env


def _kill_tree(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Stop ``proc``, its process group and every descendant (Flower detaches some of its children)."""
    import psutil

    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        kids = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        for k in kids:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                k.send_signal(sig)
        _, alive = psutil.wait_procs(kids, timeout=grace_s if sig == signal.SIGTERM else 1.0)
        try:
            proc.wait(timeout=grace_s if sig == signal.SIGTERM else 1.0)
        except subprocess.TimeoutExpired:
            continue
        if not alive:
            return


@dataclass
class LocalDeployment:
    """A SuperLink and ``nodes`` SuperNodes on 127.0.0.1, with everything in ``workdir``. ``node_args[i]``
    are task arguments of node ``i`` alone (``task.<name>=<value>`` in its node configuration: a path to the
    node's own files, say). With ``simulation`` the SuperLink runs Flower's Simulation Engine instead
    (``flower-superlink --simulation``): no SuperNode processes, the run's virtual SuperNodes (``partition-id``
    0, 1...) come from the federation configuration :func:`submit` sends."""

    workdir: Path
    nodes: int
    tls: bool = True
    terminals: int | None = None
    node_args: dict[int, dict[str, Any]] = field(default_factory=dict)
    simulation: bool = False
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    port: int = 0
    certs: CertFiles | None = None

    def __post_init__(self) -> None:
        self.workdir = Path(self.workdir).resolve()
        self.home = self.workdir / "flwr-home"
        self.logs = self.workdir / "logs"
        self._logs: list[TextIO] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "a", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=flower_env(self.home), cwd=self.workdir, start_new_session=True)
        self.procs[name] = proc
        return proc

    def start(self, wait_s: float = 60.0) -> LocalDeployment:
        """Start the SuperLink, wait until it accepts connections, then start the SuperNodes."""
        for name in STARTED_BY_NAME + (("flwr-simulation",) if self.simulation else ()):
            _bin(name)  # missing, the SuperLink or a node would fail later on, saying less
        self.logs.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        argv = [_bin("flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
                "--disable-runtime-dependency-installation"]
        if self.tls:
            self.certs = make_certificates(self.workdir / "certs", ["127.0.0.1", "localhost"])
            argv += ["--ssl-ca-certfile", str(self.certs.ca), "--ssl-certfile", str(self.certs.cert),
                     "--ssl-keyfile", str(self.certs.key)]
        else:
            argv.append("--insecure")
        if self.simulation:
            argv.append("--simulation")
        link = self._spawn("superlink", argv)
        write_connection(self.home, "sluice", self.address, self.certs.ca if self.certs else None)
        end = time.monotonic() + wait_s
        while True:
            if link.poll() is not None:
                raise DeploymentError(f"the SuperLink exited{self.exit_reason()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                break
            if time.monotonic() > end:
                raise DeploymentError(f"the SuperLink did not listen on {self.address} within {wait_s:g} s")
            time.sleep(0.2)
        for i in range(0 if self.simulation else self.nodes):
            self.start_node(i)
        return self

    def exit_reason(self) -> str:
        """`` with status S: REASON; see LOG`` when the SuperLink exited (the last error of its log), else ``""``."""
        link = self.procs.get("superlink")
        if link is None or link.poll() is None:
            return ""
        log = self.logs / "superlink.log"
        why = log_reason(log)
        return f" with status {link.returncode}{': ' + why if why else ''}; see {log}"

    def start_node(self, i: int) -> subprocess.Popen:
        """Start (or restart, with an empty state) the SuperNode of terminal ``i``."""
        old = self.procs.get(f"node-{i}")
        if old is not None and old.poll() is None:
            raise DeploymentError(f"the SuperNode of terminal {i} is running")
        total = self.terminals or self.nodes
        own = "".join(f" task.{k}={json.dumps(v)}" for k, v in self.node_args.get(i, {}).items())
        argv = [_bin("flower-supernode"), "--superlink", self.address, "--port", str(free_port()),
                "--node-config", f"{P.NODE_TERMINAL_KEY}={i} {P.NODE_COUNT_KEY}={total}{own}",
                "--max-retries", "3", "--max-wait-time", "30"]
        argv += ["--root-certificates", str(self.certs.ca)] if self.certs else ["--insecure"]
        return self._spawn(f"node-{i}", argv)

    def kill_node(self, i: int) -> None:
        """Kill the SuperNode of terminal ``i`` (SIGKILL: it gets no chance to say goodbye)."""
        proc = self.procs[f"node-{i}"]
        import psutil

        kids = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for k in kids:
            with contextlib.suppress(psutil.NoSuchProcess):
                k.kill()
        proc.wait(timeout=10)

    def kill_superlink(self) -> None:
        """Kill the SuperLink (SIGKILL)."""
        proc = self.procs["superlink"]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop every process this deployment started, nodes first."""
        for name in sorted(self.procs, key=lambda n: n == "superlink"):
            _kill_tree(self.procs[name])
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> LocalDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_connection(home: Path, name: str, address: str, ca: Path | None) -> None:
    """Name the SuperLink at ``address`` ``name`` in ``$FLWR_HOME/config.toml`` (TLS with ``ca``, or
    insecure when None) for ``flwr``."""
    import tomli_w

    conn: dict[str, Any] = {"address": address}
    if ca is None:
        conn["insecure"] = True
    else:
        conn["root-certificates"] = str(Path(ca).resolve())
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(tomli_w.dumps({"superlink": {"default": name, name: conn}}),
                                      encoding="utf-8")


def write_app(directory: Path) -> Path:
    """The Flower App directory ``flwr run`` bundles: a ``pyproject.toml`` naming Sluice's ServerApp and
    ClientApp and declaring the run configuration keys. Sluice itself must be installed where the
    SuperLink and the SuperNodes run (nothing is installed at run time)."""
    import tomli_w

    directory.mkdir(parents=True, exist_ok=True)
    doc = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {"name": "sluice-hfl", "version": "1.0.0", "license": "Apache-2.0", "dependencies": [],
                    "description": "Sluice horizontal FL: compressed traffic both ways, under a control plane"},
        "tool": {"flwr": {"app": {
            "publisher": "sluice",
            "components": {"serverapp": "sluice.runtimes.flower.app:server_app",
                           "clientapp": "sluice.runtimes.flower.app:client_app"},
            "config": dict(P.RUN_CONFIG_DEFAULTS),
        }}},
    }
    (directory / "pyproject.toml").write_text(tomli_w.dumps(doc), encoding="utf-8")
    (directory / "README.md").write_text("Sluice horizontal FL on Flower (generated by `sluice run --runtime "
                                         "flower`).\n", encoding="utf-8")
    return directory


@dataclass
class Submitted:
    run_id: int
    out: Path


def submit(job_doc: dict[str, Any], out: Path, workdir: Path, home: Path, *, connection: str = "sluice",
           run_config: dict[str, Any] | None = None, timeout_s: float = 120.0,
           federation_config: dict[str, Any] | None = None) -> Submitted:
    """Start the job on the SuperLink named ``connection`` in ``home``; its run directory is ``out`` (on
    the SuperLink's host). ``federation_config`` (``flwr run --federation-config``: ``num-supernodes``,
    ``init-args-num-cpus``...) configures a SuperLink that runs the Simulation Engine."""
    import tomli_w

    app = write_app(workdir / "app")
    values = {**P.RUN_CONFIG_DEFAULTS, **(run_config or {}), "sluice-job": json.dumps(job_doc),
              "out-dir": str(out)}
    cfg_file = workdir / "run-config.toml"
    cfg_file.write_text(tomli_w.dumps(values), encoding="utf-8")
    argv = [_bin("flwr"), "run", str(app), connection, "--run-config", str(cfg_file), "--format", "json"]
    if federation_config:
        argv += ["--federation-config", " ".join(f"{k}={json.dumps(v)}" for k, v in federation_config.items())]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, env=flower_env(home), cwd=workdir,
                             timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DeploymentError(f"flwr run did not answer within {timeout_s:g} s") from None
    try:
        doc = json.loads(res.stdout[res.stdout.index("{"):])
    except ValueError:
        doc = {}
    if res.returncode != 0 or not doc.get("success", False) or "run-id" not in doc:
        why = " ".join(str(doc.get("error-message") or (res.stdout + res.stderr).strip()[-2000:]).split())
        if "SuperLink is unavailable" in why:
            why += (" No SuperLink answers there: is it running? flower-superlink exits at its start when "
                    "flower-superexec, which it starts by name, is not on its PATH (its output ends with "
                    "FileNotFoundError: ... 'flower-superexec'): start it with the bin directory of its "
                    "environment first on PATH")
        raise DeploymentError(f"flwr run failed: {why}")
    return Submitted(int(doc["run-id"]), out)


def run_status(home: Path, run_id: int, connection: str = "sluice", timeout_s: float = 60.0) -> dict[str, Any]:
    """``flwr ls`` of one run as a dict (status, network traffic...); empty when it cannot be read."""
    argv = [_bin("flwr"), "ls", connection, "--run-id", str(run_id), "--format", "json"]
    try:
        res = subprocess.run(argv, capture_output=True, text=True, env=flower_env(home), timeout=timeout_s)
        doc = json.loads(res.stdout[res.stdout.index("{"):])
    except (subprocess.TimeoutExpired, ValueError):
        return {}
    runs = doc.get("runs") or []
    return runs[0] if runs else {}


def stop_run(home: Path, run_id: int, connection: str = "sluice", timeout_s: float = 60.0) -> None:
    """``flwr stop`` the run (a run that already ended stays as it is)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run([_bin("flwr"), "stop", str(run_id), connection], capture_output=True, env=flower_env(home),
                       timeout=timeout_s, check=False)
