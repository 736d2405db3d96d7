"""Energy-saving scenario (``data.dataset = "energy"``): hourly energy use and efficiency of cells.

One row per cell-hour. The model type is SPEC T3 *energy saving*; its targets and errors are those of T4:
energy consumption (kWh per cell-hour) and energy efficiency (bit/J), each measured by the relative L1
error of :mod:`sluice.metrics`.

**Power model.** The EARTH linear base-station model (G. Auer et al., "How much energy is needed to run a
wireless network?", IEEE Wireless Communications 18(5), 2011, Table 2), per carrier of a cell::

    P_in = N_TRX · (P0 + Δp · P_out)    for 0 < P_out ≤ P_max
    P_in = N_TRX · P_sleep              when the carrier sleeps

with ``N_TRX`` transceiver chains, ``P_out`` the RF output power per chain and ``P_max`` its maximum. Table
:data:`EARTH` (values for a 10 MHz, 2×2 MIMO carrier):

======  =====  ========  ======  ====  ==========
type    N_TRX  P_max W   P0 W    Δp    P_sleep W
======  =====  ========  ======  ====  ==========
macro   6      20        130     4.7   75
rrh     6      20        84      2.8   56
micro   2      6.3       56      2.6   39
pico    2      0.13      6.8     4.0   4.3
femto   2      0.05      4.8     8.0   2.9
======  =====  ========  ======  ====  ==========

The macro and femto rows appear identically in two independent public implementations citing Auer 2011,
and the macro row reproduces the paper's worked figure (6·(130 + 4.7·20·0.5) = 1062 W at 50 % load); the
rrh, micro and pico rows come from a single implementation citing the same table and have not been checked
against the paper itself. At zero load an active carrier draws the limit ``N_TRX·P0``.

**Load.** ``P_out = P_conf · ℓ`` with ``ℓ = PRB_used / PRB_total`` of the carrier (the load measure of the
ITU AI/ML in 5G Challenge 2023 energy data: allocated PRBs, Tx power, carriers, bandwidth, ES mode) and
``P_conf = P_max · 10^(−b/10)`` the configured power, ``b`` a per-cell back-off drawn from 0–3 dB (design
choice, so that Tx power varies between cells of one type). PRBs per carrier follow the LTE channel
bandwidths of 3GPP TS 36.101 Table 5.6-1 (1.4/3/5/10/15/20 MHz → 6/15/25/50/75/100 PRBs of 180 kHz).

**Traffic** (synthetic; no measured cell traffic is available offline). Each site has a profile —
business, residential or transport — and all its cells share it. The weekday shape is
``s(h) = f + Σ_j a_j exp(−d(h, μ_j)² / (2 w_j²))`` with ``d`` the circular distance in hours, scaled to a
maximum of 1 (:data:`PROFILES`; peak hours, widths and floors are design choices: business peaks late
morning and mid-afternoon, residential at noon and in the evening, transport at the commuting hours). On
Saturday and Sunday the demand is multiplied by the profile's ``weekend_factor`` (parameter). The demand of
cell ``c`` in hour ``t`` as a share of its capacity is::

    D_ct = L_c · s(h_t) · W_ct · exp(σ_d δ_c,day − σ_d²/2) · exp(σ_h ε_ct − σ_h²/2),   δ, ε ~ N(0, 1)

with ``L_c`` the busy-hour load drawn uniformly from ``busy_hour_load`` and log-normal day and hour noise of
mean 1. The load before energy saving is ``ℓ_ct = min(1, D_ct)``; the excess demand is not served.

**Served traffic.** ``bits = SE · PRB_used · 180 kHz · 3600 s`` with ``SE`` the cell's mean spectral
efficiency (bit/s/Hz) times a log-normal hourly factor (``se_noise``). The default ``SE`` per type (2.2
macro/rrh, 2.6 micro, 3.0 pico/femto) is an assumption of the order of the IMT-Advanced downlink cell
spectral-efficiency requirements (ITU-R M.2134: base-coverage urban, microcellular, indoor; quoted, not
checked against the text here), matching EARTH's LTE-era 2×2 configuration.

**Energy-saving modes** (design choices; one per cell-hour, in this priority, only in cells with energy
saving enabled, a share ``es_cell_share`` of them):

* *sleep* — a cell of a type in ``sleep_types`` (capacity layer) sleeps in the hours of ``sleep_hours``
  when ``ℓ < sleep_below``: every carrier draws ``N_TRX·P_sleep`` (EARTH) and the cell serves nothing (its
  few users are assumed to be carried by the overlaying coverage layer, which is not modelled).
* *carrier shutdown* — a cell with two carriers and ``ℓ < carrier_shutdown_below`` moves all traffic onto
  its first carrier (load ``2ℓ``) and puts the second to sleep (``N_TRX·P_sleep``, EARTH).
* *symbol shutdown* — when ``ℓ < symbol_shutdown_below`` the PA and part of the radio are switched off in
  symbols without data: ``P0 → P0·(1 − s·(1 − ℓ))`` with ``s = symbol_shutdown_saving`` the share of
  ``P0`` saved in an empty symbol (the value 0.25 is a design choice). 3GPP TR 38.864 (Rel-18 network energy
  savings) defines a relative base-station power model with sleep states; its numbers are not used here.

**Targets.** ``y[:, 0]`` energy in kWh per cell-hour, ``E = P_in · 1 h / 1000 · exp(σ_m η − σ_m²/2)``,
``η ~ N(0, 1)``, a log-normal meter error of mean 1 with ``σ_m = meter_noise``; ``y[:, 1]`` energy
efficiency ``EE = bits / (3.6e6 · E)`` bit/J
(:func:`sluice.metrics.energy_efficiency`; 0 in sleeping hours).

**Parties.** ``party_by = "cell"`` (default): one party per cell; ``"site"``: one per site. Cells differ in
type, carriers, back-off and traffic profile, so the parties are non-IID by construction. The vertical split
puts the site infrastructure and power-meter side (cell type, carriers, antennas, bandwidth, Tx power, ES
mode; it holds the labels) in group 0 and the RAN traffic counters (PRB load, hour, weekend) in group 1.

**Split.** For each cell, ``round(test_fraction · days)`` whole days (at least one, at most ``days − 1``)
are held out at random: no test hour has a train neighbour of the same day.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from sluice.data.scenarios.base import MetricFn, ScenarioData, ScenarioSpec, save_figure
from sluice.errors import DataError
from sluice.metrics import KNOWN, energy_efficiency, energy_metrics
from sluice.schema import Section

if TYPE_CHECKING:
    from matplotlib.axes import Axes


@dataclass(frozen=True)
class EarthRow:
    """One base-station type of the EARTH power model (Auer et al. 2011, Table 2)."""

    n_trx: int
    p_max_w: float
    p0_w: float
    delta_p: float
    p_sleep_w: float


EARTH: dict[str, EarthRow] = {
    "macro": EarthRow(6, 20.0, 130.0, 4.7, 75.0),
    "rrh": EarthRow(6, 20.0, 84.0, 2.8, 56.0),
    "micro": EarthRow(2, 6.3, 56.0, 2.6, 39.0),
    "pico": EarthRow(2, 0.13, 6.8, 4.0, 4.3),
    "femto": EarthRow(2, 0.05, 4.8, 8.0, 2.9),
}
CELL_TYPES: tuple[str, ...] = tuple(EARTH)

LTE_PRBS: dict[float, int] = {1.4: 6, 3.0: 15, 5.0: 25, 10.0: 50, 15.0: 75, 20.0: 100}
"""PRBs per LTE channel bandwidth in MHz (3GPP TS 36.101 Table 5.6-1)."""
PRB_HZ = 180e3

ES_MODES: tuple[str, ...] = ("none", "symbol", "carrier", "sleep")


@dataclass(frozen=True)
class Profile:
    """A weekday traffic shape: ``floor + Σ amp·exp(−d(h, hour)²/(2·width²))`` over ``peaks``."""

    floor: float
    peaks: tuple[tuple[float, float, float], ...]  # (hour, width h, amplitude)


PROFILES: dict[str, Profile] = {
    "business": Profile(0.05, ((10.5, 2.5, 1.0), (15.0, 2.5, 0.85))),
    "residential": Profile(0.08, ((12.5, 3.0, 0.55), (20.5, 2.5, 1.0))),
    "transport": Profile(0.10, ((8.0, 1.5, 1.0), (18.0, 1.5, 1.0))),
}


def check_weekend_factors(v: dict[str, float]) -> dict[str, float]:
    """Validate a ``weekend_factor`` table: one factor > 0 for each of :data:`PROFILES` (ValueError)."""
    if set(v) != set(PROFILES) or any(x <= 0 for x in v.values()):
        raise ValueError(f"give a factor > 0 for each of {', '.join(PROFILES)}")
    return v


def diurnal_profile(hours: np.ndarray, profile: str) -> np.ndarray:
    """The weekday shape of ``profile`` (:data:`PROFILES`) at fractional ``hours`` of the day, max 1."""
    if profile not in PROFILES:
        raise DataError(f"unknown traffic profile {profile!r}; allowed: {', '.join(PROFILES)}")
    p = PROFILES[profile]

    def shape(h: np.ndarray) -> np.ndarray:
        out = np.full(np.shape(h), p.floor, dtype=np.float64)
        for mu, w, a in p.peaks:
            d = np.abs((np.asarray(h, dtype=np.float64) - mu + 12.0) % 24.0 - 12.0)
            out += a * np.exp(-(d**2) / (2 * w * w))
        return out

    peak = shape(np.linspace(0.0, 24.0, 24 * 60, endpoint=False)).max()
    return shape(hours) / peak


def earth_power(
    n_trx: np.ndarray | float,
    p0_w: np.ndarray | float,
    delta_p: np.ndarray | float,
    p_out_w: np.ndarray | float,
    p_sleep_w: np.ndarray | float,
    sleeping: np.ndarray | bool = False,
) -> np.ndarray:
    """EARTH input power in W: ``N_TRX·(P0 + Δp·P_out)``, or ``N_TRX·P_sleep`` where ``sleeping``."""
    active = np.asarray(n_trx, np.float64) * (np.asarray(p0_w, np.float64)
                                              + np.asarray(delta_p, np.float64) * np.asarray(p_out_w, np.float64))
    asleep = np.asarray(n_trx, np.float64) * np.asarray(p_sleep_w, np.float64)
    return np.where(sleeping, asleep, active)


def cell_power(cell_type: str, load: np.ndarray | float, *, sleeping: np.ndarray | bool = False,
               p0_scale: np.ndarray | float = 1.0, backoff_db: float = 0.0) -> np.ndarray:
    """EARTH input power (W) of one carrier of ``cell_type`` at PRB ``load`` in [0, 1], with ``P0`` scaled by
    ``p0_scale`` (symbol shutdown) and the output power backed off by ``backoff_db``."""
    if cell_type not in EARTH:
        raise DataError(f"unknown cell type {cell_type!r}; allowed: {', '.join(CELL_TYPES)}")
    ld = np.asarray(load, dtype=np.float64)
    if np.any((ld < 0) | (ld > 1)):
        raise DataError("PRB load must be in [0, 1]")
    r = EARTH[cell_type]
    p_conf = r.p_max_w * 10 ** (-backoff_db / 10)
    return earth_power(r.n_trx, r.p0_w * np.asarray(p0_scale, np.float64), r.delta_p, p_conf * ld,
                       r.p_sleep_w, sleeping)


# ------------------------------------------------------------------------------------------------ params
class EnergyParams(Section):
    """Parameters of the energy-saving scenario (see the module docstring for each model)."""

    cells: int = Field(30, ge=1, le=20_000)
    sites: int = Field(10, ge=1, le=20_000, description="cells are spread over this many sites")
    days: int = Field(14, ge=2, le=366, description="day 0 is a Monday")
    cell_mix: dict[str, float] = Field(default_factory=lambda: {"macro": 0.5, "rrh": 0.25, "micro": 0.25})
    bandwidth_mhz: dict[str, float] = Field(default_factory=lambda: dict.fromkeys(CELL_TYPES, 10.0),
                                            description="LTE bandwidth per carrier, per cell type")
    max_carriers: dict[str, int] = Field(
        default_factory=lambda: {"macro": 2, "rrh": 2, "micro": 1, "pico": 1, "femto": 1})
    spectral_efficiency: dict[str, float] = Field(
        default_factory=lambda: {"macro": 2.2, "rrh": 2.2, "micro": 2.6, "pico": 3.0, "femto": 3.0},
        description="mean bit/s/Hz per cell type")
    busy_hour_load: tuple[float, float] = (0.35, 0.95)
    weekend_factor: dict[str, float] = Field(
        default_factory=lambda: {"business": 0.5, "residential": 1.1, "transport": 0.7})
    max_backoff_db: float = Field(3.0, ge=0, le=20)
    traffic_noise: float = Field(0.15, ge=0, le=2, description="σ of the hourly log-normal demand factor")
    day_noise: float = Field(0.05, ge=0, le=2, description="σ of the daily log-normal demand factor")
    se_noise: float = Field(0.05, ge=0, le=2, description="σ of the hourly log-normal spectral-efficiency factor")
    meter_noise: float = Field(0.01, ge=0, lt=0.5, description="σ of the log-normal meter error")
    es_cell_share: float = Field(0.7, ge=0, le=1, description="share of cells with energy saving enabled")
    symbol_shutdown_below: float = Field(0.4, ge=0, le=1)
    symbol_shutdown_saving: float = Field(0.25, ge=0, lt=1)
    carrier_shutdown_below: float = Field(0.25, ge=0, le=0.5)
    sleep_below: float = Field(0.05, ge=0, le=1)
    sleep_hours: tuple[int, int] = Field((0, 6), description="[start, end) hours of the night sleep window")
    sleep_types: tuple[str, ...] = ("micro", "pico", "femto")
    party_by: Literal["cell", "site"] = "cell"
    test_fraction: float = Field(0.2, gt=0, lt=1)

    @field_validator("cell_mix", "bandwidth_mhz", "max_carriers", "spectral_efficiency")
    @classmethod
    def _known_types(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(CELL_TYPES))
        if unknown:
            raise ValueError(f"unknown cell type(s) {unknown}; allowed: {', '.join(CELL_TYPES)}")
        if any(x < 0 for x in v.values()):
            raise ValueError("values must be >= 0")
        return v

    @field_validator("sleep_types")
    @classmethod
    def _sleep_types(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(v) - set(CELL_TYPES))
        if unknown:
            raise ValueError(f"unknown cell type(s) {unknown}; allowed: {', '.join(CELL_TYPES)}")
        return v

    @field_validator("weekend_factor")
    @classmethod
    def _profiles(cls, v: dict[str, float]) -> dict[str, float]:
        return check_weekend_factors(v)

    @model_validator(mode="after")
    def _consistent(self) -> EnergyParams:
        if not any(w > 0 for w in self.cell_mix.values()):
            raise ValueError("cell_mix needs at least one type with a weight > 0")
        for t, w in self.cell_mix.items():
            if w <= 0:
                continue
            bw = self.bandwidth_mhz.get(t, 10.0)
            if float(bw) not in LTE_PRBS:
                raise ValueError(f"bandwidth_mhz[{t}] = {bw} is not an LTE bandwidth "
                                 f"({', '.join(str(b) for b in LTE_PRBS)})")
            if self.max_carriers.get(t, 1) not in (1, 2):
                raise ValueError(f"max_carriers[{t}] must be 1 or 2")
            if self.spectral_efficiency.get(t, 0.0) <= 0:
                raise ValueError(f"spectral_efficiency[{t}] must be > 0")
        lo, hi = self.busy_hour_load
        if not 0 < lo <= hi:
            raise ValueError("busy_hour_load must be (low, high) with 0 < low <= high")
        a, b = self.sleep_hours
        if not 0 <= a <= b <= 24:
            raise ValueError("sleep_hours must be (start, end) with 0 <= start <= end <= 24")
        if self.sites > self.cells:
            raise ValueError(f"sites ({self.sites}) cannot exceed cells ({self.cells})")
        return self


# ------------------------------------------------------------------------------------------------ generate
FEATURES: tuple[str, ...] = (
    *(f"type_{t}" for t in CELL_TYPES), "carriers", "trx_per_carrier", "bandwidth_mhz", "tx_power_dbm",
    *(f"es_{m}" for m in ES_MODES),
    "hour_sin", "hour_cos", "weekend", "prb_load", "prb_load_prev",
)
VERTICAL: tuple[tuple[str, ...], ...] = (FEATURES[:13], FEATURES[13:])
TARGETS: tuple[str, ...] = ("energy_kwh", "energy_efficiency_bit_per_j")


def _counts(weights: np.ndarray, n: int) -> np.ndarray:
    """Largest-remainder split of ``n`` items by ``weights``."""
    share = weights / weights.sum() * n
    counts = np.floor(share).astype(np.int64)
    counts[np.argsort(-(share - counts), kind="stable")[: n - counts.sum()]] += 1
    return counts


def held_out_days(rng: np.random.Generator, units: int, days: int, fraction: float) -> np.ndarray:
    """Bool ``(units, days)``: for each unit, ``round(fraction·days)`` random days (1 to days − 1) held out."""
    k = int(min(max(round(fraction * days), 1), days - 1))
    order = np.argsort(rng.random((units, days)), axis=1)
    test = np.zeros((units, days), dtype=bool)
    np.put_along_axis(test, order[:, :k], True, axis=1)
    return test


@dataclass(frozen=True)
class _Cells:
    """Per-cell configuration (one entry per cell), drawn by :func:`_draw_cells`."""

    ctype: np.ndarray  # index in CELL_TYPES
    site: np.ndarray
    profile: np.ndarray  # index in PROFILES, the site's
    n_trx: np.ndarray  # EARTH N_TRX of the type
    p0: np.ndarray  # EARTH P0, W
    dp: np.ndarray  # EARTH Δp
    psl: np.ndarray  # EARTH P_sleep, W
    p_conf: np.ndarray  # configured output power per chain, W
    carriers: np.ndarray
    bw: np.ndarray  # MHz per carrier
    prbs: np.ndarray  # PRBs per carrier
    se_mean: np.ndarray  # mean spectral efficiency, bit/s/Hz
    es_on: np.ndarray  # energy saving enabled
    may_sleep: np.ndarray  # energy saving enabled and a type in sleep_types


def _draw_cells(p: EnergyParams, rng: np.random.Generator) -> _Cells:
    """Draw, in this order, each cell's type, site, the sites' traffic profiles, back-off, carriers and
    energy-saving switch; the EARTH values, bandwidth and spectral efficiency follow from the type."""
    C = p.cells
    types = [t for t in CELL_TYPES if p.cell_mix.get(t, 0.0) > 0]
    counts = _counts(np.array([p.cell_mix[t] for t in types]), C)
    ctype = rng.permutation(np.repeat(np.array([CELL_TYPES.index(t) for t in types]), counts))
    site = rng.permutation(np.arange(C) % p.sites)
    site_profile = rng.integers(0, len(PROFILES), p.sites)
    backoff = rng.uniform(0.0, p.max_backoff_db, C)
    tname = [CELL_TYPES[i] for i in ctype]
    max_k = np.array([p.max_carriers.get(t, 1) for t in tname])
    carriers = np.where(max_k == 2, rng.integers(1, 3, C), 1)
    es_on = rng.random(C) < p.es_cell_share
    earth = np.array([[r.n_trx, r.p0_w, r.delta_p, r.p_sleep_w, r.p_max_w] for r in EARTH.values()])[ctype]
    bw = np.array([float(p.bandwidth_mhz.get(t, 10.0)) for t in tname])
    return _Cells(
        ctype=ctype, site=site, profile=site_profile[site],
        n_trx=earth[:, 0], p0=earth[:, 1], dp=earth[:, 2], psl=earth[:, 3],
        p_conf=earth[:, 4] * 10 ** (-backoff / 10), carriers=carriers,
        bw=bw, prbs=np.array([LTE_PRBS[b] for b in bw], np.float64),
        se_mean=np.array([p.spectral_efficiency[t] for t in tname]), es_on=es_on,
        may_sleep=np.isin(ctype, [CELL_TYPES.index(t) for t in p.sleep_types]) & es_on,
    )


def _demand(p: EnergyParams, cells: _Cells, hour: np.ndarray, day: np.ndarray, weekend: np.ndarray,
            rng: np.random.Generator) -> np.ndarray:
    """``(cells, hours)`` demand ``D_ct`` as a share of capacity: busy-hour load × profile shape × weekend
    factor × log-normal day and hour noise (drawn in this order)."""
    C, H = p.cells, len(hour)
    names = list(PROFILES)
    shape = np.stack([diurnal_profile(hour + 0.5, n) for n in names])[cells.profile]
    wk = np.array([p.weekend_factor[n] for n in names])[cells.profile][:, None]
    w = np.where(weekend[None, :], wk, 1.0)
    busy = rng.uniform(*p.busy_hour_load, C)[:, None]
    s_d, s_h = p.day_noise, p.traffic_noise
    day_f = np.exp(s_d * rng.standard_normal((C, p.days)) - s_d**2 / 2)[:, day]
    hour_f = np.exp(s_h * rng.standard_normal((C, H)) - s_h**2 / 2)
    return busy * shape * w * day_f * hour_f


def _es_modes(p: EnergyParams, cells: _Cells, load: np.ndarray, hour: np.ndarray) -> np.ndarray:
    """Energy-saving mode (index in :data:`ES_MODES`) per cell-hour from the load before energy saving, in
    priority order sleep, carrier shutdown, symbol shutdown."""
    a, b = p.sleep_hours
    night = (hour >= a) & (hour < b)
    sleep = cells.may_sleep[:, None] & night[None, :] & (load < p.sleep_below)
    carrier = ~sleep & cells.es_on[:, None] & (cells.carriers[:, None] == 2) & (load < p.carrier_shutdown_below)
    symbol = ~sleep & ~carrier & cells.es_on[:, None] & (load < p.symbol_shutdown_below)
    return np.select([sleep, carrier, symbol], [3, 2, 1], 0)


def _carried_load_and_power(p: EnergyParams, cells: _Cells, load: np.ndarray, es: np.ndarray
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PRBs used, PRB load of the carriers that are on, and EARTH input power (W) per cell-hour in the
    energy-saving modes ``es``."""
    sleep, carrier, symbol = es == 3, es == 2, es == 1
    k = cells.carriers[:, None].astype(np.float64)
    k_on = np.where(carrier, 1.0, np.where(sleep, 0.0, k))
    prbs = cells.prbs[:, None]
    used_prbs = np.where(sleep, 0.0, load * k * prbs)
    active_load = np.where(k_on > 0, used_prbs / np.maximum(k_on * prbs, 1.0), 0.0)
    n_trx, p0, dp, psl = cells.n_trx[:, None], cells.p0[:, None], cells.dp[:, None], cells.psl[:, None]
    p0_eff = p0 * np.where(symbol, 1.0 - p.symbol_shutdown_saving * (1.0 - active_load), 1.0)
    on_w = earth_power(n_trx, p0_eff, dp, cells.p_conf[:, None] * active_load, psl)
    off_w = earth_power(n_trx, p0, dp, 0.0, psl, sleeping=True)
    return used_prbs, active_load, k_on * on_w + (k - k_on) * off_w


