"""The report of a Flower run whose ServerApp could not write one (the SuperLink died with it, or never
started it), from the metrics the run wrote."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from sluice.runtimes.jobs import Job


def failure_report(job: Job, out: Path, detail: str) -> dict[str, Any]:
    """The report of a run whose ServerApp could not write one (the SuperLink died with it, or never started
    it); written into ``out`` where this host can (a SuperLink elsewhere has the run directory)."""
    from sluice.control import Cause, ProcessState, TrainingReport

    records = records_of(out)
    last = records[-1] if records else {}
    report = TrainingReport(
        cause=Cause.ENGINE_FAILURE, status=ProcessState.FAILED, detail=detail, model=job.model,
        performance={k: float(v) for k, v in last.items() if isinstance(v, int | float)
                     and k not in ("round", "seconds") and not k.startswith(("bytes_", "cum_bytes_"))},
        iterations=len(records), bytes_up=int(last.get("cum_bytes_up", 0)),
        bytes_down=int(last.get("cum_bytes_down", 0)), termination=job.termination, requirements=job.requirements)
    doc = report.to_json()
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    except OSError:
        pass  # the report is still shown and its exit status returned
    return doc


def records_of(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows
