"""The dashboard's view of run directories (``sluice run``, ``sluice local``, ``sluice split run``, Flower runs).

A run directory holds ``metrics.jsonl`` (one line per iteration, appended and flushed as the run goes),
``status.json`` (rewritten every iteration), and once ended ``report.json``; ``config.toml`` has its
configuration. :class:`RunsSource` watches a folder: the folder itself when it is a run directory, else every
run directory below it (two levels deep at most). A thread reads what each file gained since it last looked
(every :data:`WATCH_S`; new directories every second) and publishes one ``process`` event per run that
changed, with the points of the lines that were added. A line is taken only once it is complete (ends with a
newline), so a line being written is read on the next look.
"""

from __future__ import annotations

import json
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

from sluice.dashboard.views import Columns, budget_of, criteria, estimate_of, point_of_record

WATCH_S = 0.1
RUN_FILES = ("metrics.jsonl", "status.json", "report.json")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class _Run:
    """What has been read of one run directory."""

    def __init__(self, rid: str, path: Path) -> None:
        self.id = rid
        self.path = path
        self.offset = 0
        self.points: list[dict[str, Any]] = []
        self.columns = Columns()
        self.stamps: dict[str, tuple[int, int]] = {}
        self.status: dict[str, Any] = {}
        self.report: dict[str, Any] = {}
        self.config: dict[str, Any] = {}

    def _stamp(self, name: str) -> tuple[int, int] | None:
        try:
            st = (self.path / name).stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def refresh(self) -> tuple[bool, list[dict[str, Any]]]:
        """Read what changed: (whether anything did, the new points)."""
        changed = False
        new: list[dict[str, Any]] = []
        for name in ("status.json", "report.json", "config.toml"):
            stamp = self._stamp(name)
            if stamp is not None and stamp != self.stamps.get(name):
                self.stamps[name] = stamp
                changed = True
                if name == "config.toml":
                    try:
                        self.config = tomllib.loads((self.path / name).read_text(encoding="utf-8"))
                    except (OSError, tomllib.TOMLDecodeError):
                        self.config = {}
                else:
                    setattr(self, name.split(".")[0], _read_json(self.path / name))
        stamp = self._stamp("metrics.jsonl")
        if stamp is not None and stamp != self.stamps.get("metrics.jsonl"):
            self.stamps["metrics.jsonl"] = stamp
            if stamp[1] < self.offset:  # rewritten from the start (a new run in the same folder)
                self.offset, self.points, self.columns = 0, [], Columns()
            with open(self.path / "metrics.jsonl", "rb") as f:
                f.seek(self.offset)
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offset += end
            for line in data[:end].splitlines():
                try:
                    p = point_of_record(json.loads(line))
                except ValueError:
                    continue
                if p is not None:
                    new.append(p)
            self.points.extend(new)
            for p in new:
                self.columns.append(p)
            changed = changed or bool(new)
        return changed, new

    def _state(self) -> dict[str, Any]:
        """Where the run stands: status, cause and progress, from its report once it has one."""
        status = self.report.get("status") or self.status.get("status") or ("RUNNING" if self.points else "NOT_STARTED")
        if self.report:
            progress = 100 if self.report.get("status") == "FINISHED" else self.report.get("progress_percent")
        else:
            progress = self.status.get("progressPercentage")
        return {"status": status, "state_info": self.status.get("progressStateInfo") or status,
                "cause": self.report.get("cause") or self.status.get("resultStateInfo") or "",
                "detail": self.report.get("detail") or "", "progress": progress,
                "criterion": self.report.get("criterion"), "clients": self.report.get("clients") or [],
                "participating": self.status.get("participating_clients") or []}

    def view(self) -> dict[str, Any]:
        st = self.report or self.status
        cfg = self.config
        model = cfg.get("model") or {}
        term = self.report.get("termination") or cfg.get("termination") or budget_of(cfg)
        last = self.points[-1] if self.points else {}
        iterations = st.get("iterations") or last.get("iteration") or 0
        elapsed = st.get("duration_s") or st.get("elapsed_s")
        metrics = self.status.get("metrics") or {k: v for k, v in last.items()
                                                  if k not in ("iteration", "cum_bytes_up", "cum_bytes_down")}
        return {
            "id": self.id, "owner": None, "request": None, "requestStatus": None,
            "engine": cfg.get("engine") or ("split" if (self.path / "party.toml").exists() else None),
            "model_type": model.get("type") or model.get("id"), "model_id": model.get("id"),
            **self._state(),
            "iterations": iterations, "elapsed_s": elapsed, "metrics": metrics, "estimate": estimate_of(st),
            "bytes_up": st.get("bytes_up") or last.get("cum_bytes_up") or 0,
            "bytes_down": st.get("bytes_down") or last.get("cum_bytes_down") or 0,
            "termination": term, "termination_text": _brief(term),
            "criteria": criteria(term, iterations, elapsed or 0.0, metrics),
            "suspended": False, "negotiation": None, "started": None, "ended": None,
            "links": {"report": f"files/{self.id}/report.json" if self.report else None,
                      "model": f"files/{self.id}/model.pt" if (self.path / "model.pt").exists() else None},
        }


def _brief(term: dict[str, Any]) -> str:
    parts = []
    for k, v in term.items():
        if v in (None, {}, [], "") or k in ("check_finite", "divergence_factor", "data_wait_s"):
            continue
        parts.append(f"{k}={json.dumps(v, separators=(',', ':'))}")
    return "; ".join(parts)


class RunsSource:
    """Run directories under ``root``, watched by a thread."""

    mode = "runs"

    def __init__(self, root: str | Path, publish: Any) -> None:
        self.root = Path(root).resolve()
        self.publish = publish
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sluice-dashboard-runs", daemon=True)
        self._scanned = 0.0

    def start(self) -> None:
        self._scan()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def path_of(self, rid: str) -> Path | None:
        with self._lock:
            run = self._runs.get(rid)
        return None if run is None else run.path

    def _scan(self) -> None:
        found = []
        if any((self.root / f).exists() for f in RUN_FILES):
            found.append(self.root)
        else:
            for d in sorted(self.root.glob("*")) + sorted(self.root.glob("*/*")):
                if d.is_dir() and any((d / f).exists() for f in RUN_FILES):
                    found.append(d)
        with self._lock:
            for d in found:
                rid = d.name if d == self.root else d.relative_to(self.root).as_posix()
                if rid not in self._runs:
                    run = _Run(rid, d)
                    run.refresh()
                    self._runs[rid] = run
        self._scanned = time.monotonic()

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_S):
            if time.monotonic() - self._scanned > 1.0:
                self._scan()
            with self._lock:
                runs = list(self._runs.values())
            for run in runs:
                with self._lock:
                    changed, new = run.refresh()
                    view = run.view() if changed else None
                if view is not None:
                    self.publish({"type": "process", "id": run.id, "owner": None, "summary": view,
                                  "points": new})

    def snapshot(self, actor: Any) -> list[dict[str, Any]]:
        with self._lock:
            return [r.view() for r in self._runs.values()]

    def detail(self, rid: str, actor: Any) -> dict[str, Any] | None:
        with self._lock:
            run = self._runs.get(rid)
            if run is None:
                return None
            return {**run.view(), "columns": run.columns.copy()}

    @staticmethod
    def accept(actor: Any, event: dict[str, Any]) -> bool:
        return True
