"""Checks of what consumers send that the OpenAPI schemas cannot express: termination conditions as text,
configuration errors as 3GPP error bodies, and training-data uploads."""

from __future__ import annotations

import json
import math
from typing import Any

from sluice.service.nrm import MnSError

MAX_UPLOAD_SAMPLES = 200_000


def finite(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def parse_conditions(text: str) -> dict[str, Any]:
    """``terminationConditions`` as termination parameters: a JSON object, or ``key=value`` pairs joined by
    ``;`` with dotted keys (``iterations=20; performance.test_accuracy=0.9``), as the producer writes it."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise MnSError(400, f"terminationConditions is not valid JSON: {exc}",
                           bad_attributes=["terminationConditions"]) from exc
        if not isinstance(doc, dict):
            raise MnSError(400, "terminationConditions must be a JSON object", bad_attributes=["terminationConditions"])
        return doc
    out: dict[str, Any] = {}
    for pair in text.split(";"):
        if not pair.strip():
            continue
        key, eq, raw = pair.partition("=")
        if not eq or not key.strip():
            raise MnSError(400, f"terminationConditions: {pair.strip()!r} is not key=value",
                           bad_attributes=["terminationConditions"])
        try:
            value = json.loads(raw.strip())
        except ValueError:
            value = raw.strip()
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def config_error(exc: Exception, default: str) -> MnSError:
    """A 400 naming the VsDataContainer each bad field of a job belongs to."""
    text = str(exc)
    bad: list[str] = []
    for line in text.split("\n"):
        line = line.strip()
        if line.startswith("requirements."):
            bad.append("VsDataContainer/sluice-requirements")
        elif line.startswith("termination."):
            bad.append("VsDataContainer/sluice-termination")
        elif line and not line.startswith("invalid"):
            bad.append(default)
    return MnSError(400, text.replace("\n  ", "; "), bad_attributes=list(dict.fromkeys(bad or [default])))


def check_data(data: Any) -> dict[str, Any]:
    """A training-data upload (``sluice-data``) as the engines take it; 400 (413 for too many samples) naming
    what is wrong."""
    where = "VsDataContainer/sluice-data"
    if not isinstance(data, dict):
        raise MnSError(400, "sluice-data vsData must be an object {X: [[...], ...], y: [...], client?: n}",
                       bad_attributes=[where])
    extra = sorted(set(data) - {"X", "y", "client"})
    if extra:
        raise MnSError(400, f"sluice-data takes X, y and client; unknown {extra}", bad_attributes=[where])
    X, y = data.get("X"), data.get("y")
    if not isinstance(X, list) or not X or not all(isinstance(r, list) for r in X):
        raise MnSError(400, "sluice-data X must be a non-empty list of rows (samples × features)",
                       bad_attributes=[f"{where}/X"])
    width = len(X[0])
    if width == 0 or any(len(r) != width for r in X):
        raise MnSError(400, f"sluice-data X rows must all have the same number of features ({width} in row 0)",
                       bad_attributes=[f"{where}/X"])
    if not all(finite(v) for r in X for v in r):
        raise MnSError(400, "sluice-data X must hold finite numbers only", bad_attributes=[f"{where}/X"])
    if not isinstance(y, list) or len(y) != len(X):
        raise MnSError(400, f"sluice-data y must be a list with one label per row of X ({len(X)})",
                       bad_attributes=[f"{where}/y"])
    if not all(finite(v) or (isinstance(v, list) and all(finite(u) for u in v)) for v in y):
        raise MnSError(400, "sluice-data y must hold finite numbers only", bad_attributes=[f"{where}/y"])
    if len(X) > MAX_UPLOAD_SAMPLES:
        raise MnSError(413, f"at most {MAX_UPLOAD_SAMPLES} samples per upload", bad_attributes=[where])
    c = data.get("client")
    if c is not None and (not isinstance(c, int) or isinstance(c, bool) or c < 0):
        raise MnSError(400, "sluice-data client must be an integer >= 0", bad_attributes=[f"{where}/client"])
    return data
