"""What every network-analytics scenario generator returns, and the on-disk cache of generated data.

A scenario (``coverage``, ``energy``, ``kpi_anomaly``) is generated from documented models, seeded, and
sized by its parameters (a pydantic :class:`~sluice.schema.Section` of its own). The result is one table
of rows, :class:`ScenarioData`:

* ``X`` float32 ``(n, f)`` with ``feature_names``; ``y`` int64 ``(n,)`` class ids for classification or
  float32 ``(n, k)`` for regression, with ``target_names``. Both are in *natural units* (dBm, dB, kWh,
  bit/J...); :meth:`ScenarioData.scaled` gives the standardised copies engines train on, and metric
  functions undo that scaling before they measure anything.
* ``party`` int64 ``(n,)``: which party (site/gNB or cell) holds the row, for horizontal FL;
  ``vertical``: feature names per party for a vertical split, the first group with the labels.
* ``test`` bool ``(n,)``: held-out rows (seeded).
* ``info``: per-row columns that are not features (region id, cell id, hour, true class labels...), used
  by the type-specific errors and by ``describe``.

Generated data is cached under ``$SLUICE_CACHE`` (default ``~/.cache/sluice``)/``scenarios`` in a
``.npz`` file keyed by the SHA-256 of the scenario name, its parameters, the seed and
:data:`GENERATOR_VERSION` of its module, so a second load with the same parameters reads the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from sluice.errors import DataError
from sluice.files import atomic_path
from sluice.metrics import MetricSpec

MetricFn = Callable[[np.ndarray, np.ndarray], float]


@dataclass
class ScenarioData:
    """One generated scenario: every row, its owner, its split and what its model type measures."""

    name: str
    model_type: str  # SPEC T3 application scenario, e.g. "coverage problem analysis"
    task: Literal["classification", "regression"]
    X: np.ndarray
    y: np.ndarray
    feature_names: tuple[str, ...]
    target_names: tuple[str, ...]
    party: np.ndarray
    test: np.ndarray
    vertical: tuple[tuple[str, ...], ...]
    params: dict[str, Any]
    seed: int
    info: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.X)
        for what, arr in (("y", self.y), ("party", self.party), ("test", self.test), *self.info.items()):
            if len(arr) != n:
                raise DataError(f"scenario {self.name}: {what} has {len(arr)} rows, X has {n}")
        if self.X.shape[1] != len(self.feature_names):
            raise DataError(f"scenario {self.name}: {self.X.shape[1]} features but "
                            f"{len(self.feature_names)} feature names")

    @property
    def num_parties(self) -> int:
        return int(self.party.max()) + 1 if len(self.party) else 0

    def columns(self, names: tuple[str, ...] | list[str]) -> np.ndarray:
        """Indices of the named features, in the given order."""
        pos = {n: i for i, n in enumerate(self.feature_names)}
        missing = [n for n in names if n not in pos]
        if missing:
            raise DataError(f"scenario {self.name} has no feature(s) {missing}")
        return np.array([pos[n] for n in names], dtype=np.int64)

    def scaling(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(x_mean, x_std, y_mean, y_std)`` of the train rows (std 0 → 1; y statistics are 0/1 for
        classification)."""
        tr = ~self.test
        xm = self.X[tr].mean(axis=0)
        xs = self.X[tr].std(axis=0)
        xs[xs == 0] = 1.0
        if self.task == "classification":
            return xm, xs, np.zeros(1, np.float32), np.ones(1, np.float32)
        ym = self.y[tr].mean(axis=0)
        ys = self.y[tr].std(axis=0)
        ys[ys == 0] = 1.0
        return xm, xs, ym, ys

    def scaled(self) -> tuple[np.ndarray, np.ndarray]:
        """``(X, y)`` standardised with the train rows' statistics (y only for regression)."""
        xm, xs, ym, ys = self.scaling()
        X = ((self.X - xm) / xs).astype(np.float32)
        y = self.y if self.task == "classification" else ((self.y - ym) / ys).astype(np.float32)
        return X, y

    def natural(self, y_scaled: np.ndarray) -> np.ndarray:
        """Regression outputs in the scaled space back in natural units (classification: unchanged)."""
        if self.task == "classification":
            return y_scaled
        _, _, ym, ys = self.scaling()
        return np.asarray(y_scaled, dtype=np.float64).reshape(-1, len(ym)) * ys + ym


