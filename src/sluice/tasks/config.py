"""The ``[task]`` section of a job, and how a job's task is found and built.

``[task] name = "<built-in>"`` names a built-in task (:mod:`sluice.tasks.builtin`); ``[task] factory =
"package.module:function"`` names a function that returns a :class:`~sluice.tasks.Task`, imported where the
job runs (on Flower, on every SuperNode: where the data lives). ``[task.args]`` are its keyword arguments;
a factory that takes a ``seed`` argument gets the job's seed unless ``[task.args]`` gives one. Without a
``[task]`` section the task is the built-in named by ``[data] dataset``, an MLP of ``[model] hidden``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import Field, model_validator

from sluice.data.scenarios import SCENARIO_NAMES
from sluice.errors import TaskError
from sluice.schema import Section

SCENARIOS = SCENARIO_NAMES
"""The generated network-analytics scenarios (:mod:`sluice.data.scenarios`)."""
TABULAR_NAMES = ("digits", "breast_cancer", "mnist", "synthetic", *SCENARIOS)
"""The built-in datasets a horizontal or local job trains an MLP on (``[data] dataset``)."""
BUILTIN_NAMES = (*TABULAR_NAMES, "mnist_cnn", "digits_cnn", "kpi_cnn")
"""Every built-in task of horizontal and local training (:mod:`sluice.tasks.builtin`)."""
SPLIT_BUILTIN_NAMES = ("breast_cancer", "digits", "classification", *SCENARIOS)
"""Every built-in split task (:mod:`sluice.tasks.split_builtin`): a dataset's columns shared out among the
parties, each party's part an MLP of the job's ``[model]``."""


class TaskConfig(Section):
    builtin: ClassVar[tuple[str, ...]] = BUILTIN_NAMES
    """The built-in task names this section accepts."""

    name: str | None = Field(None, description="a built-in task (digits, breast_cancer, mnist, synthetic, coverage, "
                             "energy, kpi_anomaly, mnist_cnn, digits_cnn, kpi_cnn); default: [data] dataset")
    factory: str | None = Field(None, description="package.module:function returning a sluice.Task, imported "
                                "where the job runs")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the task's function")

    @model_validator(mode="after")
    def _one(self) -> TaskConfig:
        if self.name is not None and self.factory is not None:
            raise ValueError("give task.name (a built-in task) or task.factory (your own), not both")
        if self.factory is not None and ":" not in self.factory:
            raise ValueError(f"task.factory must be 'package.module:function', got {self.factory!r}")
        if self.name is not None and self.name not in self.builtin:
            raise ValueError(f"unknown built-in task {self.name!r}; built-in: {', '.join(self.builtin)}")
        return self

    @property
    def label(self) -> str | None:
        """What the job trains, for names and messages: the built-in's name or the factory's."""
        return self.name or (self.factory.rsplit(":", 1)[-1] if self.factory else None)


class SplitTaskConfig(TaskConfig):
    """A split-training party's ``[task]``: a built-in split task (the dataset's columns for this party) or
    ``package.module:function`` returning a :class:`~sluice.tasks.split.SplitTask`."""

    builtin: ClassVar[tuple[str, ...]] = SPLIT_BUILTIN_NAMES

    name: str | None = Field(None, description="a built-in split task (breast_cancer, digits, classification, "
                             "coverage, energy, kpi_anomaly); default: [data] dataset")
    factory: str | None = Field(None, description="package.module:function returning a sluice.SplitTask, imported "
                                "on this party's host")


def import_factory(ref: str, what: str = "task factory") -> Callable[..., Any]:
    """The function ``package.module:function``; :class:`TaskError` naming ``what`` it is for and what could not
    be imported."""
    module, _, name = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise TaskError(f"{what} {ref!r}: cannot import {module!r}: {exc}") from None
    except AttributeError:
        raise TaskError(f"{what} {ref!r}: module {module!r} has no {name!r}") from None
    if not callable(fn):
        raise TaskError(f"{what} {ref!r} is a {type(fn).__name__}, not a function")
    return fn


def factory_kwargs(fn: Callable[..., Any], label: str, args: dict[str, Any], seed: int,
                   context: dict[str, Any] | None = None) -> dict[str, Any]:
    """The keyword arguments ``fn`` is called with: ``args``, and ``seed`` (and each of ``context``) when ``fn``
    takes it and ``args`` gives none; a :class:`TaskError` naming what ``fn`` takes when they do not fit its
    signature."""
    kwargs = dict(args)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to check (a builtin): the call itself will tell
        return kwargs
    for key, value in {"seed": int(seed), **(context or {})}.items():
        if key in sig.parameters and key not in kwargs:
            kwargs[key] = value
    try:
        sig.bind(**kwargs)
    except TypeError as exc:
        takes = ", ".join(sig.parameters) or "nothing"
        raise TaskError(f"task {label!r}: arguments {sorted(args)} do not fit: {exc}; it takes: {takes}") from None
    return kwargs


def call_factory(fn: Callable[..., Any], label: str, args: dict[str, Any], seed: int,
                 context: dict[str, Any] | None = None, returns: type | None = None) -> Any:
    """``fn(**args)`` (:func:`factory_kwargs`); a :class:`TaskError` when the arguments do not fit or ``fn``
    fails, and when it returns something else than a ``returns`` (default :class:`~sluice.tasks.Task`)."""
    from sluice.tasks.task import Task

    returns = returns or Task
    kwargs = factory_kwargs(fn, label, args, seed, context)
    try:
        task = fn(**kwargs)
    except TaskError:
        raise
    except Exception as exc:  # the user's factory: any failure is the task's
        raise TaskError(f"task {label!r} failed to build: {type(exc).__name__}: {exc}") from exc
    if not isinstance(task, returns):
        raise TaskError(f"task {label!r} returned {type(task).__name__}, not a sluice.{returns.__name__}")
    return task
