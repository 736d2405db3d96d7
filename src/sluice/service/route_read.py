"""``GET`` of any managed object of this producer: one MOI, or a subtree (``scope``, ``filter``,
``dataNodeSelector``), with ``attributes`` / ``fields`` selection; an ``MLModel`` with ``Accept:
application/octet-stream`` downloads the trained model file."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sluice.service.auth import Actor
from sluice.service.filters import CLASSES, attributes_of, parse_filter
from sluice.service.nrm import MnSError, id_of, representation, select_fields
from sluice.service.store import _filter_matches
from sluice.service.web import GET_PARAMS, Caller, Site, SiteDep, json_response

SCOPE_TYPES = ("BASE_ONLY", "BASE_NTH_LEVEL", "BASE_SUBTREE", "BASE_ALL")


def _scope(q: Any) -> tuple[str, int | None]:
    """``(scopeType, scopeLevel)`` of the query: ``scope`` (JSON or a bare type) or the separate parameters.
    The level is None when none is given: ``BASE_SUBTREE`` then reaches every level (``BASE_NTH_LEVEL``: 0)."""
    scope_type, level = "BASE_ONLY", None
    if "scope" in q:
        raw = q["scope"]
        try:
            scope = json.loads(raw) if raw.strip().startswith("{") else {"scopeType": raw}
        except ValueError as exc:
            raise MnSError(400, f"scope is not JSON: {exc}", bad_query_params=["scope"]) from exc
        scope_type = scope.get("scopeType", "BASE_ONLY")
        level = scope.get("scopeLevel")
    if "scopeType" in q:
        scope_type = q["scopeType"]
    if "scopeLevel" in q:
        level = q["scopeLevel"]
    try:
        level = None if level is None else int(level)
    except (TypeError, ValueError) as exc:
        raise MnSError(400, "scopeLevel must be an integer", bad_query_params=["scopeLevel"]) from exc
    if scope_type not in SCOPE_TYPES or (level is not None and level < 0):
        raise MnSError(400, f"scopeType {scope_type!r} is not BASE_ONLY, BASE_NTH_LEVEL, BASE_SUBTREE or BASE_ALL",
                       bad_query_params=["scope"])
    return scope_type, level


MEMBERS = ("id", "objectClass", "objectInstance", "attributes", "VsDataContainer")
"""The members of a resource's representation a ``fields`` path may start with."""


def _unknown(param: str, name: str, known: frozenset[str]) -> bool:
    """Whether ``attributes`` name or ``fields`` path ``name`` names what the answer cannot hold."""
    if param == "attributes":
        return name != "VsDataContainer" and name not in known
    parts = [p for p in name.strip("/").split("/") if p]
    return not parts or parts[0] not in MEMBERS or (parts[0] == "attributes" and len(parts) > 1
                                                     and parts[1] not in known)


def _check_selection(param: str, names: list[str], classes: tuple[str, ...]) -> None:
    """400 for an ``attributes`` name or a ``fields`` path naming what no class of the answer defines."""
    known = frozenset().union(*(attributes_of(c) for c in classes))
    bad = [name for name in names if _unknown(param, name, known)]
    if not bad:
        return
    what = " or ".join(classes) if len(classes) < 3 else "any class of this service"
    hint = (f"a path starts with {', '.join(MEMBERS)}, and attributes/ is followed by an attribute name"
            if param == "fields" else f"the attributes are {', '.join(sorted(known))}")
    raise MnSError(400, f"{param}: {', '.join(map(repr, bad))} names no attribute of {what}; {hint}",
                   bad_query_params=[param])


def _download(site: Site, ldn: str, row: Any) -> Response:
    art = site.service.artifact(ldn)
    name = (row.vs_data.get("sluice-model") or {}).get("file", "model.pt")
    return Response(art.content, media_type="application/octet-stream", headers={
        "Content-Disposition": f'attachment; filename="{id_of(ldn)}-{name}"', "ETag": f'"{art.sha256}"'})


def _nest(top: dict[str, Any], row: Any, base_depth: int, rows: list[Any], chosen: set[str], render: Any) -> None:
    """Put the chosen MOIs under ``top`` by class name, with the MOIs on the way to them as bare ids."""
    needed = set(chosen)
    for dn in chosen:
        up = dn.rpartition("/")[0]
        while up.count("/") > base_depth:
            needed.add(up)
            up = up.rpartition("/")[0]
    nodes = {row.dn: top}
    for r in rows:
        parent = nodes.get(r.dn.rpartition("/")[0])
        if r.dn not in needed or parent is None:
            continue
        node = render(r) if r.dn in chosen else {"id": id_of(r.dn)}
        parent.setdefault(r.object_class, []).append(node)
        nodes[r.dn] = node


def _query(q: Any, cls: str) -> tuple[list[str] | None, list[str] | None, str, int | None, Any, Any]:
    """A GET's selection, checked: ``(attributes, fields, scopeType, scopeLevel, filter, dataNodeSelector)``."""
    attributes = [a for a in q.get("attributes", "").split(",") if a] if "attributes" in q else None
    fields = [f for f in q.get("fields", "").split(",") if f] if "fields" in q else None
    scope_type, level = _scope(q)
    flt = parse_filter(q.get("filter"))
    selector = parse_filter(q.get("dataNodeSelector"), "dataNodeSelector")
    if selector is not None and not {"scope", "scopeType", "scopeLevel"} & set(q):
        scope_type = "BASE_ALL"  # the selector chooses among every node below the base
    classes = (cls,) if scope_type == "BASE_ONLY" else CLASSES
    for param, names in (("attributes", attributes), ("fields", fields)):
        if names is not None:
            _check_selection(param, names, classes)
    return attributes, fields, scope_type, level, flt, selector


def read(site: Site, request: Request, ldn: str, actor: Actor | None) -> Response:
    q = request.query_params
    if bad := sorted(set(q) - GET_PARAMS):
        raise MnSError(400, f"unknown query parameters {bad}; allowed: {sorted(GET_PARAMS)}", bad_query_params=bad)
    cls, _ = site.locate(ldn)
    row = site.service.get(ldn, actor)
    if cls == "MLModel" and "application/octet-stream" in request.headers.get("accept", ""):
        return _download(site, ldn, row)
    attributes, fields, scope_type, level, flt, selector = _query(q, cls)

    def render(r: Any) -> dict[str, Any]:
        doc = representation(r, attributes=attributes)
        return select_fields(doc, fields) if fields is not None else doc

    top = render(row)
    if scope_type != "BASE_ONLY":
        # levels below the base: BASE_ALL every one, BASE_SUBTREE down to scopeLevel (every one without it)
        depth = None if scope_type == "BASE_ALL" else level if scope_type == "BASE_SUBTREE" else (level or 0)
        base_depth = ldn.count("/")
        rows = sorted(site.service.subtree(ldn, depth, actor), key=lambda r: (r.dn.count("/"), r.seq))
        chosen = {r.dn for r in rows if all(f is None or f.matches(r, _filter_matches) for f in (flt, selector))
                  and (scope_type != "BASE_NTH_LEVEL" or r.dn.count("/") - base_depth == (level or 0))}
        _nest(top, row, base_depth, rows, chosen, render)
    return json_response(top)

router = APIRouter()
"""``GET`` on every LDN; included under the base path."""


@router.get("/{ldn:path}", include_in_schema=False)
def get(request: Request, ldn: str, actor: Caller, site: SiteDep) -> Response:
    return read(site, request, ldn, actor)
