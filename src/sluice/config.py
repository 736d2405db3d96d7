"""Configuration loader: TOML files validated by pydantic models, with ``--set key=value`` overrides.

The sections themselves live with what they configure (``sluice.hfl.config``, ``sluice.split.config``,
``sluice.local.config``; jobs in ``sluice.runtimes.jobs``). An invalid value raises :class:`ConfigError` naming
the field and what is allowed.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sluice.errors import ConfigError

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


def parse_value(text: str) -> Any:
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
        node[parts[-1]] = parse_value(value.strip())
    return raw


def merge_patch(base: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch of ``patch`` onto ``base``: a new object in which ``None`` deletes a key
    and nested objects merge."""
    if not isinstance(patch, dict):
        return patch
    out = dict(base) if isinstance(base, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def read_toml(path: str | Path | None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The raw settings of a TOML file (``{}`` when ``path`` is None) with ``--set`` overrides applied."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p} is not valid TOML: {exc}") from exc
    return apply_overrides(raw, overrides or [])


def toml_ready(obj: Any) -> Any:
    """``obj`` (dicts, lists and tuples of values) as TOML can hold it: TOML has no null, so ``None`` values
    are dropped recursively and tuples become lists."""
    if isinstance(obj, dict):
        return {k: toml_ready(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list | tuple):
        return [toml_ready(v) for v in obj]
    return obj


def validate(model: type[M], raw: dict[str, Any]) -> M:
    """``model`` validated from ``raw``, or :class:`ConfigError` listing every bad field."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from exc


def load_config(path: str | Path | None, overrides: list[str] | None, model: type[M]) -> M:
    """Load a TOML file (or the defaults when ``path`` is None), apply overrides and validate."""
    return validate(model, read_toml(path, overrides))
