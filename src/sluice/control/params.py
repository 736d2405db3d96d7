"""What a consumer can ask for: model identity, training requirements (R1) and termination parameters (T1).

Names follow 3GPP TS 28.105 where it has them (``mLModelId``, ``performanceRequirements``,
``ModelPerformance``); the rest (layers, data amount bounds, error threshold, iteration count, resource
thresholds) are Sluice extensions, carried in a ``VsDataContainer`` when exported.

Criteria may name any metric (``accuracy``, ``f1``, ``auc`` and ``loss`` are aliases of ``test_*``); the
metrics an engine reports, whether higher or lower is better and the range of each are the engine's own
declaration (:class:`sluice.metrics.MetricSpec`), checked when a training process is built for it.

Every criterion compares one observed value ``v`` with a threshold ``θ`` after each iteration:

* a metric to *maximise* (accuracy, precision, recall, F1, AUC) holds when ``v ≥ θ + min_delta``;
* a metric to *minimise* (losses, errors) holds when ``v ≤ θ − min_delta``;
* a resource holds when ``v ≥ θ + min_delta``;
* a plateau holds at an iteration where ``v`` did not improve on its best so far by more than ``min_delta``.

A criterion is only checked after ``warmup`` iterations and fires once it has held on ``patience``
consecutive checks. Criteria listed directly in :class:`Termination` are combined with OR (training stops
as soon as any one fires, the seed's rule); each entry of ``all_of`` is an AND group that fires when all of
its criteria are satisfied at the same iteration. OR of AND groups expresses any monotone combination.
Non-finite metrics and divergence are *anomalies* (cause ``DIVERGED``), never criteria.

Performance targets and the training error threshold name a *result*; iterations, training time,
resources and plateau are *budgets*. Which kind fired decides the cause of the report (see
:mod:`sluice.control.process`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field, StrictFloat, StrictInt, ValidationError, field_validator, model_validator

from sluice.config import merge_patch
from sluice.errors import ConfigError
from sluice.metrics import KNOWN, MetricSpec, canonical
from sluice.schema import Section

Mode = Literal["min", "max"]

# ----------------------------------------------------------------------------------------------- metrics

def resolve_metric(name: str) -> str:
    """Canonical name of metric ``name`` (an alias such as ``accuracy`` becomes ``test_accuracy``).

    Any name of letters, digits and ``_`` is accepted here; whether an engine reports it is checked when a
    training process is built for that engine (:func:`sluice.control.monitor.check_criteria`).
    """
    if not isinstance(name, str) or not name or not name.replace("_", "").isalnum():
        raise ValueError(f"metric names are letters, digits and '_', got {name!r}")
    return canonical(name)


def spec_of(name: str, specs: Mapping[str, MetricSpec] | None = None) -> MetricSpec:
    """The :class:`MetricSpec` of ``name`` in ``specs`` (an engine's declared metrics; default: the metrics
    Sluice's engines report)."""
    table = KNOWN if specs is None else specs
    spec = table.get(name)
    if spec is None:
        raise ConfigError(f"unknown metric {name!r}; the metrics reported are {', '.join(sorted(table))}")
    return spec


# ------------------------------------------------------------------------------------------ model types


class ModelType(StrEnum):
    """The twelve application scenarios of SPEC T3."""

    COVERAGE_PROBLEM_ANALYSIS = "coverage_problem_analysis"
    SLICE_COVERAGE_ANALYSIS = "slice_coverage_analysis"
    PAGING_OPTIMIZATION = "paging_optimization"
    FAULT_ANALYSIS = "fault_analysis"
    FAULT_PREDICTION = "fault_prediction"
    E2E_LATENCY_ANALYSIS = "e2e_latency_analysis"
    ENERGY_SAVING_ANALYSIS = "energy_saving_analysis"
    MOBILITY_ANALYSIS = "mobility_analysis"
    NETWORK_SLICE_LOAD_ANALYSIS = "network_slice_load_analysis"
    NETWORK_SLICE_THROUGHPUT_ANALYSIS = "network_slice_throughput_analysis"
    KPI_ANOMALY_ANALYSIS = "kpi_anomaly_analysis"
    RAN_SOFTWARE_UPGRADE_ANALYSIS = "ran_software_upgrade_analysis"


VENDOR_PREFIX = "VS_"

#: TS 28.104 ``MDAType`` of each model type; the three without a standard value get a vendor string.
MDA_TYPE: dict[ModelType, str] = {
    ModelType.COVERAGE_PROBLEM_ANALYSIS: "COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS",
    ModelType.SLICE_COVERAGE_ANALYSIS: "VS_SLICE_COVERAGE_ANALYSIS",
    ModelType.PAGING_OPTIMIZATION: "COVERAGE_ANALYTICS_PAGING_OPTIMIZATION",
    ModelType.FAULT_ANALYSIS: "VS_FAULT_ANALYSIS",
    ModelType.FAULT_PREDICTION: "MDA_ASSISTED_FAULT_MANAGEMENT_FAILURE_PREDICTION",
    ModelType.E2E_LATENCY_ANALYSIS: "SLS_ANALYSIS_E2E_LATENCY_ANALYSIS",
    ModelType.ENERGY_SAVING_ANALYSIS: "MDA_ASSISTED_ENERGY_SAVING_ENERGY_SAVING_ANALYSIS",
    ModelType.MOBILITY_ANALYSIS: "MOBILITY_MANAGEMENT_ANALYTICS_MOBILITY_PERFORMANCE_ANALYSIS",
    ModelType.NETWORK_SLICE_LOAD_ANALYSIS: "SLS_ANALYSIS_NETWORK_SLICE_LOAD_ANALYSIS",
    ModelType.NETWORK_SLICE_THROUGHPUT_ANALYSIS: "SLS_ANALYSIS_NETWORK_SLICE_THROUGHPUT_ANALYSIS",
    ModelType.KPI_ANOMALY_ANALYSIS: "VS_KPI_ANOMALY_ANALYSIS",
    ModelType.RAN_SOFTWARE_UPGRADE_ANALYSIS: "MAINTENANCE_SOFTWARE_UPGRADE_VALIDATION_ANALYTICS",
}
_BY_MDA = {v: k for k, v in MDA_TYPE.items()}

#: SPEC T3's own wording of the types it names without "analysis" ("energy saving", "KPI anomaly"...).
T3_NAMES: dict[str, ModelType] = {
    "slice_coverage": ModelType.SLICE_COVERAGE_ANALYSIS,
    "paging_optimisation": ModelType.PAGING_OPTIMIZATION,
    "end_to_end_latency": ModelType.E2E_LATENCY_ANALYSIS,
    "energy_saving": ModelType.ENERGY_SAVING_ANALYSIS,
    "mobility": ModelType.MOBILITY_ANALYSIS,
    "network_slice_load": ModelType.NETWORK_SLICE_LOAD_ANALYSIS,
    "network_slice_throughput": ModelType.NETWORK_SLICE_THROUGHPUT_ANALYSIS,
    "kpi_anomaly": ModelType.KPI_ANOMALY_ANALYSIS,
    "ran_software_upgrade": ModelType.RAN_SOFTWARE_UPGRADE_ANALYSIS,
}

#: Every ``MDAType`` value of TS 28.104 (Rel-19); any of them is accepted as a model type.
MDA_TYPES = frozenset({
    "COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS", "COVERAGE_ANALYTICS_PAGING_OPTIMIZATION",
    "SLS_ANALYSIS_SERVICE_EXPERIENCE_ANALYSIS", "SLS_ANALYSIS_NETWORK_SLICE_THROUGHPUT_ANALYSIS",
    "SLS_ANALYSIS_NETWORK_SLICE_TRAFFIC_ANALYSIS", "SLS_ANALYSIS_E2E_LATENCY_ANALYSIS",
    "SLS_ANALYSIS_NETWORK_SLICE_LOAD_ANALYSIS", "UE_THROUGHPUT_ANALYSIS_TRAFFIC_CONGESTION_PROBLEM_ANALYSIS",
    "SLS_ANALYSIS_EDGE_APPLICATION_DEPLOYMENT_LOCATION_ANALYSIS",
    "SLS_ANALYSIS_EDGE_COMPUTING_PERFORMANCE_ANALYSIS",
    "SLS_ANALYSIS_TRAFFIC_CONGESTION_PREDICTION_ANALYSIS", "MDA_ASSISTED_FAULT_MANAGEMENT_FAILURE_PREDICTION",
    "MDA_ASSISTED_ENERGY_SAVING_ENERGY_SAVING_ANALYSIS",
    "MOBILITY_MANAGEMENT_ANALYTICS_MOBILITY_PERFORMANCE_ANALYSIS",
    "MOBILITY_MANAGEMENT_ANALYTICS_HANDOVER_OPTIMIZATION", "MAINTENANCE_MAINTENANCE_ANALYTICS",
    "MAINTENANCE_SOFTWARE_UPGRADE_VALIDATION_ANALYTICS",
    "RESOURCE_ANALYTICS_VIRTUALIZED_RESOURCE_UTILIZATION_ANALYSIS_NF",
    "RESOURCE_ANALYTICS_PHYSICAL_RESOURCE_UTILIZATION_ANALYSIS_NF",
    "RESOURCE_ANALYTICS_5GC_CONTROL_PLANE_CONGESTION_ANALYSIS", "PREDICTIONS_PM_DATA",
    "ATSSS_PERFORMANCE_TRAFFIC_STEERING_ANALYTICS", "CORRELATION_ANALYTICS_TRAINING_DATA_ANALYSIS",
    "CORRELATION_ANALYTICS_NF_SCALING_DIMENSIONING_DATA_ANALYSIS",
})

#: Default training-error metric per model type (T4); other types use ``train_loss``.
ERROR_METRIC: dict[ModelType, str] = {
    ModelType.COVERAGE_PROBLEM_ANALYSIS: "coverage_error",
    ModelType.ENERGY_SAVING_ANALYSIS: "energy_error",
}


def normalise_model_type(value: str) -> str:
    """Canonical type string: the ``MDAType`` of a Sluice model type name (or of its SPEC T3 wording,
    :data:`T3_NAMES`), an ``MDAType`` as given, or a vendor string ``VS_<NAME>`` (upper case letters,
    digits, ``_``)."""
    text = value.strip()
    low = text.lower().replace("-", "_").replace(" ", "_")
    if low in ModelType._value2member_map_:
        return MDA_TYPE[ModelType(low)]
    if low in T3_NAMES:
        return MDA_TYPE[T3_NAMES[low]]
    if text in MDA_TYPES or text in _BY_MDA:
        return text
    vendor_ok = text.replace("_", "").isalnum() and text.isupper()
    if text.startswith(VENDOR_PREFIX) and len(text) > len(VENDOR_PREFIX) and vendor_ok:
        return text
    raise ValueError(
        f"unknown model type {value!r}; use one of {', '.join(m.value for m in ModelType)}, "
        "a TS 28.104 MDAType name, or a vendor string VS_<NAME>"
    )


class ModelIdentity(Section):
    """Which model a request is about (3GPP ``MLModel``: ``mLModelId``, ``mLModelVersion``; type as
    ``MDAType``)."""

    id: str = Field("model", min_length=1, max_length=200, description="mLModelId")
    version: str = Field("1", min_length=1, max_length=50, description="mLModelVersion")
    type: str | None = Field(None, description="Sluice model type, TS 28.104 MDAType, or VS_<NAME>")

    @field_validator("id", "version", mode="before")
    @classmethod
    def _integer_text(cls, v: Any) -> Any:
        """An integer (``version = 7`` in TOML) stands for its decimal text."""
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("type")
    @classmethod
    def _type(cls, v: str | None) -> str | None:
        return None if v is None else normalise_model_type(v)

    @property
    def model_type(self) -> ModelType | None:
        """The SPEC T3 model type, when the type is one of the twelve."""
        return _BY_MDA.get(self.type) if self.type else None

    def next_version(self) -> ModelIdentity:
        """The same model one version later (``"3"`` → ``"4"``; ``"v2"`` → ``"v2.1"``)."""
        v = self.version
        nv = str(int(v) + 1) if v.isdigit() else f"{v}.1"
        return self.model_copy(update={"version": nv})


# ----------------------------------------------------------------------------------------------- criteria


class Criterion(Section):
    """A threshold criterion. A bare number in TOML (``test_accuracy = 0.9``) means ``threshold``."""

    threshold: StrictFloat
    min_delta: StrictFloat = Field(0.0, ge=0, description="margin by which the threshold must be passed")
    patience: StrictInt = Field(1, ge=1, description="consecutive checks the condition must hold")
    warmup: StrictInt = Field(0, ge=0, description="iterations before the criterion is checked at all")

    @model_validator(mode="before")
    @classmethod
    def _bare(cls, data: Any) -> Any:
        if isinstance(data, bool):
            raise ValueError(f"a criterion is a threshold number or a table, not {str(data).lower()}")
        if isinstance(data, int | float):
            return {"threshold": data}
        return data

    @field_validator("threshold", "min_delta")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v}")
        return v


