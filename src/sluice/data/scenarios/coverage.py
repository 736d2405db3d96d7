"""Coverage problem analysis: RSRP, RSRQ and SINR of UE positions in a hexagonal network, with labels.

**Layout.** Sites on a hexagonal grid of ``rings`` rings around a centre site (1 ring = 7 sites), inter-site
distance ``isd_m`` (TR 38.901 Table 7.2-1: 500 m UMa, 200 m UMi), three sectors (cells) per site with
boresights 30°, 150° and 270° (the TR 38.901 §7.8 calibration layout), BS height 25 m (UMa) / 10 m (UMi).
``ues_per_cell × cells`` UE positions are dropped uniformly in the sites' hexagons (inradius ISD/2), at
least 35 m (UMa) / 10 m (UMi) from their site (minimum BS-UE distance, Table 7.2-1). A share
``indoor_fraction`` (Table 7.2-1: 80 %) is indoor on floor ``n_fl ~ U{1..N_fl}``, ``N_fl ~ U{4..8}``,
``h_UT = 3 (n_fl − 1) + 1.5`` m; outdoor UEs are at 1.5 m.

**Path loss** (TR 38.901 §7.4.1 Table 7.4.1-1; fc in GHz, distances in m, ``c = 3·10⁸`` m/s):
``d3D = √(d2D² + (h_BS − h_UT)²)``, breakpoint ``d'BP = 4 h'BS h'UT fc·10⁹ / c`` with ``h' = h − h_E``.

* UMa LOS: ``PL1 = 28.0 + 22 log10 d3D + 20 log10 fc`` for ``d2D ≤ d'BP``,
  ``PL2 = 28.0 + 40 log10 d3D + 20 log10 fc − 9 log10(d'BP² + (h_BS − h_UT)²)`` beyond; σ_SF = 4 dB.
* UMa NLOS: ``max(PL_LOS, 13.54 + 39.08 log10 d3D + 20 log10 fc − 0.6 (h_UT − 1.5))``; σ_SF = 6 dB.
* UMi street canyon LOS: ``PL1 = 32.4 + 21 log10 d3D + 20 log10 fc``,
  ``PL2 = 32.4 + 40 log10 d3D + 20 log10 fc − 9.5 log10(d'BP² + (h_BS − h_UT)²)``; σ_SF = 4 dB.
* UMi NLOS: ``max(PL_LOS, 35.3 log10 d3D + 22.4 + 21.3 log10 fc − 0.3 (h_UT − 1.5))``; σ_SF = 7.82 dB.
* ``h_E = 1`` m (UMi; UMa with probability ``1/(1 + C(d2D, h_UT))``, otherwise uniform on
  ``{12, 15, …, h_UT − 1.5}``), ``C = 0`` for ``h_UT < 13`` m, else ``((h_UT − 13)/10)^1.5 · g(d2D)``,
  ``g = (5/4)(d2D/100)³ exp(−d2D/150)`` for ``d2D > 18`` m (Table 7.4.1-1 note 1). Distances below 10 m
  are clipped to 10 m (the models' lower validity bound).

**LOS probability** (§7.4.2 Table 7.4.2-1, outdoor distance ``d2D-out``): UMi ``1`` for ``d ≤ 18`` m, else
``18/d + exp(−d/36)(1 − 18/d)``; UMa ``1`` for ``d ≤ 18`` m, else
``[18/d + exp(−d/63)(1 − 18/d)] (1 + C'(h_UT) (5/4)(d/100)³ exp(−d/150))``, ``C' = 0`` for ``h_UT ≤ 13`` m,
``((h_UT − 13)/10)^1.5`` above. The LOS state of a UE-site link is spatially consistent: ``LOS ⇔ Φ(Z) <
P_LOS`` with ``Z`` a correlated Gaussian field per site (decorrelation distance: the NLOS shadowing one —
a documented choice; §7.6.3 gives its own, not checked here).

**Shadowing.** Log-normal, ``SF ~ N(0, σ_SF)`` dB per UE-site link (the three sectors of a site share it),
spatially correlated: a Gaussian field per site and LOS/NLOS state on a square grid (step d_cor/4), built
by filtering white noise with a first-order exponential (AR(1)) filter along each axis, which gives the
correlation ``exp(−(|Δx| + |Δy|)/d_cor)`` — the exponential model of TR 38.901 §7.5 step 1 along the grid
axes (the grid-filter method of WINNER II D1.1.2; its L1 distance is an approximation). Decorrelation
distances, Table 7.5-6: UMa 37 m LOS / 50 m NLOS, UMi 10 m LOS / 13 m NLOS (UMa LOS seen in open
implementations of the table; the others not checked here).

**Outdoor-to-indoor loss** (§7.4.3 Tables 7.4.3-1/-2) for indoor UEs, per UE for every site:
``PL_tw + 0.5 d2D-in + N(0, σ_P)``, ``d2D-in = min`` of two ``U(0, 25)`` m; low-loss
``PL_tw = 5 − 10 log10(0.3·10^(−L_glass/10) + 0.7·10^(−L_concrete/10))``, σ_P = 4.4 dB; high-loss
``5 − 10 log10(0.7·10^(−L_IRRglass/10) + 0.3·10^(−L_concrete/10))``, σ_P = 6.5 dB; ``L_glass = 2 + 0.2 fc``,
``L_IRRglass = 23 + 0.3 fc``, ``L_concrete = 5 + 4 fc``; a share ``low_loss_fraction`` uses the low-loss model.

**Antenna** (§7.3 Table 7.3-1): ``A_V = −min(12 ((θ'' − 90°)/θ3dB)², SLA_V)``,
``A_H = −min(12 (φ''/φ3dB)², A_max)``, ``A = −min(−(A_V + A_H), A_max)``, gain ``G_max + A``, with
θ3dB = φ3dB = 65°, SLA_V = A_max = 30 dB, G_max = 8 dBi; ``θ'' − 90°`` is the UE's depression angle
minus the cell's downtilt (mechanical tilt applied to the separable pattern, an approximation of the
§7.1.3 rotation). UE antenna omnidirectional, 0 dBi.

**Signals** per UE and cell ``j`` (dBm per resource element):
``RSRP_j = P_RE,j + G_j − PL_j − SF_j − L_O2I`` with ``P_RE = P_tx − 10 log10(12 N_RB)``; default ``P_tx`` =
49 dBm (UMa) / 44 dBm (UMi) over 20 MHz, ``N_RB`` = 106 at 15 kHz (TS 38.101-1 Table 5.3.2-1), UE noise
figure 9 dB — the TR 38.901 §7.8 Table 7.8-1 calibration values as quoted by open implementations (not
checked against the table here). Noise per RE ``N = −174 dBm/Hz + 10 log10 Δf + NF``. Each cell has a
load (RE occupancy) ``ρ_j ~ U(load_min, load_max)`` and a transmit power ``P_tx + U(−s, s)`` dB and
downtilt ``tilt + U(−s_t, s_t)`` (configuration spread, a design choice). The serving cell ``s`` is the
strongest. ``SINR = RSRP_s / (Σ_{j≠s} ρ_j RSRP_j + N)`` (linear);
``RSRQ = N_RB·RSRP_s / RSSI`` (TS 38.215 §5.1.3, SS-RSRQ) with the carrier RSSI over ``N_RB`` RBs modelled
as ``RSSI = 12 N_RB (Σ_j ρ_j RSRP_j + N)`` (serving cell included), so more load means lower RSRQ and SINR.

**Problems** (operator conventions, every threshold a parameter; ``best`` = serving RSRP, ``d`` = distance
to the serving site): weak coverage ``best < weak_rsrp_dbm``; coverage hole ``best < hole_rsrp_dbm``;
pilot pollution ``best ≥ weak_rsrp_dbm`` and at least ``pilot_pollution_cells`` other cells within
``pilot_pollution_db`` of ``best``; overshoot ``best ≥ weak_rsrp_dbm`` and ``d > overshoot_isd·ISD``
(served from beyond the first tier of neighbour sites); over coverage ``best > over_coverage_rsrp_dbm`` and
``d > over_coverage_isd·ISD``. A position may have several (``info["flags"]``); its class for the
``problems`` target is the first present in :data:`PRIORITY` (hole before weak coverage, the cause
overshoot before pilot pollution, over coverage last), 0 = none.

**Rows.** Party = the site (gNB) of the serving cell (geographic non-IID, horizontal FL across gNBs);
regions = squares of ``region_m``; ``test`` = a seeded random share ``test_fraction``.
``target = "signals"`` (regression): ``y`` = serving RSRP dBm, RSRQ dB, SINR dB from what is known without
measuring (geometry, configuration, loads); vertical split: serving cell's features (with the labels) |
neighbour-site geometry and loads. ``target = "problems"`` (classification): ``y`` = class from
measurements (serving RSRP/RSRQ/SINR, strongest neighbours' RSRP, distance); vertical split: serving-cell
measurements | neighbour measurements and network data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator
from scipy.signal import lfilter
from scipy.special import ndtr

from sluice.data.scenarios.base import MetricFn, ScenarioData, ScenarioSpec, save_figure
from sluice.errors import DataError
from sluice.metrics import SIGNALS, THRESHOLDS, MetricSpec, coverage_metrics
from sluice.schema import Section

C_LIGHT = 3.0e8  # m/s, TR 38.901 §7.4.1
H_BS = {"UMa": 25.0, "UMi": 10.0}  # m, Table 7.4.1-1 / 7.2-1
ISD = {"UMa": 500.0, "UMi": 200.0}  # m, Table 7.2-1
MIN_DISTANCE = {"UMa": 35.0, "UMi": 10.0}  # m, minimum BS-UE 2D distance, Table 7.2-1
TX_POWER = {"UMa": 49.0, "UMi": 44.0}  # dBm per 20 MHz, Table 7.8-1 as quoted by open implementations
SIGMA_SF = {("UMa", True): 4.0, ("UMa", False): 6.0, ("UMi", True): 4.0, ("UMi", False): 7.82}  # dB
D_COR = {("UMa", True): 37.0, ("UMa", False): 50.0, ("UMi", True): 10.0, ("UMi", False): 13.0}  # m
BORESIGHTS = (30.0, 150.0, 270.0)  # deg, sector azimuths
MAX_INDOOR_M = 25.0  # m, d2D-in upper bound (§7.4.3)

PROBLEMS = ("weak_coverage", "over_coverage", "overshoot", "coverage_hole", "pilot_pollution")
"""The five coverage problems of SPEC T4; column order of ``info["flags"]``, class id = 1 + index."""
CLASSES = ("none", *PROBLEMS)
PRIORITY = ("coverage_hole", "weak_coverage", "overshoot", "pilot_pollution", "over_coverage")
"""Which problem names a position's class when it has several."""
SIGNAL_NAMES = ("rsrp_dbm", "rsrq_db", "sinr_db")

