"""``MLTrainingProcess``: created by the producer; ``PUT`` (of the whole representation) and ``PATCH`` set its
controls (cancel, suspend/resume, priority, termination conditions), answer a proposal and carry training data."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import Response

from sluice.service.auth import Actor
from sluice.service.nrm import READ_ONLY, MnSError, ldn_to_dn, read_vs, representation
from sluice.service.web import (
    Site,
    json_response,
    patch_input,
    patch_row,
    put_answer,
    schema_check,
)

CLS = "MLTrainingProcess"


def put(site: Site, request: Request, ldn: str, raw: bytes, actor: Actor | None) -> Response:
    cls, parent = site.locate(ldn)
    body = site.put_body(ldn, cls, raw, actor)
    site.parent_must_be(ldn, cls, parent)
    if site.service.store.get(ldn) is None:
        raise MnSError(405, "training processes are created by the producer (one per request)",
                       bad_objects=[ldn_to_dn(ldn)])
    attrs = body.get("attributes") or {}
    shown = site.service.get(ldn, actor).attributes
    changed = {k: v for k, v in attrs.items() if not (k in READ_ONLY[cls] and shown.get(k) == v)}
    schema_check(cls, {"attributes": changed}, partial=True)
    row = site.service.processes.modify(ldn, changed, read_vs(body, cls), merge=False)
    return put_answer(request, row, False)


def patch(site: Site, request: Request, ldn: str, raw: bytes, actor: Actor | None) -> Response:
    cls, row = patch_row(site, ldn, actor)
    p = patch_input(request, ldn, cls, row, raw)
    return json_response(representation(site.service.processes.modify(ldn, p.attrs, p.vs, merge=p.merge)), 200)