class Plateau(Section):
    """No improvement larger than ``min_delta`` over the best value so far on ``patience`` consecutive
    checks (Lightning's EarlyStopping)."""

    min_delta: StrictFloat = Field(0.0, ge=0)
    patience: StrictInt = Field(5, ge=1)
    warmup: StrictInt = Field(0, ge=0)


class Resources(Section):
    """Resource status thresholds; each holds when the sampled value reaches it (``v ≥ θ``).

    ``cpu_percent``: CPU time of the training process tree over the last sampling interval, as a percent
    of the whole machine (0–100). ``memory_percent``/``memory_bytes``: resident memory of the tree.
    ``storage_bytes``: bytes the tree wrote to storage since training started. ``network_bytes``:
    bytes the engine put on the wire (up + down) since training started.
    """

    cpu_percent: Criterion | None = None
    memory_percent: Criterion | None = None
    memory_bytes: Criterion | None = None
    storage_bytes: Criterion | None = None
    network_bytes: Criterion | None = None

    @model_validator(mode="after")
    def _ranges(self) -> Resources:
        for name in ("cpu_percent", "memory_percent"):
            c = getattr(self, name)
            if c is not None and not 0 < c.threshold <= 100:
                raise ValueError(f"{name} threshold must be in (0, 100], got {c.threshold}")
        for name in ("memory_bytes", "storage_bytes", "network_bytes"):
            c = getattr(self, name)
            if c is not None and c.threshold <= 0:
                raise ValueError(f"{name} threshold must be > 0, got {c.threshold}")
        return self

    def items(self) -> list[tuple[str, Criterion]]:
        return [(n, c) for n in type(self).model_fields if (c := getattr(self, n)) is not None]


