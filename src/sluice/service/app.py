"""The REST interface: TS 28.532 ProvMnS operations on the TS 28.105 classes, as a FastAPI app.

Every path under ``{MnSRoot}/ProvMnS/{MnSVersion}/`` is one LDN. Two module-level routers take every LDN:
:mod:`~sluice.service.route_read` its ``GET`` and :mod:`~sluice.service.route_tree` the other methods, which hands a
write to the module of the resource's class (:mod:`~sluice.service.route_requests`,
:mod:`~sluice.service.route_processes`, :mod:`~sluice.service.route_subscriptions`); the caller and the producer's
tree are dependencies (:func:`sluice.service.web.caller`, :func:`sluice.service.web.site`).
The LDN is parsed, so a malformed one is a 400 and an unknown one a 404, both with the 3GPP error body of the
method — as is every other error, the framework's own included (unknown paths, methods, bodies that are not JSON:
:func:`sluice.service.web.install_error_handlers`). The OpenAPI document served (``openapi.json`` under the base
path and at the root) is the pruned 3GPP bundle, not a generated one.

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

The dashboard (:mod:`sluice.dashboard`) is served at ``/``; its API takes the same tokens.

Callers: with tokens configured every ProvMnS request needs ``Authorization: Bearer <token>`` (401 with
``WWW-Authenticate: Bearer`` otherwise) and sees only its consumer's MOIs, another consumer's answering 404
(:mod:`sluice.service.auth`); the OpenAPI document is served to anyone.
"""
from __future__ import annotations

import copy
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from sluice.service import route_read, route_tree
from sluice.service.auth import TokenRegistry
from sluice.service.config import ServiceConfig
from sluice.service.core import TrainingService
from sluice.service.dashboard import mount_service_dashboard
from sluice.service.limits import BodyLimit
from sluice.service.metrics import add_operations
from sluice.service.web import MAX_JSON_DEPTH, Site, install_error_handlers, json_response

__all__ = ["MAX_JSON_DEPTH", "create_app"]


def create_app(cfg: ServiceConfig, public_url: str | None = None) -> FastAPI:
    """The ProvMnS app of one producer; the service starts and stops with the app's lifespan."""
    url = public_url or f"{'https' if cfg.tls.cert else 'http'}://{cfg.host}:{cfg.port}"
    tokens = TokenRegistry(cfg.auth)  # a tokens file that is not there stops it before the database is made
    service = TrainingService(cfg, url)
    base = cfg.base_path

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        service.start()
        try:
            async with dashboard():
                yield
        finally:
            service.stop()

    app = FastAPI(title="Sluice ProvMnS", openapi_url=None, docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.service = service
    app.state.tokens = tokens
    app.add_middleware(BodyLimit, max_body_bytes=cfg.max_body_bytes, max_upload_bytes=cfg.max_upload_bytes,
                       base_path=base)
    install_error_handlers(app, base)

    def bundle() -> dict[str, Any]:
        from sluice.service.schema import load_bundle

        doc = copy.deepcopy(load_bundle())
        doc["servers"] = [{"url": f"{url}{base}"}]
        return doc

    for path in ("/openapi.json", f"{base}/openapi.json"):
        app.get(path, include_in_schema=False)(lambda: json_response(bundle()))
    add_operations(app, service, base, bundle)  # /health, /ready, /metrics, openapi.yaml: no token
    dashboard = mount_service_dashboard(app, service, tokens, base)  # `/` and /dashboard/...
    app.state.site = Site(service)
    for module in (route_read, route_tree):
        app.include_router(module.router, prefix=base)
    return app
