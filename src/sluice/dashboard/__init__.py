"""A live dashboard in the browser: ``/`` of ``sluice serve`` (its training processes) and ``sluice dashboard``
(run directories).

The page is static HTML and JavaScript served by the app, with uPlot vendored from npm (``static/vendor``,
its MIT licence beside it); there is no build step and nothing is fetched from elsewhere. Live updates are
server-sent events (:mod:`~sluice.dashboard.hub`) fed by the service's store changes
(:mod:`sluice.service.dashboard`) or the run directories' files
(:mod:`~sluice.dashboard.runs_source`); the browser never polls.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

__all__ = ["runs_app"]


def runs_app(root: str | Path) -> Any:
    """A FastAPI app serving the dashboard of the run directories under ``root``."""
    from fastapi import FastAPI

    from sluice.dashboard.hub import Hub, feeding
    from sluice.dashboard.router import build_router, mount_static
    from sluice.dashboard.runs_source import RunsSource

    hub = Hub()
    source = RunsSource(root, hub.publish)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        async with feeding(source, hub):
            yield

    app = FastAPI(title="Sluice dashboard", openapi_url=None, docs_url=None, redoc_url=None, lifespan=lifespan)
    app.include_router(build_router(source, hub))
    mount_static(app)
    return app
