"""Typed models of the ``sluice-*`` vsData a consumer sends, validated once where they come in.

A request (``MLTrainingRequest``) carries ``sluice-job`` (an object: the engine and its sections, checked by the
job parser), ``sluice-requirements`` and ``sluice-termination`` (objects: checked by
:func:`~sluice.control.params.parse_requirements` / ``parse_termination``), ``sluice-negotiation``
(:class:`Negotiation`) and ``sluice-feedback`` (:class:`Feedback`); its 3GPP ``performanceRequirements`` are
:class:`PerformanceRequirement`. A shape that does not fit is a 400 naming the container, with the message
consumers have always had. The job the service makes of them is a :class:`StoredJob`, kept with the request
and read back typed.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from sluice.service.nrm import MnSError

DecidedBy = Literal["consumer", "producer", "negotiated"]
_OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


def _finite(v: float | int) -> float:
    if not math.isfinite(v):
        raise ValueError("not a finite number")
    return float(v)


class Negotiation(BaseModel):
    """``sluice-negotiation`` of a request: who decides the termination parameters (None: the default)."""

    model_config = ConfigDict(extra="allow")
    decidedBy: Any = None  # noqa: N815 - the vsData field name

    @field_validator("decidedBy")
    @classmethod
    def _known(cls, v: Any) -> Any:
        if v and v not in ("consumer", "producer", "negotiated"):
            raise ValueError(f"decidedBy must be consumer, producer or negotiated, got {v!r}")
        return v or None


class Feedback(BaseModel):
    """``sluice-feedback``: the value a metric of the model in use measured."""

    model_config = ConfigDict(extra="allow")
    metric: StrictStr
    value: StrictInt | StrictFloat

    @field_validator("value")
    @classmethod
    def _value(cls, v: float | int) -> float:
        return _finite(v)


class PerformanceRequirement(BaseModel):
    """One of the 3GPP ``performanceRequirements`` of a request (a threshold the job must reach)."""

    model_config = ConfigDict(extra="allow")
    performanceMetric: StrictStr  # noqa: N815
    performanceScore: StrictInt | StrictFloat  # noqa: N815

    @field_validator("performanceScore")
    @classmethod
    def _score(cls, v: float | int) -> float:
        return _finite(v)


class RequestVs(BaseModel):
    """What a request asks for, typed: its job document, requirements (with the 3GPP thresholds added),
    termination parameters and who decides them."""

    job: dict[str, Any]
    requirements: dict[str, Any]
    termination: dict[str, Any] | None
    decided_by: DecidedBy


class StoredJob(BaseModel):
    """A request's job as the service validated it (stored with the request as JSON, read back with
    :meth:`of`): the engine kind, its configuration and model identity, the parsed requirements and termination
    parameters, who decides them, the federation it trains on, and what its engine reports."""

    model_config = ConfigDict(extra="ignore")
    kind: str
    raw: dict[str, Any]
    model: dict[str, Any]
    requirements: dict[str, Any] | None = None
    termination: dict[str, Any] | None = None
    decided_by: DecidedBy
    federation: str | None = None
    reports: dict[str, Any] | None = None  # the engine's capabilities (sluice.service.capabilities)
    type_at: str | None = None  # where the request named the model type

    @classmethod
    def of(cls, stored: dict[str, Any]) -> StoredJob:
        return cls.model_validate(stored)

    def stored(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _object(vs: dict[str, Any], key: str, message: str) -> dict[str, Any] | None:
    value = vs.get(key)
    if value is None:
        return None
    try:
        return dict(_OBJECT.validate_python(value))
    except ValidationError as exc:
        raise MnSError(400, message, bad_attributes=[f"VsDataContainer/{key}"]) from exc


def negotiation(doc: Any) -> Negotiation:
    """``sluice-negotiation`` (None: empty); 400 when it is not an object or names an unknown decider."""
    try:
        return Negotiation.model_validate(doc or {})
    except ValidationError as exc:
        errors = exc.errors()
        msg = ("sluice-negotiation vsData must be an object" if errors[0]["type"] == "model_type"
               else str(errors[0]["ctx"]["error"]))
        raise MnSError(400, msg, bad_attributes=["VsDataContainer/sluice-negotiation"]) from exc


def feedback(doc: Any) -> Feedback:
    try:
        return Feedback.model_validate(doc)
    except ValidationError as exc:
        raise MnSError(400, "sluice-feedback is {metric: name, value: number}",
                       bad_attributes=["VsDataContainer/sluice-feedback"]) from exc


def performance_requirements(perf: Any) -> dict[str, float]:
    """The 3GPP ``performanceRequirements`` as ``{metric: threshold}``."""
    out: dict[str, float] = {}
    for i, p in enumerate(perf or []):
        try:
            req = PerformanceRequirement.model_validate(p)
        except ValidationError as exc:
            raise MnSError(400, f"performanceRequirements[{i}] needs performanceMetric (text) and "
                           "performanceScore (a number)", bad_attributes=["performanceRequirements"]) from exc
        out[req.performanceMetric] = float(req.performanceScore)
    return out


def request_vs(attrs: dict[str, Any], vs: dict[str, Any]) -> RequestVs:
    """A request's vsData and 3GPP attributes, typed; 400 naming what does not fit."""
    job = _object(vs, "sluice-job", "sluice-job vsData must be an object (a job: engine = ..., and its sections)")
    req = _object(vs, "sluice-requirements", "sluice-requirements vsData must be an object") or {}
    perf = performance_requirements(attrs.get("performanceRequirements"))
    if perf:
        req["performance"] = {**(req.get("performance") or {}), **perf} if isinstance(
            req.get("performance"), dict) else perf
    term = _object(vs, "sluice-termination", "sluice-termination vsData must be an object")
    decided = negotiation(vs.get("sluice-negotiation")).decidedBy or ("consumer" if term is not None else "producer")
    if decided == "consumer" and term is None:
        raise MnSError(400, "decidedBy consumer needs the termination parameters (sluice-termination)",
                       bad_attributes=["VsDataContainer/sluice-termination"])
    if decided != "consumer" and term is not None:
        raise MnSError(400, f"decidedBy {decided}: the producer sets the termination parameters; send none "
                       "(or decidedBy consumer)", bad_attributes=["VsDataContainer/sluice-termination"])
    return RequestVs(job=job or {}, requirements=req, termination=term, decided_by=decided)