def _metric_dict(v: dict[str, Any], what: str) -> dict[str, Any]:
    """``v`` keyed by canonical metric names; ranges are checked against the engine's specs later."""
    out: dict[str, Any] = {}
    for name, spec in v.items():
        canon = resolve_metric(name)
        if canon in out:
            raise ValueError(f"{what}: metric {canon!r} given twice (aliases count as the same metric)")
        if isinstance(spec, float) and not math.isfinite(spec):
            raise ValueError(f"{what} for {canon} must be a finite number, got {spec}")
        out[canon] = spec
    return out


class CriteriaSet(Section):
    """Termination criteria (T1). Directly in :class:`Termination` they are OR-ed; in an ``all_of`` group
    they are AND-ed (then ``iterations`` and ``training_time_s`` mean "at least")."""

    training_error: Criterion | None = Field(None, description="stop when the training error ≤ threshold")
    error_metric: str | None = Field(
        None, description="metric that is the training error (default: by model type, else train_loss)"
    )
    iterations: StrictInt | None = Field(None, ge=1, description="stop when this many iterations are done")
    training_time_s: StrictFloat | None = Field(None, gt=0, description="stop when training took this long")
    resources: Resources = Field(default_factory=Resources)
    performance: dict[str, Criterion] = Field(
        default_factory=dict, description="target performance per metric (≥ for accuracy-like metrics)"
    )
    plateau: dict[str, Plateau] = Field(default_factory=dict, description="stop when a metric stalls")

    @field_validator("error_metric")
    @classmethod
    def _error_metric(cls, v: str | None) -> str | None:
        return None if v is None else resolve_metric(v)

    @field_validator("performance", mode="after")
    @classmethod
    def _performance(cls, v: dict[str, Criterion]) -> dict[str, Criterion]:
        return _metric_dict(v, "performance target")

    @field_validator("plateau", mode="after")
    @classmethod
    def _plateau(cls, v: dict[str, Plateau]) -> dict[str, Plateau]:
        return _metric_dict(v, "plateau")

    @model_validator(mode="after")
    def _error(self) -> CriteriaSet:
        if self.training_error is not None and self.training_error.threshold < 0:
            raise ValueError(f"training_error threshold must be ≥ 0, got {self.training_error.threshold}")
        return self

    def has_result_criteria(self) -> bool:
        """Whether a criterion names a *result* to reach (a performance target or a training error
        threshold). Iterations, training time, resources and plateau are budgets: they end training
        whether or not a result was reached."""
        return bool(self.performance or self.training_error is not None)

    def is_empty(self) -> bool:
        return (
            self.training_error is None and self.iterations is None and self.training_time_s is None
            and not self.resources.items() and not self.performance and not self.plateau
        )


