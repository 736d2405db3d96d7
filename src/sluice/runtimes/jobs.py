"""Jobs: one training as a consumer asks for it, assembled in one place for the CLI and the service.

A job is an engine kind (``hfl``, ``local``, ``split``) with its engine's configuration, the model identity
(SPEC T3), the training requirements (R1) and the termination parameters (T1). In a TOML file it is the
engine's configuration plus three control parts::

    engine = "hfl"   optional; must match the command (a run's ``config.toml`` always names it)
    [model]          the engine's model settings, plus id, version and type (the identity)
    [requirements]   optional (layers, max_training_time_s, data amounts, performance)
    [termination]    optional; without iterations, the engine's own limit (train.rounds...) is the limit

Engine configurations know nothing of the control plane: this module splits the document, validates
each part with its own model and builds the engine through :data:`ENGINE_KINDS`, the one factory keyed
by engine kind. The layers above add their own kinds to it (:func:`register_engine_kind`): the management
service adds ``chain`` when :mod:`sluice.service` is imported, so nothing here names a module above jobs.

A job on a network-analytics scenario (``data.dataset = "coverage" | "energy" | "kpi_anomaly"``) trains
that scenario's model type: without ``[model] type`` the job takes it, and a different type is a
configuration error.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.config import read_toml, validate
from sluice.control.params import ModelIdentity, Requirements, Termination, normalise_model_type, parse_model
from sluice.engine import Engine
from sluice.errors import ConfigError
from sluice.schema import Section

IDENTITY_KEYS = ("id", "version", "type")


def _load(ref: str) -> Any:
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class EngineKind:
    """One kind of engine: where its configuration model and its builder live (imported on first use,
    so that naming a kind costs no torch import), and the model id a job gets when it names none."""

    name: str
    config_ref: str
    build_ref: str
    default_model_id: Callable[[Any], str]

    def config_model(self) -> type[Section]:
        return _load(self.config_ref)

    def build(self, config: Section, task: Any = None) -> Engine:
        """The engine of ``config``; ``task``, a :class:`sluice.tasks.Task` object, replaces the configuration's
        ``[task]`` (engines that train tasks only)."""
        if task is None:
            return _load(self.build_ref)(config)
        return _load(self.build_ref)(config, task)


ENGINE_KINDS: dict[str, EngineKind] = {
    k.name: k
    for k in (
        EngineKind("hfl", "sluice.hfl.config:HFLConfig", "sluice.hfl:engine_from_config",
                   lambda c: f"hfl-{c.task.label or c.data.dataset + '-mlp'}"),
        EngineKind("local", "sluice.local.config:LocalConfig", "sluice.local:engine_from_config",
                   lambda c: f"local-{c.task.label or c.data.dataset + '-mlp'}"),
        EngineKind("split", "sluice.split.config:SplitConfig", "sluice.split:engine_from_config",
                   lambda c: f"split-{c.task.label or c.data.dataset}-{c.topology}"),
    )
}
"""Every engine kind a job may name: the engines' own, and those a layer above adds with
:func:`register_engine_kind` (the management service's ``chain``, on importing :mod:`sluice.service`)."""


def register_engine_kind(kind: EngineKind) -> None:
    """Make ``kind`` a kind jobs may name (again: the same name replaces the earlier kind)."""
    ENGINE_KINDS[kind.name] = kind


def engine_kind(name: str) -> EngineKind:
    if name not in ENGINE_KINDS:
        raise ConfigError(f"unknown engine kind {name!r}; known: {', '.join(ENGINE_KINDS)}")
    return ENGINE_KINDS[name]


@dataclass
class Job:
    """A validated job; :meth:`build` makes its engine, :meth:`termination_for` the limits in force."""

    kind: str
    config: Any
    model: ModelIdentity
    requirements: Requirements | None = None
    termination: Termination | None = None
    task: Any = None
    """A :class:`sluice.tasks.Task` object given in Python (:func:`sluice.run_task`), instead of ``[task]``."""

    def build(self) -> Engine:
        """The engine this job trains (not started)."""
        return engine_kind(self.kind).build(self.config, self.task)

    def termination_for(self, engine: Engine) -> Termination:
        """The termination parameters in force: the job's, with the engine's own iteration limit
        (``train.rounds``, ``train.iterations``, ``train.steps``...) when the job gives none."""
        t = self.termination or Termination()
        if t.iterations is None:
            default = getattr(engine, "default_iterations", None)
            if default is not None:
                t = t.model_copy(update={"iterations": int(default)})
        return t

    def dump(self) -> dict[str, Any]:
        """The resolved job as one document (what ``config.toml`` of a run holds), naming its engine kind
        in a top-level ``engine`` key."""
        out = {"engine": self.kind, **self.config.model_dump()}
        out["model"] = {**out.get("model", {}), **self.model.model_dump()}
        for name in ("requirements", "termination"):
            part = getattr(self, name)
            if part is not None:
                out[name] = part.model_dump(exclude_none=True)
        return out


def scenario_model_type(config: Any) -> str | None:
    """The model type (``MDAType``) of the scenario an engine configuration trains on (None: no scenario)."""
    from sluice.data import scenarios

    dataset = getattr(getattr(config, "data", None), "dataset", None)
    if dataset not in scenarios.SCENARIO_NAMES:
        return None
    return normalise_model_type(scenarios.get_spec(dataset).model_type)


def job_from_dict(kind: str, raw: dict[str, Any]) -> Job:
    """Split ``raw`` into engine configuration, identity, requirements and termination, validate each and
    report every bad field of every part at once."""
    spec = engine_kind(kind)
    raw = dict(raw)
    named = raw.pop("engine", kind)
    if named != kind:
        raise ConfigError(f"engine = {named!r} in this configuration, but it is read as a {kind!r} job; "
                          f"use the command for {named!r} or remove the engine key")
    model_section = dict(raw.get("model") or {})
    identity = {k: model_section.pop(k) for k in IDENTITY_KEYS if k in model_section}
    if "model" in raw:
        raw["model"] = model_section
    parts: dict[str, Any] = {
        "requirements": raw.pop("requirements", None),
        "termination": raw.pop("termination", None),
    }
    errors: list[str] = []
    config = None
    try:
        config = validate(spec.config_model(), raw)
    except ConfigError as exc:
        errors.append(str(exc).removeprefix("invalid configuration:\n  "))
    checked: dict[str, Any] = {}
    for name, model in (("requirements", Requirements), ("termination", Termination)):
        if parts[name] is None:
            checked[name] = None
            continue
        try:
            checked[name] = validate(model, parts[name])
        except ConfigError as exc:
            lines = str(exc).split("\n  ")[1:]
            errors.extend(f"{name}.{line}" for line in lines)
    try:
        identity_model = parse_model(identity) if identity else None
    except ConfigError as exc:
        errors.extend(f"model.{line}" for line in str(exc).split("\n  ")[1:])
        identity_model = None
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(errors))
    if identity_model is None or "id" not in identity:
        base = identity_model or ModelIdentity()
        identity_model = base.model_copy(update={"id": spec.default_model_id(config)})
    trained = scenario_model_type(config)
    if trained is not None:
        if identity_model.type is None:
            identity_model = identity_model.model_copy(update={"type": trained})
        elif identity_model.type != trained:
            raise ConfigError(f"invalid configuration:\n  model.type: {identity_model.type} is not what scenario "
                              f"{config.data.dataset!r} trains ({trained}); leave model.type out or set it to that")
    return Job(kind, config, identity_model, checked["requirements"], checked["termination"])


def load_job(kind: str, path: str | Path | None = None, overrides: list[str] | None = None) -> Job:
    """The job of a TOML file (the built-in default when ``path`` is None) with ``--set`` overrides."""
    return job_from_dict(kind, read_toml(path, overrides))
