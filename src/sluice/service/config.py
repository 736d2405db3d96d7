"""Configuration of the management service (``sluice serve [CONFIG.toml]``).

Every key is optional; the defaults run on ``127.0.0.1:8080`` with a SQLite file in the working
directory. In a TOML file the keys sit at the top level or under a ``[service]`` table::

    port = 8080
    database = "sqlite:///sluice-service.db"      # any SQLAlchemy URL
    max_concurrent = 2
    [policy]                                       # how the producer decides parameters (ProducerPolicy)
    default_iterations = 50
    [tasks]                                        # tasks consumers may name (task.name), besides built-ins
    churn = "mypackage.tasks:churn"                # a function returning a sluice.Task, imported here
    [producers.east]                               # a producer that chained requests may use
    url = "https://east.example:8443/ProvMnS/v1920/SubNetwork=SN1/MLTrainingFunction=TF1"
    [federations.edge]                             # a Flower deployment HFL jobs may train on
    superlink = "127.0.0.1:9092"
    root_certificates = "ca.pem"
    nodes = 3
    [auth]                                         # bearer tokens (sluice.service.auth)
    tokens_file = "tokens.toml"
    [tls]                                          # HTTPS; with client_ca, clients need a certificate it signed
    cert = "server.pem"
    key = "server.key"

Tasks: a request's job names its task (``[task] name``, with ``[task.args]``): a built-in one or one the
operator registered under ``[tasks]``. It never gives an import path (``task.factory``): that would let any
consumer run any code on the producer; the service refuses it (400). Workers import a registered factory,
so its package must be importable by ``sluice serve`` (installed, or on ``PYTHONPATH``).

Federations: an HFL job with ``federation = "<name>"`` (or ``"default"``: the service's
``default_federation``) trains on that Flower deployment (:mod:`sluice.runtimes.flower.relay`); a consumer never gives
an address. Jobs without one train in the worker's simulator.

Exposure: on a loopback address (``127.0.0.1``, ``::1``, ``localhost``) anything goes. On any other address
the service needs TLS and a way to tell callers apart (tokens, or client certificates with ``client_ca``);
:meth:`ServiceConfig.exposure_problem` says what is missing, and ``sluice serve`` refuses to start unless
``insecure = true`` (``--insecure``).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from sluice.control.policy import ProducerPolicy
from sluice.runtimes.flower.relay import FederationConfig
from sluice.schema import Section
from sluice.service.auth import AuthConfig
from sluice.service.chain import ProducerEndpoint

_RDN_ID = re.compile(r"^[A-Za-z0-9_.\-~:]+$")
_TASK_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_FACTORY_REF = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


class TLSConfig(Section):
    """``[tls]``: HTTPS with a certificate and its key; with ``client_ca``, mutual TLS."""

    cert: str | None = Field(None, description="PEM certificate (chain) of the service")
    key: str | None = Field(None, description="PEM private key of the certificate (default: in the cert file)")
    client_ca: str | None = Field(None, description="PEM CA(s): clients must present a certificate they signed")

    def files(self) -> list[str]:
        """The configured files, after checking they exist and go together (:class:`ConfigError`)."""
        from sluice.errors import ConfigError

        if self.cert is None and (self.key is not None or self.client_ca is not None):
            raise ConfigError("tls.key and tls.client_ca need tls.cert (--tls-cert)")
        named = [f for f in (self.cert, self.key, self.client_ca) if f is not None]
        missing = [f for f in named if not Path(f).is_file()]
        if missing:
            raise ConfigError(f"TLS file(s) not found: {', '.join(missing)}")
        return named


def is_loopback(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback IP address (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ServiceConfig(Section):
    """Where the service listens, how its URIs and names look, where it stores and how much it runs."""

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8080, ge=0, le=65535, description="0: any free port")
    mns_root: str = Field("", description="path prefix of {MnSRoot} ('' or e.g. /3GPPManagement)")
    mns_version: str = Field("v1920", description="{MnSVersion} of the URIs")
    subnetwork: str = Field("SN1", description="id of the SubNetwork holding everything")
    training_function: str = Field("TF1", description="id of the MLTrainingFunction")
    model_repository: str = Field("MR1", description="id of the MLModelRepository")
    database: str = Field("sqlite:///sluice-service.db", description="SQLAlchemy URL of the store")
    max_concurrent: int = Field(2, ge=1, description="training processes running at the same time")
    default_engine: str = Field("local", pattern="^(hfl|local|split)$",
                                description="engine of a request whose sluice-job names none")
    work_dir: str | None = Field(None, description="scratch folder of the workers (default: a temporary one)")
    worker_start: str = Field("forkserver", pattern="^(forkserver|spawn)$",
                              description="how workers start: forkserver (torch preloaded) or spawn")
    progress_interval_s: float = Field(0.2, ge=0, description="least time between stored progress updates")
    notify_timeout_s: float = Field(5.0, gt=0, description="timeout of one notification POST")
    notify_max_attempts: int = Field(12, ge=1, description="deliveries tried before a notification is dropped")
    notify_backoff_s: float = Field(0.5, gt=0, description="first retry delay; doubles up to 60 s")
    call_timeout_s: float = Field(30.0, gt=0, description="how long a request waits for a worker's answer")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="largest request body, as sent and decoded; "
                                "larger is refused (413, see sluice.service.limits)")
    max_upload_bytes: int = Field(64 << 20, ge=1024, description="largest training-data upload (PATCH/PUT of "
                                  "an MLTrainingProcess), as sent and decoded")
    checkpoint_every: int = Field(5, ge=0, description="iterations between the checkpoints a restarted service "
                                  "resumes a process from (0: none; the process then restarts from scratch)")
    worker_restarts: int = Field(3, ge=0, description="times a process whose worker died (killed, crashed) goes "
                                 "back to the queue to resume from its last checkpoint before it fails")
    notify_ca_file: str | None = Field(None, description="CA file verifying https notification recipients "
                                       "(default: the system's CAs)")
    auth: AuthConfig = Field(default_factory=AuthConfig)
    tls: TLSConfig = Field(default_factory=TLSConfig)
    insecure: bool = Field(False, description="listen on a non-loopback address without TLS or authentication")
    policy: ProducerPolicy = Field(default_factory=ProducerPolicy)
    producers: dict[str, ProducerEndpoint] = Field(
        default_factory=dict, description="producer services a chained request (engine = \"chain\") may use, "
                                          "by name: [producers.east] url = ..., token = ..., ca_file = ...")
    tasks: dict[str, str] = Field(
        default_factory=dict, description="tasks a request may name (task.name, with task.args) besides the "
        "built-in ones, by name: [tasks] churn = \"package.module:function\" (a function returning a "
        "sluice.Task, imported by this service and its workers: installed or on PYTHONPATH). Requests never "
        "give an import path themselves")

    federations: dict[str, FederationConfig] = Field(
        default_factory=dict, description="Flower deployments HFL jobs may train on, by name: [federations.edge] "
        "superlink = \"HOST:9092\", root_certificates = \"ca.pem\", nodes = 3 (a job names one: federation = "
        "\"edge\")")
    default_federation: str | None = Field(None, description="the federation of a job that says "
                                           "federation = \"default\"")

    @model_validator(mode="after")
    def _default_federation(self) -> ServiceConfig:
        if self.default_federation is not None and self.default_federation not in self.federations:
            raise ValueError(f"default_federation {self.default_federation!r} is not one of [federations]: "
                             f"{', '.join(sorted(self.federations)) or 'none configured'}")
        return self

    @field_validator("subnetwork", "training_function", "model_repository")
    @classmethod
    def _rdn(cls, v: str) -> str:
        if not _RDN_ID.fullmatch(v):
            raise ValueError(f"must be letters, digits and _.-~: only, got {v!r}")
        return v

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, v: dict[str, str]) -> dict[str, str]:
        from sluice.tasks.config import BUILTIN_NAMES

        for name, ref in v.items():
            if not _TASK_NAME.fullmatch(name):
                raise ValueError(f"task name {name!r}: letters, digits and _.- only, starting with a letter or _")
            if name in BUILTIN_NAMES:
                raise ValueError(f"task name {name!r} is a built-in task; register yours under another name")
            if not _FACTORY_REF.fullmatch(ref):
                raise ValueError(f"task {name!r}: {ref!r} is not 'package.module:function'")
        return v

    @field_validator("mns_root")
    @classmethod
    def _root(cls, v: str) -> str:
        v = v.rstrip("/")
        if v and not v.startswith("/"):
            raise ValueError(f"a path starting with '/', or empty; got {v!r}")
        return v

    def exposure_problem(self) -> str | None:
        """Why listening on :attr:`host` would expose the service (None when it would not): a non-loopback
        address needs TLS and tokens or client certificates, unless :attr:`insecure`."""
        if self.insecure or is_loopback(self.host):
            return None
        missing = []
        if self.tls.cert is None:
            missing.append("TLS (--tls-cert, --tls-key)")
        if not self.auth.enabled and self.tls.client_ca is None:
            missing.append("authentication (--tokens-file or [auth] tokens, or --tls-client-ca)")
        if not missing:
            return None
        return (f"refusing to listen on {self.host} without {' and '.join(missing)}: anyone who reaches it could "
                "read and change every training request. Listen on 127.0.0.1, add them, or pass --insecure")

    @property
    def base_path(self) -> str:
        """``{MnSRoot}/ProvMnS/{MnSVersion}`` as a path."""
        return f"{self.mns_root}/ProvMnS/{self.mns_version}"


def load_service_config(path: str | Path | None, overrides: list[str] | None = None) -> ServiceConfig:
    """The service configuration of a TOML file (keys at the top level or under ``[service]``) with
    ``--set`` overrides; :class:`sluice.errors.ConfigError` lists every bad key."""
    from sluice.config import read_toml, validate

    raw: dict[str, Any] = read_toml(path, overrides)
    if "service" in raw and isinstance(raw["service"], dict):
        inner = dict(raw.pop("service"))
        inner.update(raw)
        raw = inner
    return validate(ServiceConfig, raw)
