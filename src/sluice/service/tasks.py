"""Which tasks a request may train: the built-in ones and those the operator registered (``[tasks]`` of the
service configuration, a name → ``package.module:function`` table).

A consumer names a task (``[task] name``, with ``[task.args]``); it never gives an import path
(``[task] factory``), which would let any consumer run any code on the producer. :func:`producer_task`
checks a request's ``[task]`` section and gives the one the producer validates and trains (a registered
name becomes its factory); :func:`check_args` checks the arguments against the task's function without
calling it; :func:`producer_job` turns a stored job (which keeps the name the consumer gave) into the one a
worker builds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sluice.errors import TaskError
from sluice.service.nrm import MnSError
from sluice.tasks.config import BUILTIN_NAMES, SPLIT_BUILTIN_NAMES, factory_kwargs, import_factory

JOB = "VsDataContainer/sluice-job"


def builtin_names(kind: str) -> tuple[str, ...]:
    """The built-in tasks of an engine kind: split training's own, or those of the other engines."""
    return SPLIT_BUILTIN_NAMES if kind == "split" else BUILTIN_NAMES


def offered(registered: dict[str, str], kind: str = "hfl") -> str:
    """The tasks a request may name, for messages."""
    mine = ", ".join(registered) or "none"
    return f"built-in: {', '.join(builtin_names(kind))}; registered on this service: {mine}"


def producer_task(section: Any, registered: dict[str, str], kind: str = "hfl") -> dict[str, Any]:
    """The ``[task]`` section the producer validates for a request's ``section``: the same, with a registered
    name replaced by its factory. A 400 (:class:`MnSError`) for an import path or an unknown name. (A split
    job's registered task is a function every party of the producer's split training calls, with ``party``.)"""
    if not isinstance(section, dict):
        raise MnSError(400, "sluice-job task must be an object: {name: a task of this service, args: {...}}",
                       bad_attributes=[JOB])
    if "factory" in section:
        raise MnSError(400, "sluice-job task.factory: a request names a task of this service (task.name, with "
                       "task.args), never an import path; " + offered(registered, kind), bad_attributes=[JOB])
    name = section.get("name")
    if name is None or (isinstance(name, str) and name in builtin_names(kind)):
        return dict(section)
    if not isinstance(name, str) or name not in registered:
        raise MnSError(400, f"sluice-job task.name: unknown task {name!r}; {offered(registered, kind)}",
                       bad_attributes=[JOB])
    return _with_factory(section, registered[name])


def _with_factory(section: dict[str, Any], ref: str) -> dict[str, Any]:
    out = {k: v for k, v in section.items() if k != "name"}
    out["factory"] = ref
    return out


def task_function(name: str, registered: dict[str, str],
                  kind: str = "hfl") -> tuple[Callable[..., Any], dict[str, Any]]:
    """The function that builds task ``name`` and the arguments it gets besides ``[task.args]``."""
    if name in registered:
        return import_factory(registered[name]), {}
    if kind == "split":
        from sluice.tasks.split_builtin import builtin_split

        return builtin_split, {"dataset": name}
    from sluice.tasks.builtin import BUILTIN, tabular

    if name in BUILTIN:
        return BUILTIN[name], {}
    return tabular, {"dataset": name}


def check_args(name: str, args: dict[str, Any], registered: dict[str, str], kind: str = "hfl") -> None:
    """Whether ``args`` fit the function of task ``name`` (``seed`` is the job's when it takes one), without
    calling it: a 400 when they do not, a 503 when a registered factory cannot be imported here."""
    try:
        fn, given = task_function(name, registered, kind)
    except TaskError as exc:
        raise MnSError(503, f"task {name!r} is registered on this service but cannot be loaded: {exc}",
                       bad_attributes=[JOB]) from exc
    try:
        party = {"party": "leader", "followers": 1, "topology": "6"} if kind == "split" else None  # given by Sluice
        factory_kwargs(fn, name, {**given, **args}, 0, party)
    except TaskError as exc:
        raise MnSError(400, f"sluice-job task.args: {exc}", bad_attributes=[JOB]) from exc


def producer_job(raw: dict[str, Any], registered: dict[str, str]) -> dict[str, Any]:
    """The job a worker builds from a stored one: a registered task name becomes its factory, in ``[task]`` and
    in a split job's ``[follower_tasks]`` (a name the service no longer registers stays, and the worker
    refuses it)."""

    def mapped(task: Any) -> Any:
        if not isinstance(task, dict) or task.get("name") not in registered:
            return task
        return _with_factory(task, registered[task["name"]])

    out = {**raw, "task": mapped(raw["task"])} if "task" in raw else dict(raw)
    if isinstance(raw.get("follower_tasks"), dict):
        out["follower_tasks"] = {k: mapped(v) for k, v in raw["follower_tasks"].items()}
    return out
