"""The termination report (T5) and failure cause (R2): why training ended and where it stands.

:class:`TrainingReport` is the seed's "first message": the cause (a criterion met, naming it, or an
anomaly / failure), the model identity, every performance metric, duration, iterations, progress and the
estimated remaining duration and iterations, plus the trained model's path when one exists.
:meth:`TrainingReport.to_3gpp` renders it as a TS 28.105 ``MLTrainingReport`` with the Sluice-specific
fields in a ``VsDataContainer``.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field

from sluice.control.monitor import Firing
from sluice.control.params import Cause, ModelIdentity, ProcessState


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
    estimate_note: str = ""
    model_path: str | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    resources_peak: dict[str, float] = Field(default_factory=dict)
    awaited_data: int = Field(0, description="times training waited for more data (AWAITING_DATA)")

    @property
    def ok(self) -> bool:
        """True when a trained model that satisfies the request exists."""
        return self.cause == Cause.CRITERION_MET

    @property
    def fired(self) -> str | None:
        """Name of the rule that stopped training, if any."""
        return self.criterion.rule if self.criterion else None

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (non-finite floats become null)."""
        return _finite(self.model_dump(mode="json"))

    def to_3gpp(self) -> dict[str, Any]:
        """A TS 28.105 ``MLTrainingReport`` (attributes) with Sluice extensions in ``vsDataContainer``."""
        perf = [
            {"performanceMetric": k, "performanceScore": v}
            for k, v in self.performance.items()
            if math.isfinite(v)
        ]
        ext = self.to_json()
        for k in ("performance", "model"):
            ext.pop(k, None)
        return {
            "mLModelGeneratedRef": self.model_path,
            "modelPerformanceTraining": [p for p in perf if p["performanceMetric"].startswith("train")],
            "modelPerformanceValidation": [p for p in perf if not p["performanceMetric"].startswith("train")],
            "mLModel": self.model.to_3gpp(),
            "progressStatus": {
                "status": self.status.value,
                "progressPercentage": None if self.progress_percent is None else round(self.progress_percent),
                "progressStateInfo": "TRAINING" if self.status == ProcessState.RUNNING else self.status.value,
                "resultStateInfo": self.cause.value,
            },
            "vsDataContainer": {
                "vsDataType": "sluice.TrainingReport",
                "vsDataFormatVersion": "1",
                "vsData": ext,
            },
        }

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
        rows += [
            ("iterations", str(self.iterations)),
            ("duration", num(self.duration_s, ".2f", " s")),
            ("progress", num(self.progress_percent, ".1f", " %")),
            ("est. remaining iterations", num(self.estimated_remaining_iterations, "d")),
            ("est. remaining time", num(self.estimated_remaining_s, ".1f", " s")),
        ]
        if self.estimate_note:
            rows.append(("estimate", self.estimate_note))
        if self.bytes_up or self.bytes_down:
            rows.append(("bytes up / down", f"{self.bytes_up:,} / {self.bytes_down:,}"))
        for k, v in sorted(self.resources_peak.items()):
            rows.append((f"peak {k}", num(v, ".4g")))
        rows.append(("model path", self.model_path or "none"))
        return rows


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj
