"""PATCH bodies: the four media types TS 28.532 lists, and RFC 6902 JSON Patch through the ``jsonpatch`` library.

* ``application/merge-patch+json`` (RFC 7396) and ``application/3gpp-merge-patch+json`` (TS 32.158): a
  merge patch of the target resource, ``{"attributes": {...}, "VsDataContainer": [...]}``. The 3GPP variant
  may also carry name-contained children as arrays by class; the resources this producer lets a consumer
  patch (requests, processes, subscriptions) have no children, so a 3GPP merge patch naming a class is a
  400, and otherwise it is the plain merge patch.
* ``application/json-patch+json`` (RFC 6902) and ``application/3gpp-json-patch+json`` (TS 32.158): an array
  of operations on ``{"attributes": ..., "VsDataContainer": ...}``. In the 3GPP variant a ``path`` (and a
  ``from``) may name the resource it applies to before a ``#``: ``#/attributes/priority`` is the target
  itself, and so is an empty or ``/`` resource part; a descendant is a 400 for the same reason.

Errors keep the 3GPP error body (:class:`sluice.service.nrm.MnSError`): an operation that is malformed or
whose path does not exist is a 400 naming the path, a failed ``test`` a 409; the whole resource cannot be
replaced, removed or moved (400).
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import jsonpointer

from sluice.service.nrm import MnSError

MERGE = ("application/merge-patch+json", "application/3gpp-merge-patch+json")
JSON_PATCH = ("application/json-patch+json", "application/3gpp-json-patch+json")
THREE_GPP = ("application/3gpp-merge-patch+json", "application/3gpp-json-patch+json")
MEDIA_TYPES = (*MERGE, *JSON_PATCH)
MEMBERS = frozenset({"id", "objectClass", "objectInstance", "attributes", "VsDataContainer"})


def check_merge_children(body: Any, ctype: str) -> None:
    """A 3GPP merge patch of a resource without children names no class (400 otherwise)."""
    if ctype in THREE_GPP and isinstance(body, dict):
        children = sorted(k for k in body if k not in MEMBERS)
        if children:
            raise MnSError(400, f"this resource has no name-contained children to patch: {', '.join(children)}",
                           bad_attributes=children)


def _own_path(path: Any, i: int, three_gpp: bool) -> Any:
    if not isinstance(path, str) or not three_gpp or "#" not in path:
        return path
    resource, _, pointer = path.partition("#")
    if resource.strip("/"):
        raise MnSError(400, f"JSON Patch operation {i}: {resource!r} is a descendant; this resource has no "
                       "name-contained children to patch", bad_attributes=[path])
    return pointer


def _operations(ops: Any, three_gpp: bool) -> list[dict[str, Any]]:
    if not isinstance(ops, list):
        raise MnSError(400, "a JSON Patch is an array of operations")
    out = []
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or not isinstance(op.get("op"), str) or not isinstance(op.get("path"), str):
            raise MnSError(400, f"JSON Patch operation {i} needs op and path (text)", bad_attributes=[f"/{i}"])
        op = {**op, "path": _own_path(op["path"], i, three_gpp)}
        if "from" in op:
            op["from"] = _own_path(op["from"], i, three_gpp)
        if op["op"] != "test" and (op["path"] == "" or op.get("from") == ""):
            raise MnSError(400, "a JSON Patch cannot replace, remove or move the whole resource",
                           bad_attributes=[op["path"]])
        out.append(op)
    return out


def apply_json_patch(doc: Any, ops: Any, three_gpp: bool = False) -> Any:
    """RFC 6902 ``ops`` applied to a copy of ``doc`` (see the module docstring)."""
    checked = _operations(ops, three_gpp)
    try:
        return jsonpatch.JsonPatch(checked).apply(copy.deepcopy(doc))
    except jsonpatch.JsonPatchTestFailed as exc:
        raise MnSError(409, f"JSON Patch test failed: {exc}", bad_attributes=_paths(checked)) from exc
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, TypeError, ValueError, KeyError,
            IndexError) as exc:
        raise MnSError(400, f"JSON Patch cannot be applied: {exc}", bad_attributes=_paths(checked)) from exc


def _paths(ops: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(op["path"] for op in ops)) or ["body"]
