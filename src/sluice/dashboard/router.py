"""The dashboard's HTTP routes, the same for the service and for run directories.

* ``GET /`` — the page (static HTML; its script and the vendored uPlot under ``/dashboard/static/``);
* ``GET /dashboard/api/info`` — the mode (``service`` or ``runs``), the ProvMnS base path and whether a token
  is needed;
* ``GET /dashboard/api/processes/{id}`` — one process's summary and every curve point kept;
* ``GET /dashboard/api/events`` — server-sent events: first a ``snapshot`` (every process the caller may
  see), then a ``process`` event per change (with its new points) and ``removed`` for a deleted one.

The page and its static files need no token; the API takes the service's bearer tokens (``Authorization:
Bearer``) and shows a caller what the ProvMnS interface would. The page sends every control (suspend,
resume, cancel, termination parameters, the answer to a proposal) as the ProvMnS PATCH itself, with the
same token: the dashboard has no write route of its own. Run directories' report and model are served
under ``/dashboard/files/{run}/`` (only those two files).
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles

from sluice.dashboard.hub import Hub

STATIC = resources.files("sluice.dashboard") / "static"
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="sluice"'}


def _unauthorized() -> JSONResponse:
    return JSONResponse({"error": "a valid bearer token is needed"}, status_code=401, headers=_CHALLENGE)


def build_router(source: Any, hub: Hub, tokens: Any = None, base: str = "") -> APIRouter:
    """Routes over ``source`` (:class:`~sluice.service.dashboard.ServiceSource` or
    :class:`~sluice.dashboard.runs_source.RunsSource`); ``tokens``: the service's
    :class:`~sluice.service.auth.TokenRegistry` (None: no authentication)."""
    router = APIRouter()
    auth_on = tokens is not None and tokens.enabled

    def actor_of(request: Request) -> tuple[bool, Any]:
        if not auth_on:
            return True, None
        actor = tokens.authenticate(request.headers.get("authorization"))
        return actor is not None, actor

    @router.get("/", include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"),
                            headers={"Cache-Control": "no-cache"})

    @router.get("/dashboard/api/info", include_in_schema=False)
    def info() -> JSONResponse:
        return JSONResponse({"mode": source.mode, "base": base, "auth": auth_on})

    @router.get("/dashboard/api/processes/{pid:path}", include_in_schema=False)
    def detail(pid: str, request: Request) -> Response:
        ok, actor = actor_of(request)
        if not ok:
            return _unauthorized()
        view = source.detail(pid, actor)
        if view is None:
            return JSONResponse({"error": f"no process {pid}"}, status_code=404)
        return JSONResponse(view)

    @router.get("/dashboard/api/events", include_in_schema=False)
    def events(request: Request) -> Response:
        ok, actor = actor_of(request)
        if not ok:
            return _unauthorized()
        first = [{"type": "snapshot", "processes": source.snapshot(actor)}]
        body = hub.stream(lambda ev: source.accept(actor, ev), first, request.is_disconnected)
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    if source.mode == "runs":
        @router.get("/dashboard/files/{rid:path}/{name}", include_in_schema=False)
        def run_file(rid: str, name: str) -> Response:
            path = source.path_of(rid)
            if path is None or name not in ("report.json", "model.pt") or not (path / name).is_file():
                return JSONResponse({"error": "no such file"}, status_code=404)
            return FileResponse(path / name, filename=name if name == "model.pt" else None)

    return router


def mount_static(app: Any) -> None:
    """The page's script, style and the vendored uPlot under ``/dashboard/static``."""
    app.mount("/dashboard/static", StaticFiles(directory=str(STATIC)), name="dashboard-static")