def _bits_and_energy(p: EnergyParams, cells: _Cells, used_prbs: np.ndarray, power_w: np.ndarray,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Served bits, metered energy (kWh) and energy efficiency (bit/J) per cell-hour; the spectral-efficiency
    noise is drawn before the meter noise."""
    C, H = used_prbs.shape
    se = cells.se_mean[:, None] * np.exp(p.se_noise * rng.standard_normal((C, H)) - p.se_noise**2 / 2)
    bits = se * used_prbs * PRB_HZ * 3600.0
    s_m = p.meter_noise
    kwh = power_w / 1000.0 * np.exp(s_m * rng.standard_normal((C, H)) - s_m**2 / 2)
    return bits, kwh, energy_efficiency(bits, kwh * 3.6e6)


def _features(cells: _Cells, es: np.ndarray, active_load: np.ndarray, hour: np.ndarray, weekend: np.ndarray
              ) -> np.ndarray:
    """The :data:`FEATURES` matrix (float32), one row per cell-hour, cell by cell."""
    C, H = active_load.shape

    def per_cell(v: np.ndarray) -> np.ndarray:
        return np.repeat(v, H)

    prev = np.concatenate([active_load[:, :1], active_load[:, :-1]], axis=1)
    onehot_t = np.eye(len(CELL_TYPES))[cells.ctype]
    onehot_es = np.eye(len(ES_MODES))[es.reshape(-1)]
    cols = [
        *(per_cell(onehot_t[:, i]) for i in range(len(CELL_TYPES))),
        per_cell(cells.carriers), per_cell(cells.n_trx), per_cell(cells.carriers * cells.bw),
        per_cell(10 * np.log10(cells.p_conf * 1000.0)),
        *(onehot_es[:, i] for i in range(len(ES_MODES))),
        np.tile(np.sin(2 * np.pi * hour / 24), C), np.tile(np.cos(2 * np.pi * hour / 24), C),
        np.tile(weekend.astype(np.float64), C), active_load.reshape(-1), prev.reshape(-1),
    ]
    return np.stack(cols, axis=1).astype(np.float32)


def generate(p: EnergyParams, seed: int) -> ScenarioData:
    """Generate the energy-saving table for ``p`` and ``seed`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    C, D = p.cells, p.days
    H = D * 24
    cells = _draw_cells(p, rng)
    hour = np.arange(H) % 24
    day = np.arange(H) // 24
    weekend = (day % 7) >= 5
    demand = _demand(p, cells, hour, day, weekend, rng)  # (C, H)
    load = np.minimum(demand, 1.0)  # before energy saving
    es = _es_modes(p, cells, load, hour)
    used_prbs, active_load, power = _carried_load_and_power(p, cells, load, es)
    bits, kwh, ee = _bits_and_energy(p, cells, used_prbs, power, rng)
    test = held_out_days(rng, C, D, p.test_fraction)[:, day]

    X = _features(cells, es, active_load, hour, weekend)
    y = np.stack([kwh.reshape(-1), ee.reshape(-1)], axis=1).astype(np.float32)
    cell_id = np.repeat(np.arange(C), H)
    party = cell_id if p.party_by == "cell" else np.repeat(cells.site, H)
    info = {
        "cell": cell_id.astype(np.int64), "site": np.repeat(cells.site, H).astype(np.int64),
        "cell_type": np.repeat(cells.ctype, H).astype(np.int64),
        "profile": np.repeat(cells.profile, H).astype(np.int64),
        "hour": np.tile(np.arange(H), C).astype(np.int64), "es_mode": es.reshape(-1).astype(np.int64),
        "demand": demand.reshape(-1).astype(np.float32), "power_w": power.reshape(-1).astype(np.float32),
        "bits": bits.reshape(-1).astype(np.float64),
    }
    return ScenarioData(
        name="energy", model_type=SPEC.model_type, task="regression", X=X, y=y, feature_names=FEATURES,
        target_names=TARGETS, party=party.astype(np.int64), test=test.reshape(-1), vertical=VERTICAL,
        params=p.model_dump(mode="json"), seed=int(seed), info=info,
    )


# ------------------------------------------------------------------------------------------------ metrics
def metrics(data: ScenarioData, rows: np.ndarray) -> dict[str, MetricFn]:
    """``energy_consumption_error``, ``energy_efficiency_error`` and ``energy_error`` (their mean): relative
    L1 errors of the predicted ``(kWh, bit/J)`` columns, in natural units (``rows`` selects nothing extra:
    each error only needs the predictions and targets it is given)."""
    return energy_metrics({"consumption": 0, "efficiency": 1})


METRIC_SPECS = tuple(KNOWN[n] for n in ("energy_error", "energy_consumption_error", "energy_efficiency_error"))


# ------------------------------------------------------------------------------------------------ describe
def _shade_es_modes(ax_load: Axes, ax_power: Axes, hours: np.ndarray, mode: np.ndarray) -> None:
    """Shade the runs of ``hours`` in each energy-saving ``mode`` on both axes; legend on ``ax_power``."""
    colours = {1: "C2", 2: "C1", 3: "C4"}
    for code, col in colours.items():
        on = np.concatenate([[False], mode == code, [False]]).astype(np.int8)
        starts, ends = np.flatnonzero(np.diff(on) == 1), np.flatnonzero(np.diff(on) == -1)
        for j, (s, e) in enumerate(zip(starts, ends, strict=True)):
            for ax in (ax_load, ax_power):
                ax.axvspan(hours[s] - 0.5, hours[e - 1] + 0.5, color=col, alpha=0.2, lw=0,
                           label=f"ES: {ES_MODES[code]}" if j == 0 and ax is ax_power else None)
    if (mode > 0).any():
        ax_power.legend(loc="upper right", fontsize=8)


def describe(data: ScenarioData, out_dir: Path) -> tuple[list[str], list[Path]]:
    """Statistics (cells by type, load, kWh per cell-day, ES-mode shares, efficiency) and ``energy_week.png``:
    a week of one cell's demand, PRB load and input power, its energy-saving hours shaded."""
    info = data.info
    cell, ctype, es = info["cell"], info["cell_type"], info["es_mode"]
    kwh, ee = data.y[:, 0].astype(np.float64), data.y[:, 1].astype(np.float64)
    load = data.X[:, data.columns(["prb_load"])[0]]
    n_cells = int(cell.max()) + 1
    hours = len(cell) // n_cells
    lines = [
        f"energy: {len(cell)} cell-hours, {n_cells} cells on {int(info['site'].max()) + 1} sites, "
        f"{hours // 24} days, {data.num_parties} parties (by {data.params.get('party_by', 'cell')}), "
        f"{int(data.test.sum())} test rows",
    ]
    first = np.unique(cell, return_index=True)[1]
    for i, t in enumerate(CELL_TYPES):
        m = ctype == i
        if not m.any():
            continue
        lines.append(
            f"  {t:6s} {int((ctype[first] == i).sum()):4d} cells  mean PRB load {load[m].mean():.3f}  "
            f"{kwh[m].sum() / (m.sum() / 24):7.2f} kWh/cell-day  mean EE {ee[m].mean():.4g} bit/J")
    shares = np.bincount(es, minlength=len(ES_MODES)) / len(es)
    lines.append("  ES mode share of hours: " + ", ".join(f"{m} {s:.1%}" for m, s in zip(ES_MODES, shares,
                                                                                       strict=True)))
    lines.append(f"  total {kwh.sum():.1f} kWh, mean {kwh.mean():.3f} kWh per cell-hour")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # the cell whose first week shows the most ES modes, then the most mode changes
    week = info["hour"] < 7 * 24
    modes = np.zeros((n_cells, len(ES_MODES)), dtype=bool)
    modes[cell[week], es[week]] = True
    change = np.concatenate([[False], (np.diff(es) != 0) & (np.diff(cell) == 0)]) & week
    pick = int(np.argmax(modes.sum(1) * 10_000 + np.bincount(cell[change], minlength=n_cells)))
    m = week & (cell == pick)
    h = info["hour"][m]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    ax1.plot(h, np.minimum(info["demand"][m], 1.0), lw=1, color="0.5", label="demand / capacity")
    ax1.plot(h, load[m], lw=1.2, color="C0", label="PRB load of carriers on")
    ax1.set_ylabel("load")
    ax1.legend(loc="upper right", fontsize=8)
    ax2.plot(h, info["power_w"][m], lw=1.2, color="C3")
    ax2.set_ylabel("input power (W)")
    ax2.set_xlabel("hour")
    _shade_es_modes(ax1, ax2, h, es[m])
    fig.suptitle(f"cell {pick} ({CELL_TYPES[int(ctype[m][0])]}), first week")
    fig.tight_layout()
    return lines, [save_figure(fig, out_dir, "energy_week.png")]


SPEC = ScenarioSpec(
    name="energy", model_type="energy saving", task="regression", params=EnergyParams, generate=generate,
    metrics=metrics, metric_specs=METRIC_SPECS, describe=describe, version=1,
)
