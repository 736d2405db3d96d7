"""Run directories: resolved config, one metrics line per iteration, a summary and plots.

Files are written to a temporary name and renamed, so an interrupted run never leaves a half-written
``summary.json`` or ``config.toml`` behind; ``metrics.jsonl`` is appended and flushed line by line (and, with
``--log-to``, each line also goes to :mod:`sluice.tensorboard`).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import tomli_w

from sluice.config import toml_ready
from sluice.files import atomic_write


def new_run_path(prefix: str = "run") -> Path:
    """A fresh ``runs/<prefix>-<timestamp>`` (with ``-1``, ``-2``... when that exists already)."""
    base = Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, i = base, 1
    while path.exists():
        path = base.with_name(f"{base.name}-{i}")
        i += 1
    return path


class RunDir:
    """A directory holding everything one run produced."""

    def __init__(self, path: str | Path | None, prefix: str = "run") -> None:
        self.path = Path(path) if path is not None else new_run_path(prefix)
        self.created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        self._written: set[Path] = {self.path / "metrics.jsonl"}
        self._metrics = open(self.path / "metrics.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        from sluice.tensorboard import sinks_for  # --log-to: where the metrics also go (none by default)

        self._sinks = sinks_for(self.path.resolve().name)

    def write_config(self, config: dict[str, Any]) -> None:
        self._written.add(self.path / "config.toml")
        atomic_write(self.path / "config.toml", tomli_w.dumps(toml_ready(config)).encode())

    def log(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()
        for sink in self._sinks:
            sink.log(record)

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.path / name
        self._written.add(path)
        atomic_write(path, (json.dumps(obj, indent=2, default=str) + "\n").encode())
        return path

    def close(self) -> None:
        if not self._metrics.closed:
            self._metrics.close()
        for sink in self._sinks:
            sink.close()
        self._sinks = []

    def discard(self) -> None:
        """Remove what this run wrote, and the directory when this run created it."""
        self.close()
        for path in self._written:
            path.unlink(missing_ok=True)
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``metrics.jsonl`` file back as a list of records."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class History:
    """Turns engine events into metrics records with cumulative byte counts."""

    def __init__(self, key: str = "round") -> None:
        self.key = key
        self.records: list[dict[str, Any]] = []
        self.cum_bytes_up = 0
        self.cum_bytes_down = 0
        self.seconds = 0.0

    def add(self, event: Any) -> dict[str, Any]:
        """Record one :class:`sluice.engine.IterationEvent`; return the metrics line for it."""
        self.cum_bytes_up += event.bytes_up
        self.cum_bytes_down += event.bytes_down
        self.seconds += event.seconds
        record = {self.key: event.iteration, **event.metrics, "bytes_up": event.bytes_up,
                  "bytes_down": event.bytes_down, "cum_bytes_up": self.cum_bytes_up,
                  "cum_bytes_down": self.cum_bytes_down, "seconds": round(event.seconds, 6)}
        self.records.append(record)
        return record

    def last(self, metric: str) -> float | None:
        """The latest value of ``metric``, or None if it was never reported."""
        for rec in reversed(self.records):
            if metric in rec:
                return rec[metric]
        return None

    def best(self, metric: str) -> float | None:
        values = [r[metric] for r in self.records if metric in r]
        return max(values) if values else None
