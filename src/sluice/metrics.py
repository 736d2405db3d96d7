"""Metrics: what an engine reports, whether higher or lower is better, and how each is computed.

Engines declare the metrics they report as :class:`MetricSpec` entries (name, direction, range); the
control plane accepts a termination target or requirement on a metric only when the engine declares it.

**Classification.** With the confusion matrix ``C`` (rows: true class, columns: predicted),
``precision_c = C_cc / Σ_r C_rc``, ``recall_c = C_cc / Σ_k C_ck`` and ``F1_c = 2·P·R / (P + R)`` (0 where
undefined); ``test_precision``, ``test_recall`` and ``test_f1`` are their means over the classes present in
the labels. ``test_auc`` is the ROC AUC (one-vs-rest for several classes).

**Regression.** ``test_mse = mean ‖ŷ − y‖²/k``, ``test_mae``, ``test_rmse = √test_mse``.

Type-specific training errors (T4): coverage problem analysis and energy saving.

**Coverage problem analysis.** In a region ``r`` with samples (users or grid bins) ``i ∈ r``, the
coverage-problem ratio for a signal ``s`` (RSRP, RSRQ or SINR) is the share of samples whose value is
below the problem threshold ``τ_s``::

    ρ_s(r) = |{i ∈ r : s_i < τ_s}| / |r|

(weak coverage / coverage hole for RSRP, poor quality for RSRQ, interference such as pilot pollution for
SINR). The training error for ``s`` is the mean absolute difference between the predicted and the real
ratio over the regions, ``E_s = (1/R) Σ_r |ρ̂_s(r) − ρ_s(r)|`` in [0, 1]; ``coverage_error`` is the mean
of ``E_s`` over the signals given. Default thresholds are the usual drive-test ones: RSRP −110 dBm,
RSRQ −15 dB, SINR 0 dB.

**Energy saving.** Energy efficiency is delivered traffic per energy, ``EE = bits / joules``. The error of
a predicted quantity ``q̂`` against the real ``q`` is the relative L1 error ``Σ|q̂ − q| / Σ|q|``
(``energy_efficiency_error``, ``energy_consumption_error``); ``energy_error`` is their mean when both are
given.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sluice.errors import DataError

if TYPE_CHECKING:
    import torch


# ------------------------------------------------------------------------------------------------ specs
OPERATIONAL_METRICS = frozenset({"participants", "dropped", "resynced", "nodes", "flower_bytes_up",
                                 "flower_bytes_down", "idle_leader_s"})
"""Metrics the engines report about the run (who took part, bytes, idle time), not about the model."""


@dataclass(frozen=True)
class MetricSpec:
    """A metric an engine reports: ``higher_is_better`` and the values it can take (None = unbounded)."""

    name: str
    higher_is_better: bool
    low: float | None = None
    high: float | None = None

    @property
    def mode(self) -> str:
        """``"max"`` when higher is better, else ``"min"``."""
        return "max" if self.higher_is_better else "min"

    def check_threshold(self, value: float, what: str) -> None:
        """ValueError unless ``value`` is finite and inside this metric's range."""
        if not math.isfinite(value):
            raise ValueError(f"{what} for {self.name} must be a finite number, got {value}")
        if self.low is not None and value < self.low or self.high is not None and value > self.high:
            rng = f"[{self.low}, {self.high if self.high is not None else 'inf'}]"
            raise ValueError(f"{what} for {self.name} must be in {rng}, got {value}")


def _score(name: str) -> MetricSpec:
    return MetricSpec(name, True, 0.0, 1.0)


def _error(name: str) -> MetricSpec:
    return MetricSpec(name, False, 0.0, None)


KNOWN: dict[str, MetricSpec] = {
    s.name: s
    for s in (
        *(_score(n) for n in ("test_accuracy", "test_precision", "test_recall", "test_f1", "test_auc",
                              "train_accuracy")),
        *(_error(n) for n in ("train_loss", "test_loss", "test_mse", "test_mae", "test_rmse")),
        *(_error(n) for n in ("coverage_error", "coverage_error_rsrp", "coverage_error_rsrq",
                              "coverage_error_sinr", "energy_error", "energy_efficiency_error",
                              "energy_consumption_error")),
    )
}
"""Metrics Sluice's engines report; an engine may declare others of its own."""

ALIASES = {"accuracy": "test_accuracy", "precision": "test_precision", "recall": "test_recall",
           "f1": "test_f1", "auc": "test_auc", "loss": "test_loss"}
