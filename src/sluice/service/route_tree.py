"""The rest of the tree: ``POST`` on a container (a request under the ``MLTrainingFunction``, a subscription
under the ``SubNetwork``; on any other resource a 405 with ``Allow``), ``OPTIONS`` (what the served OpenAPI
document declares for the path), and what the resource routers do not take: a write to a class the producer
alone writes (405), to a class or path this producer does not manage (404), a malformed LDN (400), another
method (405)."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from sluice.service import route_processes, route_requests, route_subscriptions
from sluice.service.auth import Actor
from sluice.service.nrm import MnSError, ldn_to_dn, representation
from sluice.service.web import (
    ALLOWED,
    METHODS,
    Caller,
    RawBody,
    Site,
    SiteDep,
    allowed,
    documented_methods,
    json_response,
    object_body,
    patch_row,
    schema_check,
)

_WRITERS: dict[str, Any] = {"MLTrainingRequest": route_requests, "MLTrainingProcess": route_processes,
                            "NtfSubscriptionControl": route_subscriptions}


def post(site: Site, request: Request, ldn: str, raw: bytes, actor: Actor | None) -> Response:
    cls, _ = site.locate(ldn)
    if "POST" not in ALLOWED.get(cls, ""):  # a leaf (or the model repository) has no children to create
        site.service.get(ldn, actor)
        raise MnSError(405, f"POST creates a child resource; a {cls} takes none (Allow: {allowed(ldn)})",
                       bad_objects=[ldn_to_dn(ldn)])
    body = object_body(raw)
    cls = body.get("objectClass")
    if ldn == site.service.tf and cls == "MLTrainingRequest":
        rid = body.get("id") or site.service.requests.new_id()
    elif ldn == site.sn_ldn and cls == "NtfSubscriptionControl":
        rid = body.get("id") or f"S{uuid.uuid4().hex[:12]}"
    else:
        site.service.get(ldn, actor)
        raise MnSError(400, "POST creates an MLTrainingRequest under the MLTrainingFunction or an "
                       "NtfSubscriptionControl under the SubNetwork; objectClass names which",
                       bad_attributes=["objectClass"])
    child = f"{ldn}/{cls}={rid}"
    if site.service.store.get(child) is not None:
        raise MnSError(409, f"{ldn_to_dn(child)} exists", bad_objects=[ldn_to_dn(child)])
    body = {**body, "id": rid}
    schema_check(cls, body, partial=False)
    if cls == "MLTrainingRequest":
        row = site.service.requests.create(child, body, actor)
    else:
        row, _ = site.service.subscriptions.put(child, body, actor)
    location = str(request.url.replace(query="")).rstrip("/") + f"/{cls}={rid}"
    return json_response(representation(row), 201, {"Location": location})


def put(site: Site, request: Request, ldn: str, raw: bytes, actor: Actor | None) -> Response:
    cls, _ = site.locate(ldn)
    if cls in _WRITERS:
        return _WRITERS[cls].put(site, request, ldn, raw, actor)
    site.put_body(ldn, cls, raw, actor)  # 405 for a class the producer writes, 400 for a bad body
    raise MnSError(404, f"this producer manages no class {cls}", bad_objects=[ldn_to_dn(ldn)])


def patch(site: Site, request: Request, ldn: str, raw: bytes, actor: Actor | None) -> Response:
    cls, _ = patch_row(site, ldn, actor)  # 404 / 405 for what no resource router takes
    return _WRITERS[cls].patch(site, request, ldn, raw, actor)


def delete(site: Site, ldn: str, actor: Actor | None) -> Response:
    cls, _ = site.locate(ldn)
    if cls in ("MLTrainingRequest", "NtfSubscriptionControl"):
        return _WRITERS[cls].delete(site, ldn, actor)
    site.service.get(ldn, actor)
    raise MnSError(405, f"{cls} is deleted by the producer only", bad_objects=[ldn_to_dn(ldn)])


router = APIRouter()
"""``POST``, ``PUT``, ``PATCH``, ``DELETE``, ``OPTIONS`` and ``HEAD`` on every LDN; included under the base path."""
PATH = "/{ldn:path}"


@router.post(PATH, include_in_schema=False)
def post_route(request: Request, ldn: str, actor: Caller, raw: RawBody, site: SiteDep) -> Response:
    return post(site, request, ldn, raw, actor)


@router.put(PATH, include_in_schema=False)
def put_route(request: Request, ldn: str, actor: Caller, raw: RawBody, site: SiteDep) -> Response:
    return put(site, request, ldn, raw, actor)


@router.patch(PATH, include_in_schema=False)
def patch_route(request: Request, ldn: str, actor: Caller, raw: RawBody, site: SiteDep) -> Response:
    return patch(site, request, ldn, raw, actor)


@router.delete(PATH, include_in_schema=False)
def delete_route(ldn: str, actor: Caller, site: SiteDep) -> Response:
    return delete(site, ldn, actor)


@router.options(PATH, include_in_schema=False)
def options_route(ldn: str, actor: Caller, site: SiteDep) -> Response:
    site.locate(ldn)  # what the served OpenAPI document declares for this path, no more
    return Response(status_code=204, headers={"Allow": ", ".join(documented_methods(ldn))})


@router.api_route(PATH, methods=["HEAD"], include_in_schema=False)
def other_route(request: Request, ldn: str, actor: Caller) -> Response:
    raise MnSError(405, f"method {request.method} is not supported; use {', '.join(METHODS)}")
