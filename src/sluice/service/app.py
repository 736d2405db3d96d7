"""The REST interface: TS 28.532 ProvMnS operations on the TS 28.105 classes, as a FastAPI app.

Every path under ``{MnSRoot}/ProvMnS/{MnSVersion}/`` is one LDN and goes through one handler per method
(:func:`create_app`); the LDN is parsed here, so a malformed one is a 400 and an unknown one a 404, both with
the 3GPP error body of the method — as is every other error, the framework's own included (unknown paths,
methods, bodies that are not JSON). The OpenAPI document served (``openapi.json`` under the base path and at
the root) is the pruned 3GPP bundle, not a generated one.

Methods and media types:

* ``GET`` — query ``attributes`` (comma list), ``fields`` (comma list of paths such as
  ``attributes/progressStatus``), ``scope`` (JSON ``{"scopeType", "scopeLevel"}``, or ``scopeType`` and
  ``scopeLevel`` as separate parameters) and ``filter`` (node paths, see :mod:`sluice.service.store`);
  children within the scope are nested under their class name. ``Accept: application/octet-stream`` on an
  ``MLModel`` downloads the trained model;
* ``PUT`` — create (201, ``Location``) or replace (200); ``POST`` on the parent — create with an id the
  producer chooses (201, ``Location``);
* ``PATCH`` — ``application/merge-patch+json`` (RFC 7396; ``VsDataContainer`` entries merge by id) or
  ``application/json-patch+json`` (RFC 6902, on ``{"attributes", "VsDataContainer"}``); other media types
  are 415; answers 200 with the new representation;
* ``DELETE`` — 204.

Bodies are held to ``max_body_bytes`` (``max_upload_bytes`` for a PUT or PATCH of an ``MLTrainingProcess``,
which carries training data) by :class:`sluice.service.limits.BodyLimit`: 413 before a larger body is read;
``gzip``/``deflate`` bodies are decoded there under the same limit. A body is strict RFC 8259 JSON (no
``NaN``/``Infinity``, no number that overflows a float) nested at most :data:`MAX_JSON_DEPTH` deep (400).

Callers: with tokens configured every ProvMnS request needs ``Authorization: Bearer <token>`` (401 with
``WWW-Authenticate: Bearer`` otherwise) and sees only its consumer's MOIs, another consumer's answering 404
(:mod:`sluice.service.auth`); the OpenAPI document is served to anyone.
"""

from __future__ import annotations

import copy
import json
import math
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.service.auth import CHALLENGE, TokenRegistry
from sluice.service.config import ServiceConfig
from sluice.service.core import TrainingService
from sluice.service.filters import parse_filter
from sluice.service.limits import BodyLimit
from sluice.service.metrics import add_operations
from sluice.service.nrm import (
    PRODUCER_ONLY,
    READ_ONLY,
    MnSError,
    error_body,
    id_of,
    ldn_to_dn,
    parse_ldn,
    read_vs,
    representation,
    select_fields,
)
from sluice.service.patching import MEDIA_TYPES, MERGE, THREE_GPP, apply_json_patch, check_merge_children
from sluice.service.store import _filter_matches

GET_PARAMS = {"scope", "scopeType", "scopeLevel", "filter", "attributes", "fields", "dataNodeSelector"}
METHODS = ["GET", "PUT", "PATCH", "POST", "DELETE"]
MAX_JSON_DEPTH = 32
ALLOWED = {"MLTrainingRequest": "GET, PUT, PATCH, DELETE", "NtfSubscriptionControl": "GET, PUT, PATCH, DELETE",
           "MLTrainingProcess": "GET, PUT, PATCH", "MLTrainingFunction": "GET, POST", "SubNetwork": "GET, POST"}
"""Methods per class for the ``Allow`` header of a 405; any other class (report, model) is read only."""


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers, media_type="application/json")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value (RFC 8259)")


def _depth(doc: Any) -> int:
    """Nesting depth of a parsed JSON document (a scalar is 0), counted without recursion."""
    deepest, stack = 0, [(doc, 0)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, d + 1)
            stack.extend((v, d + 1) for v in (node.values() if isinstance(node, dict) else node)
                         if isinstance(v, dict | list))
    return deepest


def _body(raw: bytes) -> Any:
    """The JSON document of a request body. Refused (400): no body, not UTF-8 JSON (RFC 8259: no NaN or
    Infinity, no number that overflows a float), nesting deeper than :data:`MAX_JSON_DEPTH`."""
    if not raw:
        raise MnSError(400, "the request needs a JSON body")
    try:
        doc = json.loads(raw, parse_float=_finite_float, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise MnSError(400, f"the body is not valid JSON: {str(exc)[:200]}") from exc
    if _depth(doc) > MAX_JSON_DEPTH:
        raise MnSError(400, f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    return doc


def documented_methods(ldn: str) -> list[str]:
    """The methods the served OpenAPI document declares for the path of ``ldn`` (none for a path it lacks)."""
    import re

    from sluice.service.schema import load_bundle

    for template, item in load_bundle()["paths"].items():
        if re.fullmatch(re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template)), "/" + ldn):
            return [m for m in METHODS if m.lower() in item]
    return []


def _allowed(path: str) -> str:
    """The ``Allow`` header of a 405 (RFC 9110 §15.5.6) for the MOI at URI ``path``: the methods its class takes."""
    cls = path.rstrip("/").rpartition("/")[2].partition("=")[0]
    return ALLOWED.get(cls, "GET")


def _schema_check(cls: str, body: Any, partial: bool, label: str | None = None) -> None:
    from sluice.service.schema import SchemaViolation, check_write

    try:
        check_write(cls, body, partial=partial, label=label)
    except SchemaViolation as exc:
        raise MnSError(400, exc.message, bad_attributes=exc.bad_attributes or ["attributes"]) from exc


# ------------------------------------------------------------------------------------------- the app


def create_app(cfg: ServiceConfig, public_url: str | None = None) -> FastAPI:
    """The ProvMnS app of one producer; the service starts and stops with the app's lifespan."""
    url = public_url or f"{'https' if cfg.tls.cert else 'http'}://{cfg.host}:{cfg.port}"
    tokens = TokenRegistry(cfg.auth)
    service = TrainingService(cfg, url)
    base = cfg.base_path
    sn_ldn = service.sn

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        service.start()
        try:
            yield
        finally:
            service.stop()

    app = FastAPI(title="Sluice ProvMnS", openapi_url=None, docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.service = service
    app.add_middleware(BodyLimit, max_body_bytes=cfg.max_body_bytes, max_upload_bytes=cfg.max_upload_bytes,
                       base_path=base)

    @app.exception_handler(MnSError)
    async def _mns(request: Request, exc: MnSError) -> JSONResponse:
        headers = {"Allow": _allowed(request.url.path)} if exc.status == 405 else None
        return _json(error_body(exc, request.method), exc.status, headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        path = request.scope.get("path", request.url.path)
        if exc.status_code == 404 and path.startswith(base + "/"):
            try:  # the router matches no LDN with a control character: say what is malformed
                parse_ldn(path[len(base) + 1:])
            except MnSError as bad:
                return _json(error_body(bad, request.method), bad.status)
        err = MnSError(exc.status_code, str(exc.detail), bad_objects=[path])
        headers = {"Allow": ", ".join(METHODS)} if exc.status_code == 405 else None
        return _json(error_body(err, request.method), exc.status_code, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = MnSError(400, "invalid request", bad_query_params=["request"])
        return _json(error_body(err, request.method), 400)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        err = MnSError(500, f"{type(exc).__name__}: {exc}")
        return _json(error_body(err, request.method), 500)

    def bundle() -> dict[str, Any]:
        from sluice.service.schema import load_bundle

        doc = copy.deepcopy(load_bundle())
        doc["servers"] = [{"url": f"{url}{base}"}]
        return doc

    @app.get("/openapi.json", include_in_schema=False)
    def openapi_root() -> JSONResponse:
        return _json(bundle())

    @app.get(f"{base}/openapi.json", include_in_schema=False)
    def openapi_base() -> JSONResponse:
        return _json(bundle())

    add_operations(app, service, base, bundle)  # /health, /ready, /metrics, openapi.yaml: no token

    def locate(ldn: str) -> tuple[str, str]:
        """``(class, parent LDN)`` of a well-formed LDN inside this producer's SubNetwork."""
        rdns = parse_ldn(ldn)
        if f"{rdns[0].cls}={rdns[0].id}" != sn_ldn:
            raise MnSError(404, f"no managed object {ldn_to_dn(ldn)}: this producer holds {ldn_to_dn(sn_ldn)}",
                           bad_objects=[ldn_to_dn(ldn)])
        return rdns[-1].cls, ldn.rpartition("/")[0]

    def parent_must_be(ldn: str, cls: str, parent: str) -> None:
        want = {"MLTrainingRequest": service.tf, "MLTrainingProcess": service.tf, "MLTrainingReport": service.tf,
                "MLModel": service.repo, "NtfSubscriptionControl": sn_ldn}.get(cls)
        if want is None or parent != want:
            raise MnSError(404, f"no managed object {ldn_to_dn(ldn)}", bad_objects=[ldn_to_dn(ldn)])

    # ------------------------------------------------------------------ GET
    def get(request: Request, ldn: str) -> Response:
        q = request.query_params
        bad = sorted(set(q) - GET_PARAMS)
        if bad:
            raise MnSError(400, f"unknown query parameters {bad}; allowed: {sorted(GET_PARAMS)}", bad_query_params=bad)
        cls, _ = locate(ldn)
        row = service.get(ldn, request.state.actor)
        if cls == "MLModel" and "application/octet-stream" in request.headers.get("accept", ""):
            art = service.artifact(ldn)
            name = (row.vs_data.get("sluice-model") or {}).get("file", "model.pt")
            return Response(art.content, media_type="application/octet-stream", headers={
                "Content-Disposition": f'attachment; filename="{id_of(ldn)}-{name}"', "ETag": f'"{art.sha256}"'})
        attributes = [a for a in q.get("attributes", "").split(",") if a] if "attributes" in q else None
        fields = [f for f in q.get("fields", "").split(",") if f] if "fields" in q else None
        scope_type, level = "BASE_ONLY", 0
        if "scope" in q:
            raw = q["scope"]
            try:
                scope = json.loads(raw) if raw.strip().startswith("{") else {"scopeType": raw}
            except ValueError as exc:
                raise MnSError(400, f"scope is not JSON: {exc}", bad_query_params=["scope"]) from exc
            scope_type = scope.get("scopeType", "BASE_ONLY")
            level = scope.get("scopeLevel", 0)
        if "scopeType" in q:
            scope_type = q["scopeType"]
        if "scopeLevel" in q:
            level = q["scopeLevel"]
        try:
            level = int(level)
        except (TypeError, ValueError) as exc:
            raise MnSError(400, "scopeLevel must be an integer", bad_query_params=["scopeLevel"]) from exc
        if scope_type not in ("BASE_ONLY", "BASE_NTH_LEVEL", "BASE_SUBTREE", "BASE_ALL") or level < 0:
            raise MnSError(400, f"scopeType {scope_type!r} is not BASE_ONLY, BASE_NTH_LEVEL, BASE_SUBTREE or BASE_ALL",
                           bad_query_params=["scope"])
        flt = parse_filter(q.get("filter"))
        selector = parse_filter(q.get("dataNodeSelector"), "dataNodeSelector")
        if selector is not None and not {"scope", "scopeType", "scopeLevel"} & set(q):
            scope_type = "BASE_ALL"  # the selector chooses among every node below the base

        def render(r: Any) -> dict[str, Any]:
            doc = representation(r, attributes=attributes)
            return select_fields(doc, fields) if fields is not None else doc

        top = render(row)
        if scope_type != "BASE_ONLY":
            depth = None if scope_type == "BASE_ALL" else level
            base_depth = ldn.count("/")
            rows = sorted(service.subtree(ldn, depth, request.state.actor), key=lambda r: (r.dn.count("/"), r.seq))
            chosen = {r.dn for r in rows if all(f is None or f.matches(r, _filter_matches) for f in (flt, selector))
                      and (scope_type != "BASE_NTH_LEVEL" or r.dn.count("/") - base_depth == level)}
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
        return _json(top)

    # ------------------------------------------------------------------ PUT / POST
    def put(request: Request, ldn: str, raw: bytes) -> Response:
        cls, parent = locate(ldn)
        if cls in PRODUCER_ONLY:  # before the body: whatever it holds, the method is not allowed here
            service.get(ldn, request.state.actor)
            raise MnSError(405, f"{cls} is created and changed by the producer only", bad_objects=[ldn_to_dn(ldn)])
        body = _body(raw)
        if not isinstance(body, dict):
            raise MnSError(400, "the body must be a JSON object")
        rid = id_of(ldn)
        if "id" in body and body["id"] != rid:
            raise MnSError(400, f"the body's id {body['id']!r} differs from the id in the URI {rid!r}",
                           bad_attributes=["id"])
        if "objectClass" in body and body["objectClass"] != cls:
            raise MnSError(400, f"objectClass {body['objectClass']!r} differs from the URI's class {cls!r}",
                           bad_attributes=["objectClass"])
        body = {**body, "id": rid}
        if cls == "MLTrainingRequest":
            parent_must_be(ldn, cls, parent)
            _schema_check(cls, body, partial=False)
            row, created = service.put_request(ldn, body, request.state.actor)
        elif cls == "NtfSubscriptionControl":
            parent_must_be(ldn, cls, parent)
            _schema_check(cls, body, partial=False)
            row, created = service.put_subscription(ldn, body, request.state.actor)
        elif cls == "MLTrainingProcess":
            parent_must_be(ldn, cls, parent)
            if service.store.get(ldn) is None:
                raise MnSError(405, "training processes are created by the producer (one per request)",
                               bad_objects=[ldn_to_dn(ldn)])
            attrs = body.get("attributes") or {}
            shown = service.get(ldn, request.state.actor).attributes
            _schema_check(cls, {"attributes": {k: v for k, v in attrs.items() if not (
                k in READ_ONLY[cls] and shown.get(k) == v)}}, partial=True)
            row = service.modify_process(ldn, {k: v for k, v in attrs.items() if not (
                k in READ_ONLY[cls] and shown.get(k) == v)}, read_vs(body, cls), merge=False)
            created = False
        else:
            raise MnSError(404, f"this producer manages no class {cls}", bad_objects=[ldn_to_dn(ldn)])
        doc = representation(row)
        if created:
            return _json(doc, 201, {"Location": str(request.url.replace(query=""))})
        return _json(doc, 200)

    def post(request: Request, ldn: str, raw: bytes) -> Response:
        _, _parent = locate(ldn)
        body = _body(raw)
        if not isinstance(body, dict):
            raise MnSError(400, "the body must be a JSON object")
        cls = body.get("objectClass")
        if ldn == service.tf and cls == "MLTrainingRequest":
            rid = body.get("id") or service.new_request_id()
        elif ldn == sn_ldn and cls == "NtfSubscriptionControl":
            rid = body.get("id") or f"S{__import__('uuid').uuid4().hex[:12]}"
        else:
            service.get(ldn, request.state.actor)
            raise MnSError(400, "POST creates an MLTrainingRequest under the MLTrainingFunction or an "
                           "NtfSubscriptionControl under the SubNetwork; objectClass names which",
                           bad_attributes=["objectClass"])
        child = f"{ldn}/{cls}={rid}"
        if service.store.get(child) is not None:
            raise MnSError(409, f"{ldn_to_dn(child)} exists", bad_objects=[ldn_to_dn(child)])
        body = {**body, "id": rid}
        _schema_check(cls, body, partial=False)
        if cls == "MLTrainingRequest":
            row = service.create_request(child, body, request.state.actor)
        else:
            row, _ = service.put_subscription(child, body, request.state.actor)
        location = str(request.url.replace(query="")).rstrip("/") + f"/{cls}={rid}"
        return _json(representation(row), 201, {"Location": location})

    # ------------------------------------------------------------------ PATCH
    def patch(request: Request, ldn: str, raw: bytes) -> Response:
        cls, parent = locate(ldn)
        row = service.get(ldn, request.state.actor)
        if cls in PRODUCER_ONLY:  # whatever the body and its media type: the method is not allowed here
            raise MnSError(405, f"{cls} is changed by the producer only", bad_objects=[ldn_to_dn(ldn)])
        if cls not in ("MLTrainingRequest", "MLTrainingProcess", "NtfSubscriptionControl"):
            raise MnSError(404, f"this producer manages no class {cls}", bad_objects=[ldn_to_dn(ldn)])
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in MEDIA_TYPES:
            raise MnSError(415, f"PATCH takes {', '.join(MEDIA_TYPES)}, not {ctype or 'no media type'}",
                           bad_attributes=["Content-Type"])
        body = _body(raw)
        writable_vs = {"MLTrainingRequest": ("sluice-job", "sluice-requirements", "sluice-termination",
                                             "sluice-negotiation"),
                       "MLTrainingProcess": ("sluice-termination", "sluice-requirements"),
                       "NtfSubscriptionControl": ()}[cls]
        if ctype in MERGE:
            if not isinstance(body, dict):
                raise MnSError(400, "a merge patch is a JSON object {attributes: {...}, VsDataContainer: [...]}")
            check_merge_children(body, ctype)
            if "id" in body and body["id"] != id_of(ldn):
                raise MnSError(400, "the body's id differs from the id in the URI", bad_attributes=["id"])
            _schema_check(cls, body, partial=True)
            attrs = body.get("attributes") or {}
            vs = read_vs(body, cls)
            merge = True
        else:
            view = {"attributes": copy.deepcopy(row.attributes),
                    "VsDataContainer": [{"id": k, "attributes": {"vsData": copy.deepcopy(v)}}
                                        for k, v in row.vs_data.items() if k in writable_vs]}
            new = apply_json_patch(view, body, three_gpp=ctype in THREE_GPP)
            if not isinstance(new.get("attributes"), dict):
                raise MnSError(400, "the patched resource has no attributes object", bad_attributes=["attributes"])
            old_attrs = row.attributes
            changed = {k: v for k, v in new["attributes"].items() if old_attrs.get(k) != v}
            removed = [k for k in old_attrs if k not in new["attributes"]]
            ro = sorted(k for k in [*changed, *removed] if k in READ_ONLY.get(cls, ()))
            if ro:
                raise MnSError(400, f"read-only attributes of {cls}: {', '.join(ro)}", bad_attributes=ro)
            _schema_check(cls, {"attributes": changed}, partial=True, label="JSON Patch result")
            new_vs = read_vs(new, cls)
            old_vs = {k: v for k, v in row.vs_data.items() if k in writable_vs}
            vs = {k: v for k, v in new_vs.items() if old_vs.get(k) != v}
            attrs = {k: v for k, v in new["attributes"].items() if k not in READ_ONLY.get(cls, ())}
            merge = False
        if cls == "MLTrainingRequest":
            if merge:
                out = service.modify_request(ldn, attrs, vs, replace=False, merge=True)
            else:
                full_vs = {k: v for k, v in read_vs(new, cls).items()}
                out = service.modify_request(ldn, attrs, full_vs, replace=True)
        elif cls == "MLTrainingProcess":
            out = service.modify_process(ldn, attrs, vs, merge=merge)
        else:
            from sluice.config import merge_patch

            full = merge_patch(row.attributes, attrs) if merge else attrs
            out, _ = service.put_subscription(ldn, {"id": id_of(ldn), "attributes": full}, request.state.actor)
        return _json(representation(out), 200)

    # ------------------------------------------------------------------ DELETE
    def delete(request: Request, ldn: str) -> Response:
        cls, _ = locate(ldn)
        service.get(ldn, request.state.actor)
        if cls == "MLTrainingRequest":
            service.delete_request(ldn)
        elif cls == "NtfSubscriptionControl":
            service.delete_subscription(ldn)
        else:
            raise MnSError(405, f"{cls} is deleted by the producer only", bad_objects=[ldn_to_dn(ldn)])
        return Response(status_code=204)

    from starlette.concurrency import run_in_threadpool

    @app.api_route(base + "/{ldn:path}", methods=[*METHODS, "HEAD", "OPTIONS"], include_in_schema=False)
    async def dispatch(request: Request, ldn: str) -> Response:
        m = request.method
        try:
            request.state.actor = tokens.authenticate(request.headers.get("authorization"))
        except MnSError as exc:
            return _json(error_body(exc, m), exc.status, CHALLENGE)
        if m == "GET":
            return await run_in_threadpool(get, request, ldn)
        if m == "DELETE":
            return await run_in_threadpool(delete, request, ldn)
        if m in ("PUT", "POST", "PATCH"):
            raw = await request.body()
            handler = {"PUT": put, "POST": post, "PATCH": patch}[m]
            return await run_in_threadpool(handler, request, ldn, raw)
        if m == "OPTIONS":  # what the served OpenAPI document declares for this path, no more
            locate(ldn)
            return Response(status_code=204, headers={"Allow": ", ".join(documented_methods(ldn))})
        raise MnSError(405, f"method {m} is not supported; use {', '.join(METHODS)}")

    return app
