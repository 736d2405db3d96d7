"""The termination report (T5) and failure cause (R2): why training ended and where it stands.

:class:`TrainingReport` is the seed's "first message": the cause (a criterion met, naming it, or an
anomaly / failure), the model identity, every performance metric, duration, iterations, progress and the
estimated remaining duration and iterations, plus the trained model's path when one exists, the
termination parameters and requirements in force when training ended and, for a federated engine, each
client's part (:class:`~sluice.control.clients.ClientReport`: rounds taken part in and dropped, samples,
training time, last performance).

Success is ``CRITERION_MET`` only (:attr:`TrainingReport.ok`); a command exits with the status of
:data:`EXIT_CODES` for the cause of its report.
:func:`sluice.roles.threegpp.training_report` renders it as a TS 28.105 ``MLTrainingReport``.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field, field_serializer

from sluice.control.clients import ClientReport
from sluice.control.monitor import Firing
from sluice.control.params import Cause, ModelIdentity, ProcessState, Requirements, Termination

EXIT_CODES: dict[Cause, int] = {
    Cause.CRITERION_MET: 0,
    Cause.BUDGET_EXHAUSTED: 3,
    Cause.PERFORMANCE_NOT_MET: 4,
    Cause.INADEQUATE_TRAINING_DATA: 5,
    Cause.INSUFFICIENT_TRAINING_SAMPLES: 6,
    Cause.INSUFFICIENT_COMPUTE: 7,
    Cause.DIVERGED: 8,
    Cause.ENGINE_FAILURE: 9,
    Cause.CANCELLED: 130,
}
"""Exit status of a command whose training ended with each cause (2 is a usage or configuration error)."""


class TrainingReport(BaseModel):
    """Outcome of one training process."""

    cause: Cause
    status: ProcessState
    criterion: Firing | None = Field(None, description="the rule that fired (cause CRITERION_MET etc.)")
    detail: str = ""
    model: ModelIdentity = Field(default_factory=ModelIdentity)
    performance: dict[str, float] = Field(default_factory=dict, description="metrics of the last iteration")
    requirements_met: bool | None = None
    duration_s: float = 0.0
    iterations: int = 0
    progress_percent: float | None = None
    estimated_remaining_s: float | None = None
    estimated_remaining_iterations: int | None = None
    estimated_remaining_iterations_low: int | None = Field(None, description="80 % interval of the iterations the "
                                                          "target still needs: low end")
    estimated_remaining_iterations_high: int | None = Field(None, description="… high end (None: beyond the "
                                                           "horizon the estimate looked at)")
    reach_probability: float | None = Field(None, description="probability of meeting the target within the "
                                            "estimate's horizon")
    estimated_remaining_s_low: float | None = Field(None, description="80 % interval of the seconds the target "
                                                    "still needs, from the measured seconds per iteration: low end")
    estimated_remaining_s_high: float | None = Field(None, description="… high end (None: beyond the horizon)")
    estimate_note: str = ""
    model_path: str | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    resources_peak: dict[str, float] = Field(default_factory=dict)
    awaited_data: int = Field(0, description="times training waited for more data (AWAITING_DATA)")
    data_refused: list[str] = Field(default_factory=list, description="data the engine refused, and why")
    clients: list[ClientReport] = Field(default_factory=list, description="per client of a federated engine: "
                                        "its part in training (:mod:`sluice.control.clients`)")
    data: dict[str, Any] = Field(default_factory=dict, description="what the engine says of the rows it trained "
                                 "on (split training: aligned_samples and each party's table_rows)")
    notes: list[str] = Field(default_factory=list, description="what the engine chose for the task (settings "
                             "fitted to it) or noticed while training (a stall), in the order it said it")
    termination: Termination | None = Field(None, description="the termination parameters in force")
    requirements: Requirements | None = Field(None, description="the training requirements in force")

    @field_serializer("termination", "requirements")
    def _parameters(self, v: Termination | Requirements | None) -> dict[str, Any] | None:
        return None if v is None else v.model_dump(mode="json", exclude_none=True)

    @property
    def ok(self) -> bool:
        """True when a trained model that satisfies the request exists (cause ``CRITERION_MET``); a run
        whose budget ran out before its target (``BUDGET_EXHAUSTED``) is FINISHED but not ok."""
        return self.cause == Cause.CRITERION_MET

    @property
    def exit_code(self) -> int:
        """The command's exit status for this report: 0 only on success (see :data:`EXIT_CODES`)."""
        return EXIT_CODES[self.cause]

    @property
    def fired(self) -> str | None:
        """Name of the rule that stopped training, if any."""
        return self.criterion.rule if self.criterion else None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite floats become null)."""
        return json_ready(self.model_dump(mode="json"))

    def rows(self) -> list[tuple[str, str]]:
        """(field, value) pairs for printing as a table."""

        def num(v: float | None, fmt: str = ".4g", unit: str = "") -> str:
            return "n/a" if v is None else f"{v:{fmt}}{unit}"

        rows = [("cause", self.cause.value), ("status", self.status.value)]
        if self.criterion is not None:
            for h in self.criterion.hits:
                thr = "" if h.threshold is None else f" (threshold {h.threshold:g})"
                rows.append(("criterion", f"{h.name}: {num(h.observed)}{thr} at iteration {h.iteration}"))
        if self.detail:
            rows.append(("detail", self.detail))
        rows.append(("model", f"{self.model.id} v{self.model.version}" + (f" [{self.model.type}]"
                                                                          if self.model.type else "")))
        for k, v in sorted(self.performance.items()):
            rows.append((k, num(v)))
        if self.requirements_met is not None:
            rows.append(("requirements met", "yes" if self.requirements_met else "no"))
        if self.termination is not None:
            rows.append(("termination", brief(self.termination) or "none"))
        if self.requirements is not None:
            rows.append(("requirements", brief(self.requirements) or "none"))
        rows += [
            ("iterations", str(self.iterations)),
            ("duration", num(self.duration_s, ".2f", " s")),
            ("progress", num(self.progress_percent, ".1f", " %")),
            ("est. remaining iterations", _interval(self.estimated_remaining_iterations,
                                                    self.estimated_remaining_iterations_low,
                                                    self.estimated_remaining_iterations_high, "d", "")),
            ("est. remaining time", _interval(self.estimated_remaining_s, self.estimated_remaining_s_low,
                                              self.estimated_remaining_s_high, ".1f", " s")),
        ]
        rows += [(k, ", ".join(f"{n} {x:,}" for n, x in v.items()) if isinstance(v, dict) else f"{v:,}")
                 for k, v in self.data.items()]
        if self.estimate_note:
            rows.append(("estimate", self.estimate_note))
        rows += [("note", n) for n in self.notes]
        if self.bytes_up or self.bytes_down:
            rows.append(("bytes up / down", f"{self.bytes_up:,} / {self.bytes_down:,}"))
        for why in self.data_refused:
            rows.append(("data refused", why))
        for k, v in sorted(self.resources_peak.items()):
            rows.append((f"peak {k}", num(v, ".4g")))
        rows.append(("model path", self.model_path or "none"))
        return rows


def json_ready(obj: Any) -> Any:
    """``obj`` with every non-finite float (in nested dicts and lists) replaced by None."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_ready(v) for v in obj]
    return obj


def brief(section: BaseModel) -> str:
    """The values of ``section`` that differ from their defaults, as ``key=value`` pairs
    (``performance.test_accuracy=0.9; iterations=50``); a criterion given only by its threshold shows as
    the threshold."""
    pairs: list[str] = []

    def walk(prefix: str, v: Any) -> None:
        if isinstance(v, dict) and set(v) == {"threshold"}:
            v = v["threshold"]
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), x)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(f"{prefix}[{i}]", x)
        else:
            pairs.append(f"{prefix}={v:g}" if isinstance(v, float) else f"{prefix}={v}")

    walk("", section.model_dump(mode="json", exclude_none=True, exclude_defaults=True))
    return "; ".join(pairs)


def _interval(mid: float | None, low: float | None, high: float | None, fmt: str, unit: str) -> str:
    """``120 (80 %: 90–160)``, ``more than 90`` (open above, no point), ``0`` or ``-`` (none)."""
    if mid is None:
        return "-" if low is None else f"more than {format(low, fmt)}{unit}"
    if not mid or low is None:
        return f"{format(mid, fmt)}{unit}"
    return f"{format(mid, fmt)}{unit} (80 %: {format(low, fmt)}–{'…' if high is None else format(high, fmt)}{unit})"