class CriteriaGroup(CriteriaSet):
    """An AND group: fires when every criterion in it is satisfied at the same iteration."""

    name: str | None = Field(None, description="name used in reports (default all_of[i])")

    @model_validator(mode="after")
    def _nonempty(self) -> CriteriaGroup:
        if self.is_empty():
            raise ValueError("an all_of group needs at least one criterion")
        return self


class Termination(CriteriaSet):
    """Termination parameters (T1) plus anomaly checks and the inadequate-data wait (T6)."""

    all_of: list[CriteriaGroup] = Field(default_factory=list)
    check_finite: bool = Field(True, description="a NaN/inf metric is the anomaly DIVERGED")
    divergence: dict[str, StrictFloat] = Field(
        default_factory=dict,
        description="metric → bound; passing it in the bad direction is the anomaly DIVERGED",
    )
    divergence_factor: StrictFloat = Field(
        10.0, description="a loss (metric named *_loss) above this many times its value for the untrained "
        "model (when the engine can evaluate it) is the anomaly DIVERGED; 0 turns the check off",
    )
    data_wait_s: StrictFloat = Field(
        0.0, ge=0, description="how long to wait for more data (AWAITING_DATA) before giving up"
    )

    @field_validator("divergence_factor")
    @classmethod
    def _factor(cls, v: float) -> float:
        if v != 0 and not (v > 1 and math.isfinite(v)):
            raise ValueError(f"must be a finite number > 1, or 0 to turn the check off; got {v}")
        return v

    @field_validator("divergence", mode="after")
    @classmethod
    def _divergence(cls, v: dict[str, float]) -> dict[str, float]:
        out = {}
        for name, bound in v.items():
            if not math.isfinite(bound):
                raise ValueError(f"divergence bound for {name} must be finite, got {bound}")
            out[resolve_metric(name)] = bound
        return out

    def defines_result(self) -> bool:
        """A result criterion at the top level or in any all_of group."""
        return self.has_result_criteria() or any(g.has_result_criteria() for g in self.all_of)

    def has_criteria(self) -> bool:
        return not self.is_empty() or bool(self.all_of)

    def merged(self, other: dict[str, Any]) -> Termination:
        """A copy with ``other`` merged in (JSON merge patch semantics: ``None`` deletes a key)."""
        return parse_termination(merge_patch(self.model_dump(exclude_none=True), other))


