"""Validation of ProvMnS bodies against Sluice's OpenAPI bundle (``openapi/bundle.json``).

The bundle is a pruned copy of the official 3GPP definitions (TS 28.105 AI/ML NRM, TS 28.532 ProvMnS, TS 28.623)
with the deviations listed in its ``info``; ``scripts/build_openapi_bundle.py`` writes it. Its schemas are
OpenAPI 3.0 schemas; they are translated once to JSON Schema 2020-12 (``nullable`` becomes a ``"null"`` type) and
compiled into two validators:

- the *write* validator treats ``readOnly`` as an assertion, so a consumer that sends a producer-owned attribute
  (``requestStatus``, ``trainingReportRef``, ``VsDataContainer[].attributes.vsDataType`` ...) is refused;
- the *read* validator treats ``writeOnly`` as an assertion and is used on what the producer sends.

Only jsonschema is needed at import time (no web framework), so the same checks run in tests and tools.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Iterator
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from sluice.errors import SluiceError

BUNDLE_URI = "urn:sluice:provmns-bundle"
WRITABLE_CLASSES = ("MLTrainingRequest", "MLTrainingProcess", "NtfSubscriptionControl", "MLTrainingReport", "MLModel")
"""Classes ``check_write`` knows; their bodies are ``<Class>-Single`` and ``<Class>-MergePatch`` in the bundle."""

_MAX_REPORTED = 5
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


class SchemaViolation(SluiceError):
    """A body does not conform to the bundle. ``bad_attributes`` names what is wrong: attribute names for
    ``check_write`` (for the ``badAttributes`` member of a TS 28.532 error body), JSON paths for
    ``check_response``."""

    def __init__(self, message: str, bad_attributes: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.bad_attributes = list(bad_attributes or [])

    def __str__(self) -> str:
        return self.message


@cache
def load_bundle() -> dict[str, Any]:
    """The OpenAPI bundle the service validates against and serves (parsed once; do not modify it)."""
    text = resources.files("sluice.service").joinpath("openapi/bundle.json").read_text(encoding="utf-8")
    return json.loads(text)


# --------------------------------------------------------------------------------------------------------------
# OpenAPI 3.0 schema -> JSON Schema 2020-12


def _to_json_schema(node: Any) -> Any:
    """Translate the OpenAPI 3.0 dialect: ``nullable: true`` next to ``type`` admits null as well. Other
    OpenAPI keywords (``readOnly``, ``writeOnly``, ``example``, ``x-*``) are annotations here and stay."""
    if isinstance(node, list):
        return [_to_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _to_json_schema(v) for k, v in node.items()}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
    return out


def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _RFC3339.match(value):
        return False
    try:
        datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    except ValueError:
        return False
    return True


def _read_only(validator: Any, read_only: Any, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if read_only is True:
        yield ValidationError("is readOnly: only the MnS producer sets it")


def _write_only(validator: Any, write_only: Any, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if write_only is True:
        yield ValidationError("is writeOnly: the MnS producer never returns it")


_WriteValidator = validators.extend(Draft202012Validator, {"readOnly": _read_only})
_ReadValidator = validators.extend(Draft202012Validator, {"writeOnly": _write_only})


class _Compiled:
    """Validators for the bundle's schemas, built once per process."""

    def __init__(self, bundle: dict[str, Any]) -> None:
        contents = _to_json_schema(copy.deepcopy(bundle))
        contents.pop("paths", None)
        self.schemas: dict[str, Any] = contents["components"]["schemas"]
        resource = Resource.from_contents(contents, default_specification=DRAFT202012)
        self.registry: Registry = Registry().with_resource(BUNDLE_URI, resource)
        self.formats = FormatChecker(formats=())
        self.formats.checks("date-time")(_date_time)
        self._write: dict[str, Any] = {}
        self._read: dict[str, Any] = {}

    def _make(self, cls: Any, name: str) -> Any:
        if name not in self.schemas:
            raise KeyError(f"the bundle has no schema {name!r}")
        schema = {"$ref": f"{BUNDLE_URI}#/components/schemas/{name}"}
        return cls(schema, registry=self.registry, format_checker=self.formats)

    def write(self, name: str) -> Any:
        if name not in self._write:
            self._write[name] = self._make(_WriteValidator, name)
        return self._write[name]

    def read(self, name: str) -> Any:
        if name not in self._read:
            self._read[name] = self._make(_ReadValidator, name)
        return self._read[name]


@cache
def _compiled() -> _Compiled:
    return _Compiled(load_bundle())


# --------------------------------------------------------------------------------------------------------------
# Error mapping