METRIC_SPECS = (
    MetricSpec("rsrp_error", False, 0.0, None),  # RMSE of serving RSRP, dB
    MetricSpec("rsrq_error", False, 0.0, None),  # RMSE of RSRQ, dB
    MetricSpec("sinr_error", False, 0.0, None),  # RMSE of SINR, dB
    MetricSpec("problem_ratio_error", False, 0.0, 1.0),  # mean |ρ̂_p(r) − ρ_p(r)| over regions and problems
)


class CoverageParams(Section):
    """Parameters of the coverage scenario (units in the names; sources in the module docstring)."""

    scenario: Literal["UMa", "UMi"] = Field("UMa", description="TR 38.901 deployment scenario")
    rings: int = Field(1, ge=1, le=3, description="rings of sites around the centre site (1 → 7 sites)")
    isd_m: float | None = Field(None, gt=0, description="inter-site distance; None: 500 m UMa, 200 m UMi")
    ues_per_cell: int = Field(200, ge=1, le=5000, description="UE positions dropped per cell")
    fc_ghz: float = Field(3.5, ge=0.5, le=100.0, description="carrier frequency (path-loss validity range)")
    n_rb: int = Field(106, ge=1, le=275, description="resource blocks of the carrier (106 = 20 MHz at 15 kHz)")
    scs_khz: Literal[15, 30, 60] = Field(15, description="subcarrier spacing")
    tx_power_dbm: float | None = Field(None, description="BS power over the carrier; None: 49 UMa, 44 UMi")
    tx_power_spread_db: float = Field(3.0, ge=0, description="per-cell power offset ~ U(−s, s)")
    downtilt_deg: float = Field(12.0, ge=-10, le=45, description="mean sector downtilt")
    downtilt_spread_deg: float = Field(2.0, ge=0, description="per-cell downtilt offset ~ U(−s, s)")
    noise_figure_db: float = Field(9.0, ge=0, description="UE noise figure")
    indoor_fraction: float = Field(0.8, ge=0, le=1, description="share of indoor UEs (Table 7.2-1: 0.8)")
    low_loss_fraction: float = Field(0.5, ge=0, le=1, description="indoor UEs with the low-loss O2I model")
    load_min: float = Field(0.3, gt=0, le=1, description="lowest cell load (RE occupancy)")
    load_max: float = Field(0.9, gt=0, le=1, description="highest cell load (RE occupancy)")
    weak_rsrp_dbm: float = Field(THRESHOLDS["rsrp"], description="weak coverage below this RSRP")
    hole_rsrp_dbm: float = Field(-120.0, description="coverage hole below this RSRP")
    rsrq_threshold_db: float = Field(THRESHOLDS["rsrq"], description="poor quality below (coverage_ratio_error_rsrq)")
    sinr_threshold_db: float = Field(THRESHOLDS["sinr"], description="interference below (coverage_ratio_error_sinr)")
    pilot_pollution_db: float = Field(6.0, gt=0, description="window below the best cell for pilot pollution")
    pilot_pollution_cells: int = Field(3, ge=1, le=10, description="other cells in the window for pollution")
    overshoot_isd: float = Field(1.0, gt=0, description="overshoot: serving site farther than this × ISD")
    over_coverage_rsrp_dbm: float = Field(-85.0, description="over coverage: RSRP above this ...")
    over_coverage_isd: float = Field(0.5, gt=0, description="... farther than this × ISD from its site")
    region_m: float = Field(200.0, gt=0, description="side of the square regions problem ratios are taken in")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="held-out share of the rows")
    target: Literal["signals", "problems"] = Field("signals", description="regression of signals or "
                                                                          "classification of problems")

    @model_validator(mode="after")
    def _consistent(self) -> CoverageParams:
        if self.load_min > self.load_max:
            raise ValueError(f"load_min {self.load_min} > load_max {self.load_max}")
        if self.hole_rsrp_dbm >= self.weak_rsrp_dbm:
            raise ValueError(f"hole_rsrp_dbm {self.hole_rsrp_dbm} must be below weak_rsrp_dbm {self.weak_rsrp_dbm}")
        if self.over_coverage_rsrp_dbm <= self.weak_rsrp_dbm:
            raise ValueError(f"over_coverage_rsrp_dbm {self.over_coverage_rsrp_dbm} must be above weak_rsrp_dbm "
                             f"{self.weak_rsrp_dbm}")
        if self.isd_m is not None and self.isd_m <= 2 * MIN_DISTANCE[self.scenario]:
            raise ValueError(f"isd_m must exceed {2 * MIN_DISTANCE[self.scenario]} m for {self.scenario}")
        return self

    @property
    def isd(self) -> float:
        return self.isd_m if self.isd_m is not None else ISD[self.scenario]

    @property
    def tx_power(self) -> float:
        return self.tx_power_dbm if self.tx_power_dbm is not None else TX_POWER[self.scenario]