"""Short names a consumer may use in criteria."""

CLASSIFICATION = ("test_loss", "test_accuracy", "test_precision", "test_recall", "test_f1")
REGRESSION = ("test_loss", "test_mse", "test_mae", "test_rmse")


def declare(names: Iterable[str], extra: Iterable[MetricSpec] = ()) -> dict[str, MetricSpec]:
    """The specs of ``names`` (from :data:`KNOWN`) plus ``extra`` specs, keyed by name."""
    out = {n: KNOWN[n] for n in names}
    out.update({s.name: s for s in extra})
    return out


def canonical(name: str) -> str:
    """``name`` with a short alias (``accuracy``, ``f1``...) replaced by the metric it stands for."""
    return ALIASES.get(name, name)


# ------------------------------------------------------------------------------------------ computation
def classification_metrics(logits: torch.Tensor, y: np.ndarray, num_classes: int, *,
                           auc: bool = False) -> dict[str, float]:
    """Cross-entropy, accuracy and macro precision / recall / F1 of ``logits`` (``n × num_classes``) for
    labels ``y``; with ``auc`` also ROC AUC (omitted when the labels do not allow it)."""
    import torch

    y = np.asarray(y, dtype=np.int64)
    loss = float(torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))) if len(y) else 0.0
    z = logits.detach().numpy()
    pred = z.argmax(1)
    conf = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(conf, (y, pred), 1)
    tp = np.diag(conf).astype(np.float64)
    col, row = conf.sum(0), conf.sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(col > 0, tp / np.maximum(col, 1), 0.0)
        recall = np.where(row > 0, tp / np.maximum(row, 1), 0.0)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    present = row > 0
    out = {
        "test_loss": loss,
        "test_accuracy": float(tp.sum() / max(len(y), 1)),
        "test_precision": float(precision[present].mean()) if present.any() else 0.0,
        "test_recall": float(recall[present].mean()) if present.any() else 0.0,
        "test_f1": float(f1[present].mean()) if present.any() else 0.0,
    }
    if auc:
        from sklearn.metrics import roc_auc_score

        p = torch.softmax(logits.double(), 1).numpy()
        try:
            if num_classes == 2:
                out["test_auc"] = float(roc_auc_score(y, p[:, 1]))
            elif len(np.unique(y)) == num_classes:
                out["test_auc"] = float(roc_auc_score(y, p, multi_class="ovr"))
        except ValueError:
            pass
    return out


def regression_metrics(pred: np.ndarray, target: np.ndarray) -> dict[str, float]:
    """Mean squared error (also ``test_loss``), mean absolute error and root mean squared error."""
    err = np.asarray(pred, dtype=np.float64) - np.asarray(target, dtype=np.float64).reshape(np.shape(pred))
    mse = float(np.mean(err**2))
    return {"test_loss": mse, "test_mse": mse, "test_mae": float(np.mean(np.abs(err))), "test_rmse": math.sqrt(mse)}


# ----------------------------------------------------------------------------- type-specific errors (T4)
SIGNALS = ("rsrp", "rsrq", "sinr")
THRESHOLDS = {"rsrp": -110.0, "rsrq": -15.0, "sinr": 0.0}


def _signal(signal: str) -> str:
    s = signal.lower()
    if s not in SIGNALS:
        raise DataError(f"signal must be one of {', '.join(SIGNALS)}, got {signal!r}")
    return s


def coverage_problem_ratio(
    values: np.ndarray, regions: np.ndarray, signal: str = "rsrp", threshold: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(region ids, ρ_s(r))``: per region, the share of samples with ``signal`` below the threshold."""
    s = _signal(signal)
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    reg = np.asarray(regions).reshape(-1)
    if v.shape != reg.shape:
        raise DataError(f"{v.size} {s} values but {reg.size} region ids; give one region per sample")
    tau = THRESHOLDS[s] if threshold is None else float(threshold)
    ids, inv = np.unique(reg, return_inverse=True)
    below = np.bincount(inv, weights=(v < tau).astype(np.float64), minlength=ids.size)
    count = np.bincount(inv, minlength=ids.size)
    return ids, below / count


def coverage_error(
    real: np.ndarray,
    predicted: np.ndarray,
    regions: np.ndarray | None = None,
    signal: str = "rsrp",
    threshold: float | None = None,
) -> float:
    """``E_s``: mean |predicted − real| coverage-problem ratio over regions.

    With ``regions``, ``real`` and ``predicted`` are per-sample signal values and the ratios are computed
    from them; without, they already are per-region ratios.
    """
    if regions is None:
        r = np.asarray(real, dtype=np.float64).reshape(-1)
        p = np.asarray(predicted, dtype=np.float64).reshape(-1)
        if r.shape != p.shape or r.size == 0:
            raise DataError(
                f"real and predicted ratios must have the same non-zero length, got {r.size}, {p.size}"
            )
        return float(np.mean(np.abs(p - r)))
    _, rr = coverage_problem_ratio(real, regions, signal, threshold)
    _, pr = coverage_problem_ratio(predicted, regions, signal, threshold)
    return float(np.mean(np.abs(pr - rr)))


def coverage_metrics(
    regions: np.ndarray, columns: dict[str, int] | Sequence[str] = SIGNALS,
    thresholds: dict[str, float] | None = None,
) -> dict[str, Callable[[np.ndarray, np.ndarray], float]]:
    """Metric functions ``f(prediction, target)`` for an engine that predicts per-sample signals.

    ``columns`` maps each signal to its output column (a sequence means columns 0, 1, ...). Returns
    ``coverage_error_<signal>`` for each and ``coverage_error`` (their mean).
    """
    cols = dict(columns) if isinstance(columns, dict) else {s: i for i, s in enumerate(columns)}
    cols = {_signal(s): i for s, i in cols.items()}
    th = thresholds or {}
    reg = np.asarray(regions)

    def one(s: str, i: int) -> Callable[[np.ndarray, np.ndarray], float]:
        def f(pred: np.ndarray, target: np.ndarray) -> float:
            p = pred if pred.ndim == 1 else pred[:, i]
            t = target if target.ndim == 1 else target[:, i]
            return coverage_error(t, p, reg, s, th.get(s))

        return f

    fns = {f"coverage_error_{s}": one(s, i) for s, i in cols.items()}
    parts = list(fns.values())
    fns["coverage_error"] = lambda pred, target: float(np.mean([f(pred, target) for f in parts]))
    return fns


def energy_efficiency(bits: np.ndarray, joules: np.ndarray) -> np.ndarray:
    """``EE = bits / joules`` (bit/J), element-wise; joules must be > 0."""
    b = np.asarray(bits, dtype=np.float64)
    j = np.asarray(joules, dtype=np.float64)
    if np.any(j <= 0):
        raise DataError("energy consumption must be > 0 to compute energy efficiency")
    return b / j


def relative_error(real: np.ndarray, predicted: np.ndarray) -> float:
    """``Σ|q̂ − q| / Σ|q|``."""
    r = np.asarray(real, dtype=np.float64).reshape(-1)
    p = np.asarray(predicted, dtype=np.float64).reshape(-1)
    if r.shape != p.shape or r.size == 0:
        raise DataError(f"real and predicted must have the same non-zero length, got {r.size} and {p.size}")
    denom = float(np.abs(r).sum())
    if denom == 0:
        raise DataError("the real values are all zero; the relative error is undefined")
    return float(np.abs(p - r).sum() / denom)


def energy_efficiency_error(real: np.ndarray, predicted: np.ndarray) -> float:
    """Relative L1 error of predicted energy efficiency."""
    return relative_error(real, predicted)


def energy_consumption_error(real: np.ndarray, predicted: np.ndarray) -> float:
    """Relative L1 error of predicted energy consumption."""
    return relative_error(real, predicted)


def energy_metrics(columns: dict[str, int]) -> dict[str, Callable[[np.ndarray, np.ndarray], float]]:
    """Metric functions for an engine predicting ``"efficiency"`` and/or ``"consumption"`` columns:
    ``energy_efficiency_error``, ``energy_consumption_error`` and ``energy_error`` (their mean)."""
    unknown = set(columns) - {"efficiency", "consumption"}
    if unknown or not columns:
        raise DataError(f"energy columns must be 'efficiency' and/or 'consumption', got {sorted(columns)}")

    def one(i: int) -> Callable[[np.ndarray, np.ndarray], float]:
        def f(pred: np.ndarray, target: np.ndarray) -> float:
            p = pred if pred.ndim == 1 else pred[:, i]
            t = target if target.ndim == 1 else target[:, i]
            return relative_error(t, p)

        return f

    fns = {f"energy_{k}_error": one(i) for k, i in columns.items()}
    parts = list(fns.values())
    fns["energy_error"] = lambda pred, target: float(np.mean([f(pred, target) for f in parts]))
    return fns
