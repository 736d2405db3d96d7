"""What the REST layer's routers share: strict JSON bodies, the 3GPP error bodies of every error (the
framework's own included), the caller as a dependency, and the LDN checks of this producer's tree."""

from __future__ import annotations

import copy
import json
import math
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.service.auth import CHALLENGE, Actor, TokenRegistry
from sluice.service.core import TrainingService
from sluice.service.nrm import (
    PRODUCER_ONLY,
    MnSError,
    error_body,
    id_of,
    ldn_to_dn,
    parse_ldn,
    representation,
)

GET_PARAMS = {"scope", "scopeType", "scopeLevel", "filter", "attributes", "fields", "dataNodeSelector"}
METHODS = ["GET", "PUT", "PATCH", "POST", "DELETE"]
MAX_JSON_DEPTH = 32
ALLOWED = {"MLTrainingRequest": "GET, PUT, PATCH, DELETE", "NtfSubscriptionControl": "GET, PUT, PATCH, DELETE",
           "MLTrainingProcess": "GET, PUT, PATCH", "MLTrainingFunction": "GET, POST", "SubNetwork": "GET, POST"}
"""Methods per class for the ``Allow`` header of a 405; any other class (report, model) is read only."""


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
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


def parse_body(raw: bytes) -> Any:
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


def object_body(raw: bytes) -> dict[str, Any]:
    body = parse_body(raw)
    if not isinstance(body, dict):
        raise MnSError(400, "the body must be a JSON object")
    return body


def documented_methods(ldn: str) -> list[str]:
    """The methods the served OpenAPI document declares for the path of ``ldn`` (none for a path it lacks)."""
    import re

    from sluice.service.schema import load_bundle

    for template, item in load_bundle()["paths"].items():
        if re.fullmatch(re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template)), "/" + ldn):
            return [m for m in METHODS if m.lower() in item]
    return []


def allowed(path: str) -> str:
    """The ``Allow`` header of a 405 (RFC 9110 §15.5.6) for the MOI at URI ``path``: the methods its class takes."""
    cls = path.rstrip("/").rpartition("/")[2].partition("=")[0]
    return ALLOWED.get(cls, "GET")


def schema_check(cls: str, body: Any, partial: bool, label: str | None = None) -> None:
    from sluice.service.schema import SchemaViolation, check_write

    try:
        check_write(cls, body, partial=partial, label=label)
    except SchemaViolation as exc:
        raise MnSError(400, exc.message, bad_attributes=exc.bad_attributes or ["attributes"]) from exc


# ------------------------------------------------------------------------------------------- dependencies
def caller(request: Request) -> Actor | None:
    """The authenticated caller (None: authentication is off); 401 with a ``WWW-Authenticate`` challenge."""
    tokens: TokenRegistry = request.app.state.tokens
    request.state.actor = tokens.authenticate(request.headers.get("authorization"))
    return request.state.actor


async def raw_body(request: Request) -> bytes:
    return await request.body()


Caller = Annotated[Actor | None, Depends(caller)]
"""A route's caller: authenticated before anything else of the request is looked at."""
RawBody = Annotated[bytes, Depends(raw_body)]


class Site:
    """This producer's tree as the routers see it: the service and the LDN checks."""

    def __init__(self, service: TrainingService) -> None:
        self.service = service
        self.sn_ldn = service.sn

    def locate(self, ldn: str) -> tuple[str, str]:
        """``(class, parent LDN)`` of a well-formed LDN inside this producer's SubNetwork."""
        rdns = parse_ldn(ldn)
        if f"{rdns[0].cls}={rdns[0].id}" != self.sn_ldn:
            raise MnSError(404, f"no managed object {ldn_to_dn(ldn)}: this producer holds {ldn_to_dn(self.sn_ldn)}",
                           bad_objects=[ldn_to_dn(ldn)])
        return rdns[-1].cls, ldn.rpartition("/")[0]

    def parent_must_be(self, ldn: str, cls: str, parent: str) -> None:
        want = {"MLTrainingRequest": self.service.tf, "MLTrainingProcess": self.service.tf,
                "MLTrainingReport": self.service.tf, "MLModel": self.service.repo,
                "NtfSubscriptionControl": self.sn_ldn}.get(cls)
        if want is None or parent != want:
            raise MnSError(404, f"no managed object {ldn_to_dn(ldn)}", bad_objects=[ldn_to_dn(ldn)])

    def put_body(self, ldn: str, cls: str, raw: bytes, actor: Actor | None) -> dict[str, Any]:
        """The body of a PUT of ``ldn``: an object whose id and class, when given, are those of the URI."""
        if cls in PRODUCER_ONLY:  # before the body: whatever it holds, the method is not allowed here
            self.service.get(ldn, actor)
            raise MnSError(405, f"{cls} is created and changed by the producer only", bad_objects=[ldn_to_dn(ldn)])
        body = object_body(raw)
        rid = id_of(ldn)
        if "id" in body and body["id"] != rid:
            raise MnSError(400, f"the body's id {body['id']!r} differs from the id in the URI {rid!r}",
                           bad_attributes=["id"])
        if "objectClass" in body and body["objectClass"] != cls:
            raise MnSError(400, f"objectClass {body['objectClass']!r} differs from the URI's class {cls!r}",
                           bad_attributes=["objectClass"])
        return {**body, "id": rid}