class Requirements(Section):
    """Training requirement information (R1), ``performanceRequirements`` in TS 28.105."""

    layers: StrictInt | None = Field(None, ge=1, description="number of (last) layers to train; others frozen")
    max_training_time_s: StrictFloat | None = Field(None, gt=0, description="maximum training time")
    data_amount: StrictInt | None = Field(None, ge=1, description="training samples to use")
    min_data_amount: StrictInt | None = Field(None, ge=1, description="fewest training samples acceptable")
    max_data_amount: StrictInt | None = Field(None, ge=1, description="most training samples to use")
    performance: dict[str, StrictFloat] = Field(
        default_factory=dict, description="performance threshold per metric the trained model must meet"
    )
    stop_when_met: bool | None = Field(
        None,
        description="stop as soon as every performance threshold is met (an all_of group); None: only when "
        "the termination parameters set no result of their own (performance, training error)",
    )

    @field_validator("performance", mode="after")
    @classmethod
    def _performance(cls, v: dict[str, float]) -> dict[str, float]:
        return _metric_dict(v, "performance requirement")

    @model_validator(mode="after")
    def _bounds(self) -> Requirements:
        lo, hi, n = self.min_data_amount, self.max_data_amount, self.data_amount
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min_data_amount ({lo}) must not exceed max_data_amount ({hi})")
        if n is not None and lo is not None and n < lo:
            raise ValueError(f"data_amount ({n}) is below min_data_amount ({lo})")
        if n is not None and hi is not None and n > hi:
            raise ValueError(f"data_amount ({n}) is above max_data_amount ({hi})")
        return self

    def met_by(self, metrics: Mapping[str, float], specs: Mapping[str, MetricSpec] | None = None) -> bool | None:
        """Whether ``metrics`` meet every performance threshold (None when there is none); ``specs`` (the
        engine's declared metrics) say whether higher or lower is better."""
        if not self.performance:
            return None
        for name, thr in self.performance.items():
            v = metrics.get(name)
            if v is None or not math.isfinite(v):
                return False
            if (v < thr) if spec_of(name, specs).higher_is_better else (v > thr):
                return False
        return True