def _leaves(error: ValidationError) -> list[list[Any]]:
    """Instance paths of what is wrong: for a missing or unexpected member, the path of that member."""
    path = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [k for k in error.validator_value if k not in error.instance]
        return [[*path, k] for k in missing] or [path]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        extra = sorted(k for k in error.instance if k not in known)
        return [[*path, k] for k in extra] or [path]
    return [path]


def _attribute_name(path: list[Any]) -> str | None:
    """The attribute a failing instance path belongs to: the member of ``attributes``, the name inside a
    ``VsDataContainer`` entry (e.g. ``vsDataType``), or the top-level member (``id``, ``objectClass``)."""
    if not path:
        return None
    if path[0] == "attributes" and len(path) > 1:
        return str(path[1])
    if path[0] == "VsDataContainer":
        names = [p for p in path if isinstance(p, str)]
        return names[-1]
    return str(path[0])


def _json_path(path: Iterable[Any]) -> str:
    out = "$"
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}" if re.fullmatch(r"[A-Za-z_][\w-]*", str(p)) else f"[{p!r}]"
    return out


def _describe(errors: list[ValidationError]) -> str:
    parts = [f"{_json_path(e.absolute_path)}: {e.message}" for e in errors[:_MAX_REPORTED]]
    more = len(errors) - _MAX_REPORTED
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _expand(error: ValidationError) -> list[ValidationError]:
    """The errors inside a failed ``anyOf``/``oneOf`` of the branch that came closest (fewest errors, then the
    first), so that a missing ``type`` reads as ``$.type`` rather than as "not valid under any of"."""
    if error.validator not in ("anyOf", "oneOf") or not error.context:
        return [error]
    branches: dict[int, list[ValidationError]] = {}
    for sub in error.context:
        branches.setdefault(int(sub.relative_schema_path[0]), []).append(sub)
    if error.validator == "oneOf" and len(branches) < len(error.validator_value):
        return [error]  # valid under several branches: the error is the oneOf itself
    _, closest = min(branches.items(), key=lambda item: (len(item[1]), item[0]))
    return [leaf for sub in closest for leaf in _expand(sub)]


def _sorted_errors(validator: Any, body: Any) -> list[ValidationError]:
    errors = [leaf for e in validator.iter_errors(body) for leaf in _expand(e)]
    return sorted(errors, key=lambda e: ([str(p) for p in e.absolute_path], str(e.message)))


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


# --------------------------------------------------------------------------------------------------------------
# Public checks


def check_write(class_name: str, body: Any, *, partial: bool = False, label: str | None = None) -> None:
    """Refuse a consumer's body for ``class_name`` that the bundle does not admit.

    ``partial=False``: a full representation for PUT/POST (``{"id", "attributes", "VsDataContainer"?}``), checked
    against ``<Class>-Single``. ``partial=True``: an RFC 7396 merge-patch document (``{"attributes": {...}}`` with
    some attributes), checked against ``<Class>-MergePatch``. In both cases an attribute the producer owns
    (readOnly) or that the class does not define is an error; ``label`` names the body in the message (default
    ``merge patch`` or ``representation``). Raises ``SchemaViolation`` whose ``bad_attributes``
    are the offending attribute names (e.g. ``["requestStatus"]``).
    """
    if class_name not in WRITABLE_CLASSES:
        raise ValueError(f"unknown class {class_name!r}; expected one of {', '.join(WRITABLE_CLASSES)}")
    if not isinstance(body, dict):
        raise SchemaViolation(f"{class_name} body must be a JSON object, not {type(body).__name__}", [])
    name = f"{class_name}-MergePatch" if partial else f"{class_name}-Single"
    errors = _sorted_errors(_compiled().write(name), body)
    if not errors:
        return
    bad = _unique(n for e in errors for leaf in _leaves(e) if (n := _attribute_name(leaf)) is not None)
    kind = label or ("merge patch" if partial else "representation")
    raise SchemaViolation(f"invalid {class_name} {kind}: {_describe(errors)}", bad)


def check_response(schema_name: str, body: Any) -> None:
    """Refuse a body the producer sends (response, notification) that does not validate against the bundle schema
    ``schema_name`` (e.g. ``MLTrainingRequest-Single``, ``ErrorResponseDefault``, ``NotifyMoiCreation``).
    readOnly members are expected here; writeOnly ones are errors. ``bad_attributes`` are JSON paths
    (``$.attributes.requestStatus``)."""
    errors = _sorted_errors(_compiled().read(schema_name), body)
    if not errors:
        return
    bad = _unique(_json_path(leaf) for e in errors for leaf in _leaves(e))
    raise SchemaViolation(f"body does not validate against {schema_name}: {_describe(errors)}", bad)
