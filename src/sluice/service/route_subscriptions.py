"""``NtfSubscriptionControl``: ``PUT`` creates (201) or replaces it, ``PATCH`` changes it, ``DELETE`` removes it;
``POST`` on the ``SubNetwork`` creates one with an id the producer chooses (:mod:`~sluice.service.route_tree`)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from sluice.config import merge_patch
from sluice.service.auth import Actor
from sluice.service.nrm import id_of, representation
from sluice.service.web import (
    Site,
    json_response,
    patch_input,
    patch_row,
    put_answer,
    schema_check,
)

CLS = "NtfSubscriptionControl"


def put(site: Site, request: Request, ldn: str, raw: bytes, actor: Actor | None) -> Response:
    cls, parent = site.locate(ldn)
    body = site.put_body(ldn, cls, raw, actor)
    site.parent_must_be(ldn, cls, parent)
    schema_check(cls, body, partial=False)
    row, created = site.service.subscriptions.put(ldn, body, actor)
    return put_answer(request, row, created)


def patch(site: Site, request: Request, ldn: str, raw: bytes, actor: Actor | None) -> Response:
    cls, row = patch_row(site, ldn, actor)
    p = patch_input(request, ldn, cls, row, raw)
    full = merge_patch(row.attributes, p.attrs) if p.merge else p.attrs
    out, _ = site.service.subscriptions.put(ldn, {"id": id_of(ldn), "attributes": full}, actor)
    return json_response(representation(out), 200)


def delete(site: Site, ldn: str, actor: Actor | None) -> Response:
    site.locate(ldn)
    site.service.get(ldn, actor)
    site.service.subscriptions.delete(ldn)
    return Response(status_code=204)