# ------------------------------------------------------------------------------------------------ helpers


def _parse(model: type[Section], data: Any, what: str) -> Any:
    if isinstance(data, model):
        return data
    try:
        return model.model_validate(data or {})
    except ValidationError as exc:
        from sluice.config import format_validation_error

        msg = format_validation_error(exc).replace("invalid configuration", f"invalid {what}")
        raise ConfigError(msg) from exc


def parse_termination(data: Any) -> Termination:
    """Validate termination parameters from a dict (TOML/JSON); :class:`ConfigError` says what is wrong."""
    return _parse(Termination, data, "termination parameters")


def parse_requirements(data: Any) -> Requirements:
    """Validate requirement information from a dict; :class:`ConfigError` says what is wrong."""
    return _parse(Requirements, data, "training requirements")


def parse_model(data: Any) -> ModelIdentity:
    """Validate a model identity from a dict; :class:`ConfigError` says what is wrong."""
    return _parse(ModelIdentity, data, "model identity")


class Cause(StrEnum):
    """Why training ended (T5, R2). Only ``CRITERION_MET`` is success: a result was reached, or the
    parameters named no result and their budget ran out. ``BUDGET_EXHAUSTED``: a budget ended training
    before the result the termination parameters ask for. See :mod:`sluice.control.process`."""

    CRITERION_MET = "CRITERION_MET"
    BUDGET_EXHAUSTED = "BUDGET_EXHAUSTED"
    INADEQUATE_TRAINING_DATA = "INADEQUATE_TRAINING_DATA"
    INSUFFICIENT_COMPUTE = "INSUFFICIENT_COMPUTE"
    INSUFFICIENT_TRAINING_SAMPLES = "INSUFFICIENT_TRAINING_SAMPLES"
    PERFORMANCE_NOT_MET = "PERFORMANCE_NOT_MET"
    CANCELLED = "CANCELLED"
    DIVERGED = "DIVERGED"
    ENGINE_FAILURE = "ENGINE_FAILURE"


class ProcessState(StrEnum):
    """State of a training process (TS 28.105 ``ProcessMonitor.status`` plus ``AWAITING_DATA``)."""

    NOT_STARTED = "NOT_STARTED"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    AWAITING_DATA = "AWAITING_DATA"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
