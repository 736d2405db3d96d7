"""Configuration of the management service (``sluice serve [CONFIG.toml]``).

Every key is optional; the defaults run on ``127.0.0.1:8080`` with a SQLite file in the working
directory. In a TOML file the keys sit at the top level or under a ``[service]`` table::

    port = 8080
    database = "sqlite:///sluice-service.db"      # any SQLAlchemy URL
    max_concurrent = 2
    [policy]                                       # how the producer decides parameters (ProducerPolicy)
    default_iterations = 50
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from sluice.control.producer import ProducerPolicy
from sluice.schema import Section

_RDN_ID = re.compile(r"^[A-Za-z0-9_.\-~:]+$")


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
    policy: ProducerPolicy = Field(default_factory=ProducerPolicy)

    @field_validator("subnetwork", "training_function", "model_repository")
    @classmethod
    def _rdn(cls, v: str) -> str:
        if not _RDN_ID.fullmatch(v):
            raise ValueError(f"must be letters, digits and _.-~: only, got {v!r}")
        return v

    @field_validator("mns_root")
    @classmethod
    def _root(cls, v: str) -> str:
        v = v.rstrip("/")
        if v and not v.startswith("/"):
            raise ValueError(f"a path starting with '/', or empty; got {v!r}")
        return v

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