@dataclass(frozen=True)
class ScenarioSpec:
    """A registered scenario: how to generate it and what its model type measures.

    ``metrics(data, rows)`` returns the type-specific error functions ``f(prediction, target)`` for the
    given rows (a bool mask or indices), taking predictions and targets in NATURAL units; engines call
    them through :func:`scaled_metric_fns`. ``describe(data, out_dir)`` prints nothing, returns the
    statistics as text lines and writes its plots into ``out_dir`` (returning their paths).
    """

    name: str
    model_type: str
    task: Literal["classification", "regression"]
    params: type  # a sluice.schema.Section of the generator's parameters
    generate: Callable[[Any, int], ScenarioData]
    metrics: Callable[[ScenarioData, np.ndarray], dict[str, MetricFn]]
    metric_specs: tuple[MetricSpec, ...]
    describe: Callable[[ScenarioData, Path], tuple[list[str], list[Path]]]
    version: int = 1


def scaled_metric_fns(data: ScenarioData, rows: np.ndarray, spec: ScenarioSpec) -> dict[str, MetricFn]:
    """``spec.metrics`` for ``rows``, wrapped to take engine outputs in the standardised target space."""
    fns = spec.metrics(data, rows)
    if data.task == "classification":
        return fns

    def wrap(f: MetricFn) -> MetricFn:
        return lambda pred, target: f(data.natural(pred), data.natural(target))

    return {k: wrap(f) for k, f in fns.items()}


def save_figure(fig: Any, out_dir: str | Path, name: str) -> Path:
    """Write a matplotlib figure as ``out_dir/name`` (the folder is created), close it, return the path."""
    import matplotlib.pyplot as plt

    path = Path(out_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def cache_dir() -> Path:
    """Where generated scenarios are kept: ``$SLUICE_CACHE/scenarios`` (default ``~/.cache/sluice``)."""
    root = os.environ.get("SLUICE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sluice")
    return Path(root) / "scenarios"


def cache_key(spec: ScenarioSpec, params: Any, seed: int) -> str:
    blob = json.dumps({"name": spec.name, "version": spec.version, "seed": int(seed),
                       "params": params.model_dump(mode="json")}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _save(path: Path, d: ScenarioData) -> None:
    meta = {k: getattr(d, k) for k in ("name", "model_type", "task", "feature_names", "target_names",
                                        "vertical", "params", "seed")}
    arrays = {"X": d.X, "y": d.y, "party": d.party, "test": d.test,
              **{f"info__{k}": v for k, v in d.info.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.savez_compressed(f, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)


def _load(path: Path) -> ScenarioData:
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(z["__meta__"].tobytes().decode())
        arrays = {k: z[k] for k in z.files if k != "__meta__"}
    info = {k.removeprefix("info__"): v for k, v in arrays.items() if k.startswith("info__")}
    return ScenarioData(
        name=meta["name"], model_type=meta["model_type"], task=meta["task"], X=arrays["X"], y=arrays["y"],
        feature_names=tuple(meta["feature_names"]), target_names=tuple(meta["target_names"]),
        party=arrays["party"], test=arrays["test"],
        vertical=tuple(tuple(g) for g in meta["vertical"]), params=meta["params"], seed=meta["seed"],
        info=info,
    )


def load_cached(spec: ScenarioSpec, params: Any, seed: int, *, cache: bool = True) -> ScenarioData:
    """``spec.generate(params, seed)``, read from / written to the cache when ``cache``."""
    if not cache:
        return spec.generate(params, seed)
    path = cache_dir() / f"{spec.name}-{cache_key(spec, params, seed)}.npz"
    if path.is_file():
        try:
            return _load(path)
        except (OSError, ValueError, KeyError):
            path.unlink(missing_ok=True)  # a damaged file is generated again
    data = spec.generate(params, seed)
    try:
        _save(path, data)
    except OSError:
        pass  # a read-only or full disk costs the cache, not the run
    return data