# ------------------------------------------------------------------------------------- radio models
def _check_scenario(scenario: str) -> None:
    if scenario not in H_BS:
        raise DataError(f"scenario must be 'UMa' or 'UMi', got {scenario!r}")


def los_probability(scenario: str, d2d_out: np.ndarray, h_ut: np.ndarray | float = 1.5) -> np.ndarray:
    """TR 38.901 Table 7.4.2-1 LOS probability for outdoor distance ``d2d_out`` (m) and UE height (m)."""
    _check_scenario(scenario)
    d = np.maximum(np.asarray(d2d_out, dtype=np.float64), 1e-9)
    h = np.broadcast_to(np.asarray(h_ut, dtype=np.float64), d.shape)
    d1, d2 = 18.0, (63.0 if scenario == "UMa" else 36.0)
    p = d1 / d + np.exp(-d / d2) * (1 - d1 / d)
    if scenario == "UMa":
        c = np.where(h <= 13, 0.0, ((np.maximum(h, 13) - 13) / 10) ** 1.5)
        p = p * (1 + c * 1.25 * (d / 100) ** 3 * np.exp(-d / 150))
    return np.where(d <= d1, 1.0, np.minimum(p, 1.0))


def path_loss_db(scenario: str, d2d: np.ndarray, h_ut: np.ndarray | float, fc_ghz: float, los: np.ndarray | bool,
                 h_e: np.ndarray | float = 1.0) -> np.ndarray:
    """TR 38.901 Table 7.4.1-1 basic path loss (dB, no shadowing) of UMa or UMi street canyon.

    ``d2d`` (m, clipped to ≥ 10 m), ``h_ut`` UE height (m), ``los`` LOS state, ``h_e`` effective environment
    height (m, 1 m except UMa draws, see :func:`effective_height`).
    """
    _check_scenario(scenario)
    d2 = np.maximum(np.asarray(d2d, dtype=np.float64), 10.0)
    h = np.asarray(h_ut, dtype=np.float64)
    hbs = H_BS[scenario]
    d3 = np.sqrt(d2**2 + (hbs - h) ** 2)
    dbp = 4 * (hbs - h_e) * (h - h_e) * fc_ghz * 1e9 / C_LIGHT
    lf = 20 * math.log10(fc_ghz)
    if scenario == "UMa":
        pl1 = 28.0 + 22 * np.log10(d3) + lf
        pl2 = 28.0 + 40 * np.log10(d3) + lf - 9 * np.log10(dbp**2 + (hbs - h) ** 2)
        nlos = 13.54 + 39.08 * np.log10(d3) + lf - 0.6 * (h - 1.5)
    else:
        pl1 = 32.4 + 21 * np.log10(d3) + lf
        pl2 = 32.4 + 40 * np.log10(d3) + lf - 9.5 * np.log10(dbp**2 + (hbs - h) ** 2)
        nlos = 35.3 * np.log10(d3) + 22.4 + 21.3 * math.log10(fc_ghz) - 0.3 * (h - 1.5)
    pl_los = np.where(d2 <= dbp, pl1, pl2)
    return np.where(los, pl_los, np.maximum(pl_los, nlos))


