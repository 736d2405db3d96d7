"""KPI anomaly scenario (``data.dataset = "kpi_anomaly"``): labelled anomalies in cell KPI time series.

The model type is SPEC T3 *KPI anomaly*. No labelled operator KPI data is available offline, so the series
are generated and anomalies are injected with known start and end: every time step carries its true label,
which makes precision, recall and F1 targets meaningful.

**Normal behaviour.** Each cell ``c`` belongs to a traffic profile (business, residential or transport:
the weekday shapes ``s(h)`` and weekend factors of :mod:`sluice.data.scenarios.energy`) and is sampled
every ``interval_min`` minutes. Its load and five KPIs at step ``t`` are::

    ℓ_ct     = min(1, L_c · s(h_t) · W_c(t) · exp(e¹_ct))      L_c ~ U(busy_hour_load)
    prb_util = 100 · ℓ                                          PRB utilisation, %
    dl_thp   = R_c · ℓ · exp(e²_ct)                             DL cell throughput, Mbit/s, R_c ~ U(30, 80)
    rrc_users= U_c · ℓ · exp(e³_ct)                             mean RRC-connected users, U_c ~ U(50, 300)
    cqi      = (Q_c − 2ℓ) · exp(e⁴_ct)                          mean wideband CQI, Q_c ~ U(9, 12)
    drop_rate= δ_c · (1 + 3ℓ²) · exp(e⁵_ct)                     call/E-RAB drop rate, %, δ_c ~ U(0.1, 0.4)

with independent stationary AR(1) noises ``e_t = φ e_{t−1} + σ √(1 − φ²) ξ_t`` (``ξ ~ N(0, 1)``,
``e_0 ~ N(0, σ²)``; ``φ = ar_phi``, ``σ = ar_sigma``, per step). The per-cell constants and the shapes of the
load dependence (quality degrading with load) are design choices.

**Anomalies.** Per cell, ``Poisson(anomalies_per_day · days)`` events, each of a kind drawn with
``kind_weights``, a duration drawn uniformly from its range in minutes, and a start drawn uniformly; events
never overlap or touch. Each affects one KPI in its *degrading* direction (down for PRB utilisation,
throughput, users and CQI, up for the drop rate), except outages; ``m`` is drawn uniformly from the kind's
magnitude range:

* 1 ``level_shift`` — the KPI is multiplied by ``(1 + m)^±1`` over the whole event (a configuration or
  hardware change);
* 2 ``spike`` — the same, with a large ``m``, for a few steps (users, throughput, CQI or drop rate);
* 3 ``drift`` — the factor grows linearly from 1 to ``(1 + m)^±1`` over the event (a slow degradation);
* 4 ``outage`` — the cell carries nothing: PRB utilisation, throughput, users and CQI are 0 (no reports)
  and so is the drop rate.

``y`` is the label at each step: 0 normal, else the kind's number (multi-class); the binary metrics treat
every non-zero class as "anomaly". With the defaults about 4 % of the steps are anomalous.

**Rows and features.** One row per (cell, step) from step ``window − 1`` on. Each KPI ``x`` is turned into
a seasonal residual of its logarithm, ``z_t = (ln(x_t + ε) − b(slot_t, weekend_t)) / σ̂`` with ``b`` the
median of ``ln(x + ε)`` over the cell's *train* days at the same time of day (weekdays and weekends apart;
all train days when a kind of day has none), ``σ̂`` 1.4826 × the median absolute residual over those days,
``ε`` 1 % of the cell's median value and ``z`` clipped to ±20; these statistics are what the cell itself can
compute from its own training history. The features are the last ``window`` residuals of every KPI
(``<kpi>_z<lag>``, lag 0 = the labelled step) and the step's hour (sin/cos) and weekend flag.

**Parties.** One per cell (profiles, loads and capacities differ: non-IID). The vertical split gives the
traffic KPIs (PRB utilisation, throughput, users) and the time features to group 0, which holds the labels,
and the radio-quality KPIs (CQI, drop rate) to group 1.

**Split.** For each cell ``round(test_fraction · days)`` random whole days (at least 1, at most ``days −
1``) are held out; a row is a test row when its labelled step is in one of them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import Field, field_validator, model_validator

from sluice.data.scenarios.base import MetricFn, ScenarioData, ScenarioSpec, save_figure
from sluice.data.scenarios.energy import PROFILES, check_weekend_factors, diurnal_profile, held_out_days
from sluice.errors import DataError
from sluice.metrics import MetricSpec
from sluice.schema import Section

KINDS: tuple[str, ...] = ("normal", "level_shift", "spike", "drift", "outage")
KPIS: tuple[str, ...] = ("prb_util", "dl_thp", "rrc_users", "cqi", "drop_rate")
KPI_UNITS: dict[str, str] = {"prb_util": "%", "dl_thp": "Mbit/s", "rrc_users": "users", "cqi": "CQI",
                             "drop_rate": "%"}
DEGRADE: dict[str, int] = {"prb_util": -1, "dl_thp": -1, "rrc_users": -1, "cqi": -1, "drop_rate": 1}
"""Direction in which an anomaly moves each KPI (−1 down, +1 up)."""
TARGETS_OF: dict[str, tuple[str, ...]] = {
    "level_shift": KPIS, "spike": ("dl_thp", "rrc_users", "cqi", "drop_rate"), "drift": KPIS,
}
"""KPIs an anomaly of each kind may hit (outages hit all)."""
TRAFFIC_KPIS = ("prb_util", "dl_thp", "rrc_users")
QUALITY_KPIS = ("cqi", "drop_rate")


class KpiAnomalyParams(Section):
    """Parameters of the KPI anomaly scenario (see the module docstring for each model)."""

    cells: int = Field(20, ge=1, le=20_000)
    days: int = Field(14, ge=2, le=366, description="day 0 is a Monday")
    interval_min: int = Field(15, ge=1, le=360, description="sampling interval; must divide 1440")
    window: int = Field(8, ge=1, le=96, description="steps of each KPI in a row's features")
    busy_hour_load: tuple[float, float] = (0.4, 0.9)
    weekend_factor: dict[str, float] = Field(
        default_factory=lambda: {"business": 0.5, "residential": 1.1, "transport": 0.7})
    ar_phi: float = Field(0.8, ge=0, lt=1, description="AR(1) coefficient of the log noise, per step")
    ar_sigma: float = Field(0.08, ge=0, le=2, description="stationary std of the AR(1) log noise")
    anomalies_per_day: float = Field(0.25, ge=0, le=24, description="expected events per cell and day")
    kind_weights: dict[str, float] = Field(
        default_factory=lambda: {"level_shift": 1.0, "spike": 1.0, "drift": 1.0, "outage": 1.0})
    level_shift_minutes: tuple[int, int] = (120, 480)
    spike_minutes: tuple[int, int] = (15, 45)
    drift_minutes: tuple[int, int] = (240, 720)
    outage_minutes: tuple[int, int] = (30, 180)
    level_shift_magnitude: tuple[float, float] = (0.4, 1.0)
    spike_magnitude: tuple[float, float] = (1.5, 4.0)
    drift_magnitude: tuple[float, float] = (0.6, 1.5)
    test_fraction: float = Field(0.2, gt=0, lt=1)

    @field_validator("weekend_factor")
    @classmethod
    def _profiles(cls, v: dict[str, float]) -> dict[str, float]:
        return check_weekend_factors(v)

    @field_validator("kind_weights")
    @classmethod
    def _kinds(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(KINDS[1:]))
        if unknown or any(x < 0 for x in v.values()) or not any(x > 0 for x in v.values()):
            raise ValueError(f"weights >= 0 (at least one > 0) for kinds among {', '.join(KINDS[1:])}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> KpiAnomalyParams:
        if 1440 % self.interval_min:
            raise ValueError(f"interval_min ({self.interval_min}) must divide 1440")
        for name in ("level_shift_minutes", "spike_minutes", "drift_minutes", "outage_minutes",
                     "level_shift_magnitude", "spike_magnitude", "drift_magnitude", "busy_hour_load"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"{name} must be (low, high) with 0 < low <= high")
        if self.window > self.days * 1440 // self.interval_min // 2:
            raise ValueError("window is longer than half of the series")
        return self


def _ar1(rng: np.random.Generator, shape: tuple[int, ...], phi: float, sigma: float) -> np.ndarray:
    """Stationary AR(1) along the last axis: ``e_t = φ e_{t−1} + σ√(1−φ²) ξ_t``, ``e_0 ~ N(0, σ²)``."""
    e = rng.standard_normal(shape) * sigma
    e[..., 1:] *= np.sqrt(1.0 - phi * phi)
    for t in range(1, shape[-1]):  # a loop over steps, vectorised over the leading axes
        e[..., t] += phi * e[..., t - 1]
    return e


def _events(rng: np.random.Generator, p: KpiAnomalyParams, T: int) -> list[tuple[int, int, int, int, float]]:
    """``(start, end, kind, kpi, magnitude)`` of one cell's non-overlapping anomalies (``end`` exclusive)."""
    kinds = [k for k in KINDS[1:] if p.kind_weights.get(k, 0.0) > 0]
    w = np.array([p.kind_weights[k] for k in kinds])
    steps = p.interval_min
    out: list[tuple[int, int, int, int, float]] = []
    taken = np.zeros(T + 2, dtype=bool)
    for _ in range(rng.poisson(p.anomalies_per_day * p.days)):
        kind = kinds[int(rng.choice(len(kinds), p=w / w.sum()))]
        lo, hi = getattr(p, f"{kind}_minutes")
        dur = int(min(max(round(rng.uniform(lo, hi) / steps), 1), T // 4))
        start = int(rng.integers(0, T - dur + 1))
        if taken[start: start + dur + 2].any():  # touches or overlaps an earlier event: dropped
            continue
        taken[start: start + dur + 2] = True
        kpi = KPIS.index(TARGETS_OF[kind][int(rng.integers(len(TARGETS_OF[kind])))]) if kind != "outage" else -1
        mag = float(rng.uniform(*getattr(p, f"{kind}_magnitude"))) if kind != "outage" else 0.0
        out.append((start, start + dur, KINDS.index(kind), kpi, mag))
    return out


def _residuals(x: np.ndarray, train_day: np.ndarray, weekend_day: np.ndarray) -> np.ndarray:
    """Seasonal log residuals ``z`` of ``x`` ``(cells, days·slots)`` against the cells' ``train_day``
    ``(cells, days)`` (module docstring)."""
    C, T = x.shape
    D = len(weekend_day)
    S = T // D
    eps = 0.01 * np.median(x, axis=1, keepdims=True) + 1e-9
    lx = np.log(x + eps).reshape(C, D, S)
    base = np.empty((C, 2, S))
    for w in (False, True):
        use = train_day & (weekend_day[None, :] == w)
        use = np.where(use.any(axis=1, keepdims=True), use, train_day)  # no train day of this kind: all
        masked = np.where(use[:, :, None], lx, np.nan)
        base[:, int(w)] = np.nanmedian(masked, axis=1)
    resid = lx - base[:, weekend_day.astype(np.int64)]  # (C, D, S)
    mad = np.nanmedian(np.where(train_day[:, :, None], np.abs(resid), np.nan), axis=(1, 2))
    scale = np.maximum(1.4826 * mad, 1e-6)[:, None]
    return np.clip(resid.reshape(C, T) / scale, -20.0, 20.0)


def generate(p: KpiAnomalyParams, seed: int) -> ScenarioData:
    """Generate the KPI anomaly table for ``p`` and ``seed`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    C, D, W = p.cells, p.days, p.window
    S = 1440 // p.interval_min
    T = D * S
    t = np.arange(T)
    day, slot = t // S, t % S
    hour = slot * p.interval_min / 60.0
    weekend_day = (np.arange(D) % 7) >= 5
    weekend = weekend_day[day]

    names = list(PROFILES)
    profile = rng.integers(0, len(names), C)
    shape = np.stack([diurnal_profile(hour + p.interval_min / 120.0, n) for n in names])[profile]
    wk = np.array([p.weekend_factor[n] for n in names])[profile][:, None]
    busy = rng.uniform(*p.busy_hour_load, C)[:, None]
    noise = _ar1(rng, (len(KPIS), C, T), p.ar_phi, p.ar_sigma)
    load = np.minimum(busy * shape * np.where(weekend[None, :], wk, 1.0) * np.exp(noise[0]), 1.0)
    rate = rng.uniform(30.0, 80.0, C)[:, None]
    users = rng.uniform(50.0, 300.0, C)[:, None]
    q = rng.uniform(9.0, 12.0, C)[:, None]
    drop = rng.uniform(0.1, 0.4, C)[:, None]
    series = np.stack([
        100.0 * load,
        rate * load * np.exp(noise[1]),
        users * load * np.exp(noise[2]),
        (q - 2.0 * load) * np.exp(noise[3]),
        drop * (1.0 + 3.0 * load**2) * np.exp(noise[4]),
    ])  # (KPI, C, T)

    label = np.zeros((C, T), dtype=np.int64)
    outage = KINDS.index("outage")
    drift = KINDS.index("drift")
    for c in range(C):
        for start, end, kind, kpi, mag in _events(rng, p, T):
            label[c, start:end] = kind
            if kind == outage:
                series[:, c, start:end] = 0.0
                continue
            ramp = np.linspace(1.0 / (end - start), 1.0, end - start) if kind == drift else 1.0
            series[kpi, c, start:end] *= (1.0 + mag * ramp) ** DEGRADE[KPIS[kpi]]
    series[0] = np.minimum(series[0], 100.0)

    test_day = held_out_days(rng, C, D, p.test_fraction)
    z = np.stack([_residuals(series[k], ~test_day, weekend_day) for k in range(len(KPIS))])

    # rows: (cell, step) for step >= W-1; features: the last W residuals of each KPI
    steps = np.arange(W - 1, T)
    lags = steps[:, None] - np.arange(W - 1, -1, -1)[None, :]  # (rows per cell, W), oldest first
    win = z[:, :, lags]  # (KPI, C, R, W)
    R = len(steps)
    feats = win.transpose(1, 2, 0, 3).reshape(C * R, len(KPIS) * W)
    hh = hour[steps]
    time_cols = np.stack([np.sin(2 * np.pi * hh / 24), np.cos(2 * np.pi * hh / 24),
                          weekend[steps].astype(np.float64)], axis=1)
    X = np.concatenate([feats, np.tile(time_cols, (C, 1))], axis=1).astype(np.float32)
    names_z = tuple(f"{k}_z{lag}" for k in KPIS for lag in range(W - 1, -1, -1))
    features = (*names_z, "hour_sin", "hour_cos", "weekend")
    vertical = (
        tuple(n for n in features if n.split("_z")[0] in TRAFFIC_KPIS) + ("hour_sin", "hour_cos", "weekend"),
        tuple(n for n in features if n.split("_z")[0] in QUALITY_KPIS),
    )
    cell = np.repeat(np.arange(C), R)
    info = {"cell": cell.astype(np.int64), "step": np.tile(steps, C).astype(np.int64),
            **{k: series[i][:, steps].reshape(-1).astype(np.float32) for i, k in enumerate(KPIS)}}
    return ScenarioData(
        name="kpi_anomaly", model_type=SPEC.model_type, task="classification", X=X,
        y=label[:, steps].reshape(-1), feature_names=features, target_names=KINDS, party=cell.astype(np.int64),
        test=test_day[:, day[steps]].reshape(-1), vertical=vertical, params=p.model_dump(mode="json"),
        seed=int(seed), info=info,
    )


# ------------------------------------------------------------------------------------------------ metrics
def predicted_classes(pred: np.ndarray) -> np.ndarray:
    """Class ids from predictions given as ids ``(n,)`` or as per-class scores ``(n, k)`` (argmax)."""
    a = np.asarray(pred)
    if a.ndim == 2:
        return a.argmax(axis=1)
    if a.ndim != 1:
        raise DataError(f"predictions must be class ids (n,) or class scores (n, k), got shape {a.shape}")
    return a.astype(np.int64)


def anomaly_scores(pred: np.ndarray, target: np.ndarray) -> tuple[float, float, float]:
    """``(precision, recall, F1)`` of "anomaly" (any class ≠ 0) against "normal": ``P = TP/(TP+FP)``,
    ``R = TP/(TP+FN)``, ``F1 = 2PR/(P+R)``, each 0 where undefined."""
    p = predicted_classes(pred) != 0
    t = np.asarray(target).reshape(-1) != 0
    if p.shape != t.shape:
        raise DataError(f"{p.size} predictions for {t.size} targets")
    tp = float(np.sum(p & t))
    precision = tp / float(p.sum()) if p.any() else 0.0
    recall = tp / float(t.sum()) if t.any() else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return precision, recall, f1


def metrics(data: ScenarioData, rows: np.ndarray) -> dict[str, MetricFn]:
    """``anomaly_precision``, ``anomaly_recall``, ``anomaly_f1`` (:func:`anomaly_scores`); predictions may
    be class ids or per-class scores such as logits (``rows`` selects nothing extra)."""

    def one(i: int) -> MetricFn:
        return lambda pred, target: anomaly_scores(pred, target)[i]

    return {f"anomaly_{m}": one(i) for i, m in enumerate(("precision", "recall", "f1"))}


METRIC_SPECS = tuple(MetricSpec(f"anomaly_{m}", True, 0.0, 1.0) for m in ("precision", "recall", "f1"))


# ------------------------------------------------------------------------------------------------ describe
KIND_COLOURS = {1: "C1", 2: "C3", 3: "C2", 4: "0.3"}


def describe(data: ScenarioData, out_dir: Path) -> tuple[list[str], list[Path]]:
    """Statistics (anomaly share per kind, per cell) and ``kpi_anomaly_cell.png``: one cell's KPI series
    with its anomaly intervals shaded by kind (each shading at least one hour wide, so that spikes show)."""
    y, cell, step = data.y, data.info["cell"], data.info["step"]
    n_cells = int(cell.max()) + 1
    lines = [f"kpi_anomaly: {len(y)} rows ({n_cells} cells × {len(y) // n_cells} steps of "
             f"{data.params.get('interval_min')} min), {len(data.feature_names)} features, "
             f"{int(data.test.sum())} test rows"]
    share = np.bincount(y, minlength=len(KINDS)) / len(y)
    lines.append("  label share: " + ", ".join(f"{k} {s:.2%}" for k, s in zip(KINDS, share, strict=True)))
    per_cell = np.bincount(cell, weights=(y != 0).astype(np.float64), minlength=n_cells) / np.bincount(cell)
    lines.append(f"  anomalous share per cell: min {per_cell.min():.2%}, median {np.median(per_cell):.2%}, "
                 f"max {per_cell.max():.2%}")
    lines.append(f"  anomalous share in test rows {np.mean(y[data.test] != 0):.2%}, "
                 f"in train rows {np.mean(y[~data.test] != 0):.2%}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds_per_cell = np.zeros((n_cells, len(KINDS)), dtype=bool)
    kinds_per_cell[cell, y] = True
    pick = int(np.argmax(kinds_per_cell.sum(1) * 1e6 + per_cell))
    m = cell == pick
    st, lab = step[m], y[m]
    fig, axes = plt.subplots(len(KPIS), 1, figsize=(11, 8), sharex=True)
    step_h = float(data.params.get("interval_min", 15)) / 60.0
    hours = st * step_h
    on = np.concatenate([[0], lab, [0]])
    edges = np.flatnonzero(np.diff(on) != 0)
    for ax, k in zip(axes, KPIS, strict=True):
        ax.plot(hours, data.info[k][m], lw=0.7, color="C0")
        ax.set_ylabel(f"{k}\n({KPI_UNITS[k]})", fontsize=8)
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            if lab[a] != 0:
                mid, half = (hours[a] + hours[b - 1] + step_h) / 2, max((b - a) * step_h, 1.0) / 2
                ax.axvspan(mid - half, mid + half, color=KIND_COLOURS[int(lab[a])], alpha=0.35, lw=0)
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLOURS[i], alpha=0.35) for i in range(1, len(KINDS))]
    axes[0].legend(handles, KINDS[1:], loc="upper right", fontsize=7, ncol=4)
    axes[-1].set_xlabel("hour")
    fig.suptitle(f"cell {pick}: KPIs and injected anomalies")
    fig.tight_layout()
    return lines, [save_figure(fig, out_dir, "kpi_anomaly_cell.png")]


SPEC = ScenarioSpec(
    name="kpi_anomaly", model_type="KPI anomaly", task="classification", params=KpiAnomalyParams,
    generate=generate, metrics=metrics, metric_specs=METRIC_SPECS, describe=describe, version=1,
)
