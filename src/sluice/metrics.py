"""Metrics: what an engine reports, whether higher or lower is better, and how each is computed.

Engines declare the metrics they report as :class:`MetricSpec` entries (name, direction, range); the
control plane accepts a termination target or requirement on a metric only when the engine declares it.

**Classification.** With the confusion matrix ``C`` (rows: true class, columns: predicted),
``precision_c = C_cc / Σ_r C_rc``, ``recall_c = C_cc / Σ_k C_ck`` and ``F1_c = 2·P·R / (P + R)`` (0 where
undefined); ``test_precision``, ``test_recall`` and ``test_f1`` are their means over the classes present in
the labels. ``test_auc`` is the ROC AUC (one-vs-rest for several classes).

**Regression.** ``test_mse = mean ‖ŷ − y‖²/k``, ``test_mae``, ``test_rmse = √test_mse``.

Type-specific training errors (T4): coverage problem analysis and energy saving. Each is 0 for exact
predictions; a threshold on it asks for a model that learned something only when it lies below what
predicting the mean scores, which is given with each error below.

**Coverage problem analysis.** The model predicts per-sample RSRP, RSRQ and SINR. The training error of a
signal ``s`` is its normalised RMSE over the evaluated samples::

    E_s = √(mean_i (ŝ_i − s_i)²) / σ_s        σ_s = standard deviation of the real s_i

which is ``√(1 − R²)``: 1 for predicting the mean of the real values, at least 1 for any constant
prediction, 0 for exact predictions. ``coverage_error_<s>`` is ``E_s``; ``coverage_error`` is their mean
over the signals given. It measures the signals from which every coverage problem is derived, in a unit
that means the same on every scenario: a threshold 0.8 asks for a model that explains more than a third of
the signals' variance (``1 − 0.8² = 0.36``).

The coverage-problem ratios of SPEC T4 are reported next to it, not as the training error. In a region
``r`` with samples ``i ∈ r``, the coverage-problem ratio for a signal ``s`` is the share of samples whose
value is below the problem threshold ``τ_s``::

    ρ_s(r) = |{i ∈ r : s_i < τ_s}| / |r|

(weak coverage / coverage hole for RSRP, poor quality for RSRQ, interference such as pilot pollution for
SINR), and ``coverage_ratio_error_<s> = (1/R) Σ_r |ρ̂_s(r) − ρ_s(r)|`` in [0, 1], ``coverage_ratio_error``
their mean (default thresholds: the usual drive-test ones, RSRP −110 dBm, RSRQ −15 dB, SINR 0 dB). They
do not rank models: a point prediction that is the conditional mean rarely falls below a threshold in the
tails, so a model can score the same as a constant (RSRQ and SINR in the coverage scenario), and the real
ratio of a region holding few held-out samples is mostly sampling noise (±0.1 for a 25 % share over 18
samples), so the error moves more between evaluations than it falls as the model learns.

**Energy saving.** Energy efficiency is delivered traffic per energy, ``EE = bits / joules``. The error of
a predicted quantity ``q̂`` against the real ``q`` is the relative L1 error ``Σ|q̂ − q| / Σ|q|``
(``energy_efficiency_error``, ``energy_consumption_error``); ``energy_error`` is their mean when both are
given. Predicting the train rows' mean ``q̄`` scores ``Σ|q̄ − q| / Σ|q|``: 0.56 for consumption and 1.09 for
efficiency in the energy scenario at its default size (``energy_error`` 0.83).
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
        *(MetricSpec(n, False, 0.0, 1.0) for n in ("coverage_ratio_error", "coverage_ratio_error_rsrp",
                                                   "coverage_ratio_error_rsrq", "coverage_ratio_error_sinr")),
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


def coverage_ratio_error(
    real: np.ndarray,
    predicted: np.ndarray,
    regions: np.ndarray | None = None,
    signal: str = "rsrp",
    threshold: float | None = None,
) -> float:
    """Mean |predicted − real| coverage-problem ratio over regions (``coverage_ratio_error_<signal>``).

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


def normalised_rmse(real: np.ndarray, predicted: np.ndarray) -> float:
    """``√(mean (q̂ − q)²) / σ_q``, σ the standard deviation of the real values: 1 for predicting their mean,
    at least 1 for any constant (``coverage_error_<signal>``)."""
    r = np.asarray(real, dtype=np.float64).reshape(-1)
    p = np.asarray(predicted, dtype=np.float64).reshape(-1)
    if r.shape != p.shape or r.size == 0:
        raise DataError(f"real and predicted must have the same non-zero length, got {r.size} and {p.size}")
    sd = float(np.std(r))
    if sd == 0:
        raise DataError("the real values are all equal; the normalised RMSE is undefined")
    return math.sqrt(float(np.mean((p - r) ** 2))) / sd


def coverage_metrics(
    regions: np.ndarray | None = None, columns: dict[str, int] | Sequence[str] = SIGNALS,
    thresholds: dict[str, float] | None = None,
) -> dict[str, Callable[[np.ndarray, np.ndarray], float]]:
    """Metric functions ``f(prediction, target)`` for an engine that predicts per-sample signals.

    ``columns`` maps each signal to its output column (a sequence means columns 0, 1, ...). Returns
    ``coverage_error_<signal>`` (normalised RMSE) for each and ``coverage_error`` (their mean, the training
    error); with ``regions`` (one per sample) also ``coverage_ratio_error_<signal>`` and
    ``coverage_ratio_error`` (their mean), with ``thresholds`` replacing :data:`THRESHOLDS`.
    """
    cols = dict(columns) if isinstance(columns, dict) else {s: i for i, s in enumerate(columns)}
    cols = {_signal(s): i for s, i in cols.items()}
    th = thresholds or {}

    def column(a: np.ndarray, i: int) -> np.ndarray:
        a = np.asarray(a)
        return a if a.ndim == 1 else a[:, i]

    def nrmse(i: int) -> Callable[[np.ndarray, np.ndarray], float]:
        return lambda pred, target: normalised_rmse(column(target, i), column(pred, i))

    def ratio(s: str, i: int) -> Callable[[np.ndarray, np.ndarray], float]:
        reg = np.asarray(regions)
        return lambda pred, target: coverage_ratio_error(column(target, i), column(pred, i), reg, s, th.get(s))

    fns = {f"coverage_error_{s}": nrmse(i) for s, i in cols.items()}
    _add_mean(fns, "coverage_error")
    if regions is not None:
        ratios = {f"coverage_ratio_error_{s}": ratio(s, i) for s, i in cols.items()}
        _add_mean(ratios, "coverage_ratio_error")
        fns.update(ratios)
    return fns


def _add_mean(fns: dict[str, Callable[[np.ndarray, np.ndarray], float]], name: str) -> None:
    """Add ``name``: the mean of the functions in ``fns``."""
    parts = list(fns.values())
    fns[name] = lambda pred, target: float(np.mean([f(pred, target) for f in parts]))


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
    _add_mean(fns, "energy_error")
    return fns
