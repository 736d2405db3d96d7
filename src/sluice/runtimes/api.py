"""Train a :class:`~sluice.tasks.Task` from Python with the sections of a job: :func:`run_task`.

``run_task(task, {"train": {...}, "compression": {...}, "termination": {...}}, out="runs/x")`` trains the task
as ``sluice run`` (``engine="hfl"``, the simulator) or ``sluice local`` (``engine="local"``) train theirs:
the same control plane, run directory (``config.toml``, ``metrics.jsonl``, ``status.json``, ``report.json``,
``summary.json``, ``model.pt``, plots), progress bar, report and exit status. The job's ``[model] id``
defaults to ``<engine>-<task name>``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from rich.console import Console

from sluice.config import apply_overrides, read_toml
from sluice.errors import ConfigError
from sluice.tasks import Task


def run_task(task: Task, config: dict[str, Any] | str | Path | None = None, *, engine: str = "hfl",
             out: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (),
             console: Console | None = None) -> int:
    """Train ``task`` under a job of ``config`` (a dict of sections or a TOML file; ``overrides`` as ``--set``
    takes them) and write the run directory ``out``; return the exit status (0 when training succeeded)."""
    from sluice.runtimes.jobs import job_from_dict
    from sluice.runtimes.training import train_hfl, train_local

    if not isinstance(task, Task):
        raise ConfigError(f"run_task trains a sluice.Task, got {type(task).__name__}")
    trainers = {"hfl": train_hfl, "local": train_local}
    if engine not in trainers:
        raise ConfigError(f"run_task trains with engine 'hfl' or 'local', got {engine!r}")
    if isinstance(config, dict):
        raw = apply_overrides(copy.deepcopy(config), list(overrides))
    else:
        raw = read_toml(config, list(overrides))
    if "task" in raw:
        raise ConfigError("run_task trains the task it is given: leave the [task] section out")
    job = job_from_dict(engine, raw)
    job.task = task
    if "id" not in (raw.get("model") or {}):
        job.model = job.model.model_copy(update={"id": f"{engine}-{task.name}"})
    return trainers[engine](job, None if out is None else str(out), console or Console())