def site(request: Request) -> Site:
    return request.app.state.site


SiteDep = Annotated[Site, Depends(site)]
"""A route's view of the producer's tree (``app.state.site``)."""


def put_answer(request: Request, row: Any, created: bool) -> Response:
    doc = representation(row)
    if created:
        return json_response(doc, 201, {"Location": str(request.url.replace(query=""))})
    return json_response(doc, 200)


# ------------------------------------------------------------------------------------------- errors
def install_error_handlers(app: FastAPI, base: str) -> None:
    """Every error answers with the 3GPP error body of its method: ours, the framework's, the unexpected."""

    @app.exception_handler(MnSError)
    async def _mns(request: Request, exc: MnSError) -> JSONResponse:
        headers = ({"Allow": allowed(request.url.path)} if exc.status == 405 else
                   CHALLENGE if exc.status == 401 else None)
        return json_response(error_body(exc, request.method), exc.status, headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        path = request.scope.get("path", request.url.path)
        if exc.status_code == 404 and path.startswith(base + "/"):
            try:  # the router matches no LDN with a control character: say what is malformed
                parse_ldn(path[len(base) + 1:])
            except MnSError as bad:
                return json_response(error_body(bad, request.method), bad.status)
        err = MnSError(exc.status_code, str(exc.detail), bad_objects=[path])
        headers = {"Allow": ", ".join(METHODS)} if exc.status_code == 405 else None
        return json_response(error_body(err, request.method), exc.status_code, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = MnSError(400, "invalid request", bad_query_params=["request"])
        return json_response(error_body(err, request.method), 400)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        err = MnSError(500, f"{type(exc).__name__}: {exc}")
        return json_response(error_body(err, request.method), 500)


# ------------------------------------------------------------------------------------------- PATCH
WRITABLE_VS = {"MLTrainingRequest": ("sluice-job", "sluice-requirements", "sluice-termination", "sluice-negotiation"),
               "MLTrainingProcess": ("sluice-termination", "sluice-requirements"), "NtfSubscriptionControl": ()}


class PatchInput:
    """What a PATCH of ``row`` asks for: ``attrs`` and ``vs`` (changed), ``merge`` (a merge patch, else a JSON
    Patch whose whole result is ``new``)."""

    def __init__(self, attrs: dict[str, Any], vs: dict[str, Any], merge: bool, new: dict[str, Any] | None) -> None:
        self.attrs, self.vs, self.merge, self.new = attrs, vs, merge, new


def patch_input(request: Request, ldn: str, cls: str, row: Any, raw: bytes) -> PatchInput:
    """A merge patch (RFC 7396) or JSON Patch (RFC 6902, 3GPP's variant) of ``row``, checked; 415 for
    another media type."""
    from sluice.service.nrm import READ_ONLY, read_vs
    from sluice.service.patching import MEDIA_TYPES, MERGE, THREE_GPP, apply_json_patch, check_merge_children

    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in MEDIA_TYPES:
        raise MnSError(415, f"PATCH takes {', '.join(MEDIA_TYPES)}, not {ctype or 'no media type'}",
                       bad_attributes=["Content-Type"])
    body = parse_body(raw)
    if ctype in MERGE:
        if not isinstance(body, dict):
            raise MnSError(400, "a merge patch is a JSON object {attributes: {...}, VsDataContainer: [...]}")
        check_merge_children(body, ctype)
        if "id" in body and body["id"] != id_of(ldn):
            raise MnSError(400, "the body's id differs from the id in the URI", bad_attributes=["id"])
        schema_check(cls, body, partial=True)
        return PatchInput(body.get("attributes") or {}, read_vs(body, cls), True, None)
    writable_vs = WRITABLE_VS[cls]
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
    schema_check(cls, {"attributes": changed}, partial=True, label="JSON Patch result")
    new_vs = read_vs(new, cls)
    old_vs = {k: v for k, v in row.vs_data.items() if k in writable_vs}
    vs = {k: v for k, v in new_vs.items() if old_vs.get(k) != v}
    attrs = {k: v for k, v in new["attributes"].items() if k not in READ_ONLY.get(cls, ())}
    return PatchInput(attrs, vs, False, new)


def patch_row(site: Site, ldn: str, actor: Actor | None) -> tuple[str, Any]:
    """``(class, row)`` of a PATCH target the caller may change; 405 for a class the producer alone changes."""
    cls, _ = site.locate(ldn)
    row = site.service.get(ldn, actor)
    if cls in PRODUCER_ONLY:  # whatever the body and its media type: the method is not allowed here
        raise MnSError(405, f"{cls} is changed by the producer only", bad_objects=[ldn_to_dn(ldn)])
    if cls not in WRITABLE_VS:
        raise MnSError(404, f"this producer manages no class {cls}", bad_objects=[ldn_to_dn(ldn)])
    return cls, row
