"""The dashboard's view of a running ``sluice serve``: its training processes, fed by the store's changes.

Every committed change of an MOI (the same changes the service's notifications are made of) reaches
:meth:`ServiceSource.changed` through :attr:`sluice.service.store.Store.listeners`; a thread reads the
changed processes back (with their request and report) and publishes one ``process`` event each, carrying
the process's summary and, when it did more iterations, a new curve point. Curve points are kept in
memory from the moment the service started (a process's earlier history is its latest status only: the
service stores no per-iteration history). A caller sees the processes it may see under the service's
token rules (:func:`sluice.service.auth.may_see`): a consumer its own, an admin (or anyone with
authentication off) all.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from sluice.dashboard.views import Columns, budget_of, criteria, estimate_of, point_of_status
from sluice.service.auth import Actor, may_see
from sluice.service.nrm import id_of

MAX_POINTS = 50_000
_WATCHED = frozenset({"MLTrainingProcess", "MLTrainingRequest", "MLTrainingReport"})


def _ldn(dn: str | None) -> str | None:
    return None if not dn else dn.replace(",", "/")


class ServiceSource:
    """Process views and curve points of one :class:`~sluice.service.core.TrainingService`."""

    mode = "service"

    def __init__(self, service: Any, publish: Any) -> None:
        self.service = service
        self.publish = publish
        self.base = service.cfg.base_path
        self._points: dict[str, Columns] = {}
        self._last: dict[str, int] = {}
        self._owners: dict[str, str | None] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[float, list[tuple[str, str]]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="sluice-dashboard", daemon=True)

    def start(self) -> None:
        self.service.store.listeners.append(self.changed)
        self._thread.start()

    def stop(self) -> None:
        if self.changed in self.service.store.listeners:
            self.service.store.listeners.remove(self.changed)
        self._queue.put(None)

    def changed(self, items: list[tuple[str, str]]) -> None:
        """A store listener: takes note, returns at once."""
        if any(cls in _WATCHED for _, cls in items):
            self._queue.put((time.time(), items))

    # ------------------------------------------------------------------ reads
    def _rows(self) -> list[Any]:
        import sqlalchemy as sa

        from sluice.service.db import MOI

        with self.service.store.read() as s:
            return list(s.scalars(sa.select(MOI).where(MOI.object_class == "MLTrainingProcess").order_by(MOI.seq)))

    def _view(self, proc: Any) -> dict[str, Any]:
        store = self.service.store
        i = proc.internal
        req = store.get(i.get("request") or "")
        rep = store.get(_ldn(proc.attributes.get("trainingReportRef")) or "")
        st = proc.vs_data.get("sluice-status") or {}
        ps = proc.attributes.get("progressStatus") or {}
        report = (rep.vs_data.get("sluice-report") if rep is not None else None) or {}
        term = i.get("termination") or report.get("termination") or budget_of(i.get("raw") or {})
        model = i.get("model") or {}
        return {
            "id": id_of(proc.dn), "owner": i.get("owner"), "request": id_of(i["request"]) if i.get("request") else None,
            "requestStatus": req.attributes.get("requestStatus") if req is not None else None,
            "engine": i.get("kind"), "model_type": model.get("type") or (
                req.attributes.get("aIMLInferenceName") if req is not None else None),
            "model_id": model.get("id"), "status": ps.get("status"),
            "state_info": ps.get("progressStateInfo"), "cause": ps.get("resultStateInfo") or st.get("cause") or "",
            "detail": st.get("detail") or report.get("detail") or "", "progress": ps.get("progressPercentage"),
            **_running(st), "termination": term, "termination_text": proc.attributes.get("terminationConditions") or "",
            "criteria": criteria(term, st.get("iterations") or 0, st.get("elapsed_s") or 0.0, st.get("metrics") or {}),
            "criterion": report.get("criterion"), "clients": report.get("clients") or [],
            "suspended": bool(proc.attributes.get("suspendProcess")),
            "negotiation": proc.vs_data.get("sluice-negotiation"),
            "started": ps.get("startTime"), "ended": ps.get("endTime"),
            "links": self._links(proc, rep),
        }

    def _links(self, proc: Any, rep: Any) -> dict[str, str | None]:
        """The ProvMnS URIs of a process, its request, report and model (None: there is none yet)."""
        uri = f"{self.base}/"
        request, model = proc.internal.get("request"), proc.attributes.get("mLModelRef")
        return {"process": uri + proc.dn, "request": uri + request if request else None,
                "report": uri + rep.dn if rep is not None else None, "model": uri + _ldn(model) if model else None}

    def _note_point(self, pid: str, view: dict[str, Any], st: dict[str, Any]) -> dict[str, Any] | None:
        p = point_of_status(st)
        with self._lock:
            cols = self._points.setdefault(pid, Columns())
            if p is None or self._last.get(pid, 0) >= p["iteration"]:
                return None
            self._last[pid] = p["iteration"]
            cols.append(p)
            if cols.n > MAX_POINTS:
                cols.drop_first(cols.n - MAX_POINTS)
        return p

    def snapshot(self, actor: Actor | None) -> list[dict[str, Any]]:
        out = []
        for proc in self._rows():
            if may_see(actor, proc.internal.get("owner"), proc.object_class):
                view = self._view(proc)
                self._note_point(view["id"], view, proc.vs_data.get("sluice-status") or {})
                out.append(view)
        return out

    def detail(self, pid: str, actor: Actor | None) -> dict[str, Any] | None:
        proc = self.service.store.get(f"{self.service.tf}/MLTrainingProcess={pid}")
        if proc is None or not may_see(actor, proc.internal.get("owner"), proc.object_class):
            return None
        view = self._view(proc)
        self._note_point(pid, view, proc.vs_data.get("sluice-status") or {})
        with self._lock:
            cols = self._points.get(pid)
            view["columns"] = cols.copy() if cols is not None else {}
        return view

    @staticmethod
    def accept(actor: Actor | None, event: dict[str, Any]) -> bool:
        return may_see(actor, event.get("owner"), "MLTrainingProcess")

    # ------------------------------------------------------------------ the feed
    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            committed, batch = first[0], list(first[1])
            while not self._queue.empty():  # coalesce what arrived meanwhile
                more = self._queue.get_nowait()
                if more is None:
                    return
                batch.extend(more[1])
            try:
                self._publish(batch, committed)
            except Exception:  # noqa: BLE001 - a read racing a delete: the next change shows it again
                continue

    def _publish(self, batch: list[tuple[str, str]], committed: float) -> None:
        """One event per changed process; ``committed_at``: when the earliest change of the batch committed."""
        procs: dict[str, None] = {}
        for ldn, cls in batch:
            if cls == "MLTrainingProcess" or cls == "MLTrainingReport":
                procs[f"{self.service.tf}/MLTrainingProcess={id_of(ldn)}"] = None
            elif cls == "MLTrainingRequest":
                for row in self._rows():
                    if row.internal.get("request") == ldn:
                        procs[row.dn] = None
        for ldn in procs:
            proc = self.service.store.get(ldn)
            if proc is None:
                with self._lock:
                    self._points.pop(id_of(ldn), None)
                    self._last.pop(id_of(ldn), None)
                    owner = self._owners.pop(id_of(ldn), None)
                self.publish({"type": "removed", "id": id_of(ldn), "owner": owner})
                continue
            view = self._view(proc)
            with self._lock:
                self._owners[view["id"]] = view["owner"]
            point = self._note_point(view["id"], view, proc.vs_data.get("sluice-status") or {})
            self.publish({"type": "process", "id": view["id"], "owner": view["owner"], "summary": view,
                          "points": [] if point is None else [point], "committed_at": committed})


def _running(st: dict[str, Any]) -> dict[str, Any]:
    """What a process's ``sluice-status`` says of its training so far."""
    return {"iterations": st.get("iterations") or 0, "elapsed_s": st.get("elapsed_s"),
            "metrics": st.get("metrics") or {}, "estimate": estimate_of(st),
            "bytes_up": st.get("bytes_up") or 0, "bytes_down": st.get("bytes_down") or 0,
            "participating": st.get("participating_clients") or []}


def mount_service_dashboard(app: Any, service: Any, tokens: Any, base: str) -> Any:
    """Add the dashboard's routes to the service's app (before its catch-all ProvMnS routes); returns a
    context manager to run within the app's lifespan (starts and stops the change feed)."""
    from sluice.dashboard.hub import Hub, feeding
    from sluice.dashboard.router import build_router, mount_static

    hub = Hub()
    source = ServiceSource(service, hub.publish)
    app.include_router(build_router(source, hub, tokens, base))
    mount_static(app)
    return lambda: feeding(source, hub)