def effective_height(scenario: str, d2d: np.ndarray, h_ut: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``h_E`` per link: 1 m, or for UMa with probability ``C/(1 + C)`` uniform on ``{12, 15, …, h_UT − 1.5}``."""
    d = np.asarray(d2d, dtype=np.float64)
    h = np.broadcast_to(np.asarray(h_ut, dtype=np.float64), d.shape)
    he = np.ones_like(d)
    if scenario != "UMa":
        return he
    g = np.where(d > 18, 1.25 * (d / 100) ** 3 * np.exp(-d / 150), 0.0)
    c = np.where(h < 13, 0.0, ((np.maximum(h, 13) - 13) / 10) ** 1.5) * g
    draw = rng.random(d.shape) >= 1 / (1 + c)
    steps = np.floor((h - 1.5 - 12) / 3).astype(np.int64) + 1  # how many of 12, 15, … are ≤ h_UT − 1.5
    pick = 12 + 3 * np.floor(rng.random(d.shape) * np.maximum(steps, 1))
    return np.where(draw & (steps >= 1), pick, he)


def antenna_gain_db(azimuth_off_deg: np.ndarray, depression_deg: np.ndarray, downtilt_deg: np.ndarray | float,
                    g_max: float = 8.0, beamwidth_deg: float = 65.0, a_max: float = 30.0,
                    sla_v: float = 30.0) -> np.ndarray:
    """TR 38.901 Table 7.3-1 sector element gain (dBi) at ``φ''`` = azimuth off boresight and
    ``θ'' − 90°`` = depression angle − downtilt (degrees)."""
    a_v = -np.minimum(12 * ((depression_deg - downtilt_deg) / beamwidth_deg) ** 2, sla_v)
    a_h = -np.minimum(12 * (azimuth_off_deg / beamwidth_deg) ** 2, a_max)
    return g_max - np.minimum(-(a_v + a_h), a_max)


def o2i_loss_db(fc_ghz: float, d2d_in: np.ndarray, low_loss: np.ndarray, normal: np.ndarray) -> np.ndarray:
    """TR 38.901 §7.4.3 O2I loss ``PL_tw + 0.5 d2D-in + σ_P·normal`` (low- or high-loss model per UE)."""
    l_glass, l_irr, l_conc = 2 + 0.2 * fc_ghz, 23 + 0.3 * fc_ghz, 5 + 4 * fc_ghz
    tw_low = 5 - 10 * math.log10(0.3 * 10 ** (-l_glass / 10) + 0.7 * 10 ** (-l_conc / 10))
    tw_high = 5 - 10 * math.log10(0.7 * 10 ** (-l_irr / 10) + 0.3 * 10 ** (-l_conc / 10))
    return np.where(low_loss, tw_low + 4.4 * normal, tw_high + 6.5 * normal) + 0.5 * d2d_in


def correlated_fields(rng: np.random.Generator, count: int, shape: tuple[int, int], step_m: float,
                      d_cor_m: float) -> np.ndarray:
    """``count`` unit-variance Gaussian fields on a grid (rows = y) with correlation
    ``exp(−(|Δx| + |Δy|)/d_cor)``: white noise through a stationary AR(1) filter
    ``z_i = a z_{i−1} + √(1 − a²) e_i``, ``a = exp(−step/d_cor)``, along each axis."""
    a = math.exp(-step_m / d_cor_m)
    b = math.sqrt(1 - a * a)
    ny, nx = shape
    # one extra column: after the pass along y it is a stationary start for the pass along x
    z = rng.standard_normal((count, ny, nx + 1))
    z, _ = lfilter([b], [1.0, -a], z, axis=1, zi=a * rng.standard_normal((count, 1, nx + 1)))
    z, _ = lfilter([b], [1.0, -a], z[:, :, 1:], axis=2, zi=a * z[:, :, :1])
    return z.astype(np.float32)


def hex_sites(rings: int, isd: float) -> np.ndarray:
    """``(S, 2)`` site positions (m) of a hexagonal grid of ``rings`` rings around the origin."""
    pts = [(q, r) for q in range(-rings, rings + 1) for r in range(-rings, rings + 1)
           if max(abs(q), abs(r), abs(q + r)) <= rings]
    pts.sort(key=lambda qr: (max(abs(qr[0]), abs(qr[1]), abs(qr[0] + qr[1])), qr))
    return np.array([(isd * (q + r / 2), isd * math.sqrt(3) / 2 * r) for q, r in pts], dtype=np.float64)


def _drop_in_hexagons(rng: np.random.Generator, sites: np.ndarray, per_site: int, isd: float,
                      d_min: float) -> np.ndarray:
    """``per_site`` uniform positions in each site's hexagon (inradius ISD/2), ≥ ``d_min`` from the site."""
    dirs = np.array([[math.cos(a), math.sin(a)] for a in (0, math.pi / 3, 2 * math.pi / 3)])
    radius = isd / math.sqrt(3)
    out = np.empty((len(sites), per_site, 2))
    for s, centre in enumerate(sites):
        got: list[np.ndarray] = []
        need = per_site
        while need > 0:
            p = rng.uniform(-radius, radius, (2 * need + 16, 2))
            ok = (np.abs(p @ dirs.T) <= isd / 2).all(1) & (np.hypot(p[:, 0], p[:, 1]) >= d_min)
            got.append(p[ok][:need])
            need -= len(got[-1])
        out[s] = centre + np.concatenate(got)
    return out.reshape(-1, 2)


def _wrap_deg(a: np.ndarray) -> np.ndarray:
    return (a + 180.0) % 360.0 - 180.0


# ----------------------------------------------------------------------------------------- labels
def problem_flags(best: np.ndarray, kth_neighbour: np.ndarray, distance: np.ndarray, p: CoverageParams
                  ) -> np.ndarray:
    """``(n, 5)`` bool flags in :data:`PROBLEMS` order from the serving RSRP (dBm), the RSRP of the
    ``pilot_pollution_cells``-th strongest other cell (dBm) and the distance to the serving site (m)."""
    covered = best >= p.weak_rsrp_dbm
    return np.stack([
        ~covered,
        (best > p.over_coverage_rsrp_dbm) & (distance > p.over_coverage_isd * p.isd),
        covered & (distance > p.overshoot_isd * p.isd),
        best < p.hole_rsrp_dbm,
        covered & (kth_neighbour >= best - p.pilot_pollution_db),
    ], axis=1)


def problem_class(flags: np.ndarray) -> np.ndarray:
    """Class id (index in :data:`CLASSES`) of each row: its first problem in :data:`PRIORITY`, 0 if none."""
    cls = np.zeros(len(flags), dtype=np.int64)
    for name in reversed(PRIORITY):
        k = PROBLEMS.index(name)
        cls[flags[:, k]] = k + 1
    return cls


def region_ratios(flags: np.ndarray, regions: np.ndarray) -> np.ndarray:
    """``(R, 5)``: per region (sorted ids) the share of rows with each problem."""
    _, inv = np.unique(regions, return_inverse=True)
    count = np.bincount(inv).astype(np.float64)
    return np.stack([np.bincount(inv, weights=flags[:, k].astype(np.float64), minlength=len(count))
                     for k in range(flags.shape[1])], axis=1) / count[:, None]


def problem_ratio_error(real_flags: np.ndarray, pred_flags: np.ndarray, regions: np.ndarray) -> float:
    """Mean over regions and problems of ``|ρ̂_p(r) − ρ_p(r)|``."""
    if len(regions) == 0:
        raise DataError("no rows to compute problem ratios on")
    return float(np.mean(np.abs(region_ratios(pred_flags, regions) - region_ratios(real_flags, regions))))


# -------------------------------------------------------------------------------------- generation
@dataclass(frozen=True)
class _Cells:
    """Per-cell configuration; cells ``3s``, ``3s + 1`` and ``3s + 2`` are the sectors of site ``s``."""

    site: np.ndarray  # site index
    boresight_deg: np.ndarray
    power_dbm: np.ndarray  # over the carrier
    downtilt_deg: np.ndarray
    load: np.ndarray  # RE occupancy


def _draw_cells(p: CoverageParams, n_sites: int, rng: np.random.Generator) -> _Cells:
    """The sectors of ``n_sites`` sites with their transmit power, downtilt and load (drawn in this order)."""
    n_cells = 3 * n_sites
    power = p.tx_power + rng.uniform(-p.tx_power_spread_db, p.tx_power_spread_db, n_cells)
    tilt = p.downtilt_deg + rng.uniform(-p.downtilt_spread_deg, p.downtilt_spread_deg, n_cells)
    load = rng.uniform(p.load_min, p.load_max, n_cells)
    return _Cells(site=np.repeat(np.arange(n_sites), 3), boresight_deg=np.tile(np.array(BORESIGHTS), n_sites),
                  power_dbm=power, downtilt_deg=tilt, load=load)


@dataclass(frozen=True)
class _Ues:
    """UE positions with their indoor state, height and outdoor-to-indoor loss."""

    pos: np.ndarray  # (n, 2) m
    indoor: np.ndarray
    height_m: np.ndarray
    d_in_m: np.ndarray  # d2D-in, 0 outdoors
    o2i_db: np.ndarray  # O2I loss, 0 outdoors


def _draw_ues(p: CoverageParams, sites: np.ndarray, r_pos: np.random.Generator, r_ue: np.random.Generator) -> _Ues:
    """``3 × ues_per_cell`` positions per site (from ``r_pos``), then from ``r_ue`` indoor state, floor and
    O2I loss of each UE."""
    pos = _drop_in_hexagons(r_pos, sites, 3 * p.ues_per_cell, p.isd, MIN_DISTANCE[p.scenario])
    n = len(pos)
    indoor = r_ue.random(n) < p.indoor_fraction
    floors = r_ue.integers(4, 9, n)
    h_ut = np.where(indoor, 3.0 * np.floor(r_ue.random(n) * floors) + 1.5, 1.5)  # 3 (n_fl − 1) + 1.5
    d_in = np.where(indoor, np.minimum(r_ue.uniform(0, MAX_INDOOR_M, n), r_ue.uniform(0, MAX_INDOOR_M, n)), 0.0)
    o2i = np.where(indoor, o2i_loss_db(p.fc_ghz, d_in, r_ue.random(n) < p.low_loss_fraction,
                                       r_ue.standard_normal(n)), 0.0)
    return _Ues(pos=pos, indoor=indoor, height_m=h_ut, d_in_m=d_in, o2i_db=o2i)


def _fields_at(rng: np.random.Generator, pos: np.ndarray, count: int, d_cor: float) -> np.ndarray:
    """``(n, count)``: ``count`` fields of :func:`correlated_fields` (grid step ``d_cor/4`` over the bounding box
    of ``pos``) at the grid point nearest each position."""
    lo = pos.min(0) - 1.0
    extent = pos.max(0) + 1.0 - lo
    step = d_cor / 4
    nx, ny = (np.ceil(extent / step).astype(int) + 1)
    fields = correlated_fields(rng, count, (ny, nx), step, d_cor)
    ix = np.rint((pos[:, 0] - lo[0]) / step).astype(int)
    iy = np.rint((pos[:, 1] - lo[1]) / step).astype(int)
    return fields[:, iy, ix].T.astype(np.float64)


@dataclass(frozen=True)
class _Links:
    """Geometry and received power of every UE-site and UE-cell link."""

    dxy: np.ndarray  # (n, S, 2) UE position minus site position, m
    d2d: np.ndarray  # (n, S) m
    los: np.ndarray  # (n, S)
    depression_deg: np.ndarray  # (n, S)
    az_off_deg: np.ndarray  # (n, C) azimuth off the cell's boresight
    rsrp_dbm: np.ndarray  # (n, C) per RE


def _links(p: CoverageParams, sites: np.ndarray, cells: _Cells, ues: _Ues, r_field: np.random.Generator,
           r_ue: np.random.Generator) -> _Links:
    """Path loss with spatially consistent LOS state and shadowing per UE-site link (fields from ``r_field``:
    LOS state, LOS shadowing, NLOS shadowing; ``h_E`` from ``r_ue``), antenna gain and RSRP per UE-cell link."""
    sc, n_sites = p.scenario, len(sites)
    h_ut = ues.height_m[:, None]
    dxy = ues.pos[:, None, :] - sites[None, :, :]
    d2d = np.hypot(dxy[..., 0], dxy[..., 1])
    p_los = los_probability(sc, np.maximum(d2d - ues.d_in_m[:, None], 0.0), h_ut)
    los = ndtr(_fields_at(r_field, ues.pos, n_sites, D_COR[sc, False])) < p_los
    sf = np.where(los, SIGMA_SF[sc, True] * _fields_at(r_field, ues.pos, n_sites, D_COR[sc, True]),
                  SIGMA_SF[sc, False] * _fields_at(r_field, ues.pos, n_sites, D_COR[sc, False]))
    h_e = effective_height(sc, d2d, h_ut, r_ue)
    pl = path_loss_db(sc, d2d, h_ut, p.fc_ghz, los, h_e)

    azimuth = np.degrees(np.arctan2(dxy[..., 1], dxy[..., 0]))
    depression = np.degrees(np.arctan2(H_BS[sc] - h_ut, np.maximum(d2d, 1e-9)))
    az_off = _wrap_deg(azimuth[:, cells.site] - cells.boresight_deg[None, :])
    gain = antenna_gain_db(az_off, depression[:, cells.site], cells.downtilt_deg[None, :])
    p_re = cells.power_dbm - 10 * math.log10(12 * p.n_rb)
    rsrp = p_re[None, :] + gain - (pl + sf)[:, cells.site] - ues.o2i_db[:, None]
    return _Links(dxy=dxy, d2d=d2d, los=los, depression_deg=depression, az_off_deg=az_off, rsrp_dbm=rsrp)


def _signals(p: CoverageParams, rsrp: np.ndarray, load: np.ndarray) -> tuple[np.ndarray, ...]:
    """Serving cell, serving RSRP, RSRQ and SINR (dB) from per-cell RSRP (dBm/RE) and cell loads."""
    serving = rsrp.argmax(1)
    rows = np.arange(len(rsrp))
    s_mw = 10 ** (rsrp / 10)
    noise = 10 ** ((-174 + 10 * math.log10(p.scs_khz * 1e3) + p.noise_figure_db) / 10)
    loaded = s_mw * load[None, :]
    serve = s_mw[rows, serving]
    interference = loaded.sum(1) - loaded[rows, serving]
    rssi_per_re = loaded.sum(1) + noise  # RSSI / (12 N_RB)
    rsrq = 10 * np.log10(serve / (12 * rssi_per_re))
    sinr = 10 * np.log10(serve / (interference + noise))
    return serving, rsrp[rows, serving], rsrq, sinr


def _strongest_others(rsrp: np.ndarray, serving: np.ndarray, k: int) -> np.ndarray:
    """``(n, k)``: RSRP (dBm) of the ``k`` strongest cells other than the serving one, strongest first."""
    others = np.sort(np.where(np.arange(rsrp.shape[1])[None, :] == serving[:, None], -np.inf, rsrp), axis=1)
    return others[:, ::-1][:, :k]


def _regions(pos: np.ndarray, region_m: float) -> np.ndarray:
    """Id of the square of side ``region_m`` (from the lowest x and y) each position lies in."""
    grid = np.floor((pos - pos.min(0)) / region_m).astype(np.int64)
    return grid[:, 1] * (int(grid[:, 0].max()) + 1) + grid[:, 0]


def _serving_features(ues: _Ues, cells: _Cells, links: _Links, serving: np.ndarray, site: np.ndarray,
                      dist: np.ndarray) -> dict[str, np.ndarray]:
    """Geometry, UE and configuration of each UE's serving cell (``site`` its site, ``dist`` the distance)."""
    rows = np.arange(len(serving))
    return {
        "x_m": ues.pos[:, 0], "y_m": ues.pos[:, 1],
        "dx_m": links.dxy[rows, site, 0], "dy_m": links.dxy[rows, site, 1],
        "distance_m": dist, "log10_distance": np.log10(np.maximum(dist, 1.0)),
        "azimuth_off_boresight_deg": links.az_off_deg[rows, serving],
        "depression_deg": links.depression_deg[rows, site],
        "ue_height_m": ues.height_m, "indoor": ues.indoor.astype(np.float64),
        "serving_tx_power_dbm": cells.power_dbm[serving], "serving_downtilt_deg": cells.downtilt_deg[serving],
        "serving_load": cells.load[serving],
    }


def _network_features(cells: _Cells, d2d: np.ndarray, serving: np.ndarray, site: np.ndarray
                      ) -> dict[str, np.ndarray]:
    """Distance to and mean load of the two nearest other sites, and the mean load of the other cells."""
    rows = np.arange(len(serving))
    other_d = np.where(np.arange(d2d.shape[1])[None, :] == site[:, None], np.inf, d2d)
    near = np.argsort(other_d, axis=1)[:, :2]
    site_load = cells.load.reshape(-1, 3).mean(1)
    return {
        "nbr_site_distance_1_m": other_d[rows, near[:, 0]], "nbr_site_distance_2_m": other_d[rows, near[:, 1]],
        "nbr_site_load_1": site_load[near[:, 0]], "nbr_site_load_2": site_load[near[:, 1]],
        "mean_other_load": (cells.load.sum() - cells.load[serving]) / (len(cells.load) - 1),
    }


def _target_groups(p: CoverageParams, serving_cols: dict[str, np.ndarray], network_cols: dict[str, np.ndarray],
                   signals: tuple[np.ndarray, np.ndarray, np.ndarray], neighbours: np.ndarray, cls: np.ndarray
                   ) -> tuple[tuple[dict[str, np.ndarray], ...], np.ndarray, tuple[str, ...], str]:
    """Vertical feature groups, ``y``, target names and task of ``p.target`` (see the module docstring).

    ``signals``: serving RSRP, RSRQ, SINR; ``neighbours``: RSRP of the strongest other cells; ``cls``: classes.
    """
    if p.target == "signals":
        return (serving_cols, network_cols), np.stack(signals, axis=1).astype(np.float32), SIGNAL_NAMES, "regression"
    measured = dict(zip(SIGNAL_NAMES, signals, strict=True))
    measured.update({k: serving_cols[k] for k in ("distance_m", "azimuth_off_boresight_deg", "indoor",
                                                  "serving_load")})
    neighbour = {f"nbr_rsrp_{i + 1}_dbm": neighbours[:, i] for i in range(neighbours.shape[1])}
    neighbour.update({k: network_cols[k] for k in ("nbr_site_distance_1_m", "nbr_site_load_1", "mean_other_load")})
    return (measured, neighbour), cls, CLASSES, "classification"


def generate(p: CoverageParams, seed: int) -> ScenarioData:
    """The coverage scenario for parameters ``p`` and ``seed`` (see the module docstring)."""
    ss = np.random.SeedSequence(int(seed))
    r_pos, r_field, r_cell, r_ue, r_split = (np.random.default_rng(s) for s in ss.spawn(5))
    sites = hex_sites(p.rings, p.isd)
    cells = _draw_cells(p, len(sites), r_cell)
    ues = _draw_ues(p, sites, r_pos, r_ue)
    links = _links(p, sites, cells, ues, r_field, r_ue)

    serving, rsrp, rsrq, sinr = _signals(p, links.rsrp_dbm, cells.load)
    n = len(serving)
    rows = np.arange(n)
    site = cells.site[serving]
    neighbours = _strongest_others(links.rsrp_dbm, serving, max(3, p.pilot_pollution_cells))
    dist = links.d2d[rows, site]
    flags = problem_flags(rsrp, neighbours[:, p.pilot_pollution_cells - 1], dist, p)
    cls = problem_class(flags)

    serving_cols = _serving_features(ues, cells, links, serving, site, dist)
    network_cols = _network_features(cells, links.d2d, serving, site)
    groups, y, target_names, task = _target_groups(p, serving_cols, network_cols, (rsrp, rsrq, sinr), neighbours, cls)
    names = tuple(k for g in groups for k in g)
    X = np.stack([g[k] for g in groups for k in g], axis=1).astype(np.float32)

    test = np.zeros(n, dtype=bool)
    test[r_split.permutation(n)[: max(1, round(p.test_fraction * n))]] = True
    info = {
        "region": _regions(ues.pos, p.region_m), "cell": serving.astype(np.int64), "site": site.astype(np.int64),
        "x_m": ues.pos[:, 0], "y_m": ues.pos[:, 1], "distance_m": dist, "los": links.los[rows, site],
        "indoor": ues.indoor, "rsrp_dbm": rsrp, "rsrq_db": rsrq, "sinr_db": sinr, "neighbour_rsrp_dbm": neighbours,
        "flags": flags, "problem": cls, "site_x_m": sites[site, 0], "site_y_m": sites[site, 1],
    }
    return ScenarioData(
        name="coverage", model_type="coverage problem analysis", task=task, X=X, y=y, feature_names=names,
        target_names=target_names, party=site.astype(np.int64), test=test,
        vertical=tuple(tuple(g) for g in groups), params=p.model_dump(mode="json"), seed=int(seed), info=info,
    )


# ----------------------------------------------------------------------------------------- metrics
def _row_index(data: ScenarioData, rows: np.ndarray) -> np.ndarray:
    r = np.asarray(rows)
    if r.dtype == bool and len(r) != len(data.X):
        raise DataError(f"row mask has {len(r)} entries, the scenario has {len(data.X)} rows")
    return np.flatnonzero(r) if r.dtype == bool else r.astype(np.int64)


def metrics(data: ScenarioData, rows: np.ndarray) -> dict[str, MetricFn]:
    """Error functions ``f(prediction, target)`` in natural units for ``rows``.

    ``signals``: the training error ``coverage_error[_rsrp|_rsrq|_sinr]`` (normalised RMSE, 1 for predicting
    the mean) and ``coverage_ratio_error[_rsrp|_rsrq|_sinr]`` (:func:`sluice.metrics.coverage_metrics` with
    this scenario's thresholds and regions), per-signal RMSE ``rsrp_error``/``rsrq_error``/``sinr_error``
    (dB) and ``problem_ratio_error`` with the problems derived from the predicted serving RSRP and the
    measured neighbour RSRP and distance. ``problems``: ``problem_ratio_error`` of the predicted classes (logits or ids)
    against the true ones.
    """
    p = CoverageParams.model_validate(data.params)
    idx = _row_index(data, rows)
    reg = data.info["region"][idx]
    nbr = data.info["neighbour_rsrp_dbm"][idx][:, p.pilot_pollution_cells - 1]
    dist = data.info["distance_m"][idx]
    if data.task == "classification":
        def ratio_classes(pred: np.ndarray, target: np.ndarray) -> float:
            pr = np.asarray(pred)
            pc = pr.argmax(1) if pr.ndim == 2 else pr.astype(np.int64)
            eye = np.eye(len(CLASSES), dtype=bool)[:, 1:]
            return problem_ratio_error(eye[np.asarray(target, dtype=np.int64)], eye[pc], reg)

        return {"problem_ratio_error": ratio_classes}

    fns = coverage_metrics(reg, SIGNALS, {"rsrp": p.weak_rsrp_dbm, "rsrq": p.rsrq_threshold_db,
                                          "sinr": p.sinr_threshold_db})

    def rmse(i: int) -> MetricFn:
        return lambda pred, target: float(np.sqrt(np.mean((np.asarray(pred)[:, i] - np.asarray(target)[:, i]) ** 2)))

    for i, s in enumerate(SIGNALS):
        fns[f"{s}_error"] = rmse(i)

    def ratio_signals(pred: np.ndarray, target: np.ndarray) -> float:
        real = problem_flags(np.asarray(target)[:, 0], nbr, dist, p)
        return problem_ratio_error(real, problem_flags(np.asarray(pred)[:, 0], nbr, dist, p), reg)

    fns["problem_ratio_error"] = ratio_signals
    return fns


# ---------------------------------------------------------------------------------------- describe
MARKERS = {"coverage_hole": ("x", "black"), "weak_coverage": (".", "dimgray"), "overshoot": ("s", "red"),
           "pilot_pollution": ("+", "magenta"), "over_coverage": ("d", "orange")}


def describe(data: ScenarioData, out_dir: Path) -> tuple[list[str], list[Path]]:
    """Statistics as text lines and an RSRP map (``coverage_rsrp_map.png``) in ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    info = data.info
    flags = info["flags"].astype(bool)
    ratios = region_ratios(flags, info["region"])
    per_party = np.bincount(data.party)
    lines = [
        f"coverage scenario ({data.params['scenario']}), seed {data.seed}, target {data.params['target']} "
        f"({data.task})",
        f"rows {len(data.X)} ({int(data.test.sum())} test), features {len(data.feature_names)}, "
        f"parties (sites) {data.num_parties}, rows per party {per_party.min()}-{per_party.max()}, "
        f"cells {int(info['cell'].max()) + 1}, regions {len(ratios)}",
        "problem: share of positions | mean / max share over regions",
    ]
    for k, name in enumerate(PROBLEMS):
        lines.append(f"  {name}: {flags[:, k].mean():.3f} | {ratios[:, k].mean():.3f} / {ratios[:, k].max():.3f}")
    lines.append(f"  class (priority {' > '.join(PRIORITY)}): "
                 + ", ".join(f"{c} {np.mean(info['problem'] == i):.3f}" for i, c in enumerate(CLASSES)))
    for key, unit in (("rsrp_dbm", "dBm"), ("rsrq_db", "dB"), ("sinr_db", "dB")):
        q = np.percentile(info[key], [5, 25, 50, 75, 95])
        lines.append(f"{key.split('_')[0].upper()} {unit} p5/p25/p50/p75/p95: " + " / ".join(f"{v:.1f}" for v in q))
    lines.append(f"LOS share of serving links {np.mean(info['los']):.3f}, indoor {np.mean(info['indoor']):.3f}")
    lines.append("parameters: " + ", ".join(f"{k}={v}" for k, v in data.params.items()))

    fig, ax = plt.subplots(figsize=(8, 7))
    sc = ax.scatter(info["x_m"], info["y_m"], c=info["rsrp_dbm"], s=4, cmap="viridis", lw=0)
    fig.colorbar(sc, ax=ax, label="serving RSRP (dBm per RE)")
    for i, name in enumerate(CLASSES[1:], start=1):
        m = info["problem"] == i
        if m.any():
            marker, colour = MARKERS[name]
            paint = {"facecolors": "none", "edgecolors": colour} if marker == "s" else {"c": colour}
            ax.scatter(info["x_m"][m], info["y_m"][m], marker=marker, s=14, lw=0.8, label=f"{name} ({int(m.sum())})",
                       **paint)
    sites = np.unique(np.stack([info["site_x_m"], info["site_y_m"]], 1), axis=0)
    ax.scatter(sites[:, 0], sites[:, 1], marker="^", s=60, c="red", edgecolors="white", label="site")
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("y (m)")
    ax.set_title(f"{data.params['scenario']}: serving RSRP and coverage problems (class by priority)")
    ax.legend(loc="upper right", fontsize=7, markerscale=1.5)
    fig.tight_layout()
    return lines, [save_figure(fig, out_dir, "coverage_rsrp_map.png")]


SPEC = ScenarioSpec(
    name="coverage",
    model_type="coverage problem analysis",
    task="regression",  # of the default target "signals"; target "problems" gives classification data
    params=CoverageParams,
    generate=generate,
    metrics=metrics,
    metric_specs=METRIC_SPECS,
    describe=describe,
    version=1,
)
