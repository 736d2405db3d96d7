"""Operations endpoints of the service, beside ProvMnS and served without a token: liveness, readiness, Prometheus
metrics and the OpenAPI document as YAML.

* ``GET /health`` — liveness: 200 ``{"status": "ok"}`` while the web server answers.
* ``GET /ready`` — readiness: 200 when the database answers a query and the supervisor that starts workers is
  running, else 503; the body says which (``database``, ``workers`` with ``running`` and ``max``).
* ``GET /metrics`` — the Prometheus text format (``prometheus-client``). Counts only, no names or data of any
  consumer, hence no token: a scraper needs none. The figures are read from the database at each scrape, so
  they are right after a restart and on every service sharing one database:

  ===================================================  =========  ====================================================
  ``sluice_training_requests{status}``                 gauge      MLTrainingRequests by ``requestStatus``
  ``sluice_training_processes{phase}``                 gauge      MLTrainingProcesses by phase (proposed, queued,
                                                                  starting, running, ended)
  ``sluice_queue_length``                              gauge      processes queued to start (not suspended)
  ``sluice_workers_running`` / ``sluice_workers_max``  gauge      workers of this service, and its ``max_concurrent``
  ``sluice_notification_backlog``                      gauge      notifications not delivered yet (nor dropped)
  ``sluice_notifications_dropped``                     gauge      notifications given up after every attempt
  ``sluice_notification_delivery_latency_seconds``     histogram  commit-to-delivery time of delivered notifications
  ``sluice_http_requests_total{method,code}``          counter    HTTP requests this process answered, by status
  ===================================================  =========  ====================================================

* ``GET /openapi.yaml`` (and under the base path) — the served OpenAPI document in YAML.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from sluice.control.lifecycle import Phase
from sluice.service.db import MOI, Notification

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
PHASES = tuple(p.value for p in Phase)


def _json(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else json.loads(value or "{}")


class ServiceCollector:
    """Prometheus collector of one :class:`sluice.service.core.TrainingService` (see the module docstring)."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.http: Counter[tuple[str, str]] = Counter()

    def collect(self) -> Iterator[Any]:
        with self.service.store.read() as s:
            rows = s.execute(sa.select(MOI.object_class, MOI.attributes, MOI.internal).where(
                MOI.object_class.in_(("MLTrainingRequest", "MLTrainingProcess")))).all()
            yield from self._notifications(s)
        requests = GaugeMetricFamily("sluice_training_requests", "MLTrainingRequests by requestStatus",
                                     labels=["status"])
        statuses = Counter(_json(a).get("requestStatus", "NOT_STARTED") for c, a, _ in rows
                           if c == "MLTrainingRequest")
        for status in ("NOT_STARTED", "IN_PROGRESS", "SUSPENDED", "CANCELLING", "FINISHED", "CANCELLED"):
            requests.add_metric([status], statuses.pop(status, 0))
        for status, n in statuses.items():
            requests.add_metric([str(status)], n)
        processes = GaugeMetricFamily("sluice_training_processes", "MLTrainingProcesses by phase", labels=["phase"])
        internals = [_json(i) for c, _, i in rows if c == "MLTrainingProcess"]
        phases = Counter(i.get("phase") for i in internals)
        for phase in PHASES:
            processes.add_metric([phase], phases.get(phase, 0))
        yield requests
        yield processes
        queued = sum(1 for i in internals if i.get("phase") == Phase.QUEUED and not i.get("suspended"))
        yield GaugeMetricFamily("sluice_queue_length", "processes queued to start (not suspended)", value=queued)
        yield GaugeMetricFamily("sluice_workers_running", "workers of this service training now",
                                value=len(self.service.supervisor.running()))
        yield GaugeMetricFamily("sluice_workers_max", "max_concurrent: workers this service runs at most",
                                value=self.service.cfg.max_concurrent)
        http = CounterMetricFamily("sluice_http_requests", "HTTP requests answered, by method and status",
                                   labels=["method", "code"])
        for (method, code), n in sorted(self.http.items()):
            http.add_metric([method, code], n)
        yield http

    def _notifications(self, s: Any) -> Iterator[Any]:
        N = Notification
        pending = s.scalar(sa.select(sa.func.count()).select_from(N).where(N.delivered_at.is_(None),
                                                                            N.dropped.is_(False))) or 0
        dropped = s.scalar(sa.select(sa.func.count()).select_from(N).where(N.dropped.is_(True))) or 0
        latency = N.delivered_at - N.created_at
        cols = [sa.func.sum(sa.case((latency <= b, 1), else_=0)) for b in LATENCY_BUCKETS]
        row = s.execute(sa.select(sa.func.count(), sa.func.sum(latency), *cols).where(
            N.delivered_at.is_not(None))).one()
        count, total = int(row[0] or 0), float(row[1] or 0.0)
        buckets = [(repr(b), float(v or 0)) for b, v in zip(LATENCY_BUCKETS, row[2:], strict=True)]
        yield GaugeMetricFamily("sluice_notification_backlog", "notifications not delivered yet", value=pending)
        yield GaugeMetricFamily("sluice_notifications_dropped", "notifications given up", value=dropped)
        yield HistogramMetricFamily("sluice_notification_delivery_latency_seconds",
                                    "time from the commit of a change to the delivery of its notification",
                                    buckets=[*buckets, ("+Inf", float(count))], sum_value=total)


class CountRequests:
    """ASGI middleware counting answered HTTP requests by method and status into ``collector.http``."""

    def __init__(self, app: Any, collector: ServiceCollector) -> None:
        self.app, self.collector = app, collector

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.collector.http[(scope.get("method", "GET"), str(message["status"]))] += 1
            await send(message)

        await self.app(scope, receive, counting)


def readiness(service: Any) -> tuple[int, dict[str, Any]]:
    """``(status, body)`` of ``/ready``: 200 when the database answers and the supervisor runs, else 503."""
    body: dict[str, Any] = {"status": "ready"}
    try:
        with service.db.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        body["database"] = "ok"
    except Exception as exc:  # noqa: BLE001 - any failure to reach the database makes the service unready
        body["database"] = f"unreachable: {type(exc).__name__}: {str(exc)[:200]}"
    sup = service.supervisor
    body["workers"] = {"supervisor": "running" if sup.alive() else "stopped", "running": len(sup.running()),
                       "max": sup.max_concurrent}
    ok = body["database"] == "ok" and sup.alive()
    if not ok:
        body["status"] = "unready"
    return (200 if ok else 503), body


def add_operations(app: Any, service: Any, base: str, bundle: Any) -> None:
    """Add ``/health``, ``/ready``, ``/metrics`` and the YAML OpenAPI document to ``app``."""
    import yaml
    from fastapi.responses import JSONResponse, Response

    collector = ServiceCollector(service)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    app.add_middleware(CountRequests, collector=collector)

    @app.get("/health", include_in_schema=False)
    def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/ready", include_in_schema=False)
    def ready() -> JSONResponse:
        status, body = readiness(service)
        return JSONResponse(body, status_code=status)

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def openapi_yaml() -> Response:
        return Response(yaml.safe_dump(bundle(), sort_keys=False, allow_unicode=True), media_type="application/yaml")

    app.get("/openapi.yaml", include_in_schema=False)(openapi_yaml)
    app.get(f"{base}/openapi.yaml", include_in_schema=False)(openapi_yaml)
