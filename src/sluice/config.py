"""Configuration: TOML files validated by pydantic models, with ``--set key=value`` overrides.

Every option has a default that runs; an invalid value raises :class:`ConfigError` naming the field
and what is allowed.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, model_validator

from sluice.control.params import Requirements, Termination
from sluice.errors import ConfigError
from sluice.schema import Section


class DataConfig(Section):
    dataset: Literal["digits", "breast_cancer", "mnist", "synthetic"] = "digits"
    num_clients: int = Field(20, ge=1, le=100_000)
    partition: Literal["iid", "dirichlet", "shards"] = "dirichlet"
    alpha: float = Field(0.3, gt=0, description="Dirichlet concentration (smaller = more skew)")
    shards_per_client: int = Field(2, ge=1)
    test_fraction: float = Field(0.2, gt=0, lt=1)
    synthetic_alpha: float = Field(1.0, ge=0, description="FedProx Synthetic(alpha, beta): model skew")
    synthetic_beta: float = Field(1.0, ge=0, description="FedProx Synthetic(alpha, beta): data skew")


class ModelConfig(Section):
    hidden: list[int] = Field(default_factory=lambda: [128, 128])

    @model_validator(mode="after")
    def _positive(self) -> ModelConfig:
        if any(h <= 0 for h in self.hidden):
            raise ValueError(f"hidden layer sizes must be positive integers, got {self.hidden}")
        return self


class TrainConfig(Section):
    rounds: int = Field(150, ge=1)
    participation: float = Field(0.25, gt=0, le=1, description="fraction q of terminals sampled per round")
    dropout: float = Field(0.0, ge=0, lt=1, description="probability a sampled terminal fails mid-round")
    local_epochs: int = Field(2, ge=1)
    batch_size: int = Field(16, ge=1)
    lr: float = Field(0.05, gt=0)
    server_lr: float = Field(1.0, gt=0)
    eval_every: int = Field(1, ge=1)


class CompressionConfig(Section):
    up: Literal["dense", "randk", "topk", "sketch"] = "randk"
    up_ratio: float = Field(0.02, gt=0, le=1, description="k/d for rand-k and top-k uploads")
    up_values: Literal["auto", "fp32", "fp16"] = Field(
        "auto", description="upload value type; auto = fp32 for dense uploads, fp16 for compressed ones"
    )
    sketch_rows: int = Field(5, ge=1)
    sketch_cols_ratio: float = Field(0.1, gt=0, le=1, description="sketch columns as a fraction of d")
    lossless: Literal["none", "zstd"] = "none"
    down: Literal["dense", "topk"] = "topk"
    down_ratio: float = Field(0.005, gt=0, le=1, description="k/d the server applies per round (top-k)")
    down_values: Literal["auto", "fp32", "fp16"] = Field(
        "auto", description="type of the server's applied steps; auto = fp16 with top-k, fp32 with dense"
    )
    momentum: float = Field(0.0, ge=0, lt=1, description="server momentum rho")
    downlink: Literal["dense", "initial", "per-client", "anchor"] = "per-client"
    anchor_every: int = Field(10, ge=1)


class RunConfig(Section):
    seed: int = 0
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    compression: CompressionConfig = Field(default_factory=CompressionConfig)
    requirements: Requirements | None = Field(None, description="training requirements (R1); none by default")
    termination: Termination | None = Field(
        None, description="termination parameters (T1); train.rounds is the iteration limit unless given here"
    )


M = TypeVar("M", bound=BaseModel)


def format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        msg = err["msg"]
        if err["type"] == "literal_error":
            msg = "must be one of " + msg.split("Input should be ", 1)[-1]
        elif err["type"] == "extra_forbidden":
            msg = "unknown key"
        got = err.get("input")
        suffix = f" (got {got!r})" if got is not None and err["type"] != "extra_forbidden" else ""
        lines.append(f"{loc}: {msg}{suffix}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def _parse_value(text: str) -> Any:
    """Read an override value as TOML/JSON when it parses, else keep it as a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to a raw config dict (in place) and return it."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value (for example train.rounds=50), got {item!r}")
        key, value = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"--set has an empty key in {item!r}")
        node = raw
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {p!r} is a value, not a section")
        node[parts[-1]] = _parse_value(value.strip())
    return raw


def load_config(
    path: str | Path | None, overrides: list[str] | None = None, model: type[M] = RunConfig  # type: ignore[assignment]
) -> M:
    """Load a TOML file (or the defaults when ``path`` is None), apply overrides and validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p} is not valid TOML: {exc}") from exc
    apply_overrides(raw, overrides or [])
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from exc
