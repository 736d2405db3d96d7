"""Built-in split tasks: a built-in dataset's columns shared out among the parties, each part an MLP.

- ``breast_cancer``: 569 x 30, split as FATE's hetero examples do: the leader (guest) holds x0-x9 and
  the label, the follower (host) x10-x29; several followers share x10-x29 in equal blocks.
- ``digits``: 1797 8x8 images; the leader holds the left half (pixel columns 0-3), followers the right
  half (pixel columns 4-7, in blocks of whole pixel columns when there are several followers).
- ``classification``: ``make_classification`` at any size; features split in equal blocks.
- a scenario (:mod:`sluice.data.scenarios`): classification (``kpi_anomaly``, ``coverage`` with
  ``target = "problems"``) or regression (``energy``, ``coverage`` with ``target = "signals"``; the targets
  standardised with the train rows' statistics, one model output per target): its rows in natural units, its
  own held-out rows as the test set and its vertical feature groups as the parties' columns: in topology 6
  the leader holds group 0 (the group that comes with the labels) and follower ``i`` group ``i`` (so
  ``followers`` = groups - 1); where only followers hold features (4A) follower ``i`` holds group ``i - 1``
  (``followers`` = groups). The leader scores the scenario's type-specific errors on the test rows.

Which party holds features depends on the topology: in 4A only followers do (the leader holds labels and the
top model), in 5 (U-shape) only the leader does (the follower holds the middle model), in 6 both do. Every
row has an id ``<dataset>-<row:06d>``; every party generates the whole dataset from the job's seed and keeps
its own columns (a built-in needs no files). The parts are MLPs (Linear, [BatchNorm], activation per hidden
layer) with weights drawn from ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` by a generator seeded with torch's seed,
which :func:`sluice.tasks.split.build_part` sets from the job's seed and the part's name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from sluice.errors import ConfigError, DataError
from sluice.tasks.split import SplitTask
from sluice.tasks.table import Table

if TYPE_CHECKING:
    from sluice.data.scenarios import ScenarioData

_ACT = {"relu": nn.ReLU, "tanh": nn.Tanh}
_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_TOPOLOGIES = {"4A": (False, True), "5": (True, False), "6": (True, True)}
"""Per topology: (the leader holds features, the followers hold features)."""


@dataclass(frozen=True)
class _Dataset:
    """A whole built-in dataset as a party would see it if it held every column."""

    name: str
    ids: np.ndarray
    X: np.ndarray
    y: np.ndarray
    outputs: int
    image_width: int | None = None
    scenario: ScenarioData | None = None

    def groups(self) -> list[list[int]] | None:
        if self.scenario is None:
            return None
        return [[int(c) for c in self.scenario.columns(g)] for g in self.scenario.vertical]


@lru_cache(maxsize=8)
def _scenario(name: str, params_json: str, seed: int) -> _Dataset:
    from sluice.data.scenarios import load_scenario

    data = load_scenario(name, json.loads(params_json), seed)
    ids = np.array([f"{name}-{i:06d}" for i in range(len(data.y))])
    X = data.X.astype(np.float64)
    if data.task == "regression":
        y = data.scaled()[1].reshape(len(ids), -1)
        return _Dataset(name, ids, X, y, y.shape[1], scenario=data)
    classes = max(int(data.y.max()) + 1, len(data.target_names))
    return _Dataset(name, ids, X, data.y.astype(np.int64), classes, scenario=data)


@lru_cache(maxsize=8)
def _dataset(name: str, n_samples: int, n_features: int, n_informative: int, n_classes: int, seed: int) -> _Dataset:
    from sluice.data.datasets import raw_dataset

    if name in ("breast_cancer", "digits"):
        X, y = raw_dataset(name)
        width = 8 if name == "digits" else None
    else:
        from sklearn.datasets import make_classification

        if n_informative > n_features:
            raise DataError(f"data.n_informative ({n_informative}) must be <= data.n_features ({n_features})")
        if n_classes * 2 > 2**n_informative:
            raise DataError(f"data.n_classes={n_classes} needs more informative columns")
        X, y = make_classification(n_samples=n_samples, n_features=n_features, n_informative=n_informative,
                                   n_redundant=0, n_classes=n_classes, random_state=seed)
        width = None
    ids = np.array([f"{name}-{i:06d}" for i in range(len(y))])
    return _Dataset(name, ids, X.astype(np.float64), y.astype(np.int64), int(y.max()) + 1, image_width=width)


def _blocks(n_features: int, width: int | None, parts: int, offset: int = 0) -> list[list[int]]:
    """Split columns ``offset..`` into ``parts`` contiguous blocks (whole pixel columns for images)."""
    if width is None:
        cols = np.arange(offset, n_features)
        if parts > len(cols):
            raise DataError(f"cannot give {parts} parties a column each out of {len(cols)} columns")
        return [[int(c) for c in b] for b in np.array_split(cols, parts)]
    pix = np.arange(offset, width)
    if parts > len(pix):
        raise DataError(f"cannot split {len(pix)} pixel columns between {parts} parties")
    rows = n_features // width
    return [sorted(int(r * width + c) for r in range(rows) for c in b) for b in np.array_split(pix, parts)]


def _scenario_columns(ds: _Dataset, lead: bool, k: int, topology: str) -> tuple[list[int], list[list[int]]]:
    groups = ds.groups()
    assert groups is not None
    want = len(groups) - 1 if lead else len(groups)
    if k != want:
        raise DataError(f"scenario {ds.name} splits its features into {len(groups)} vertical groups "
                        f"({'leader + ' if lead else ''}followers), so topology {topology} needs "
                        f"followers = {want}, got {k}")
    return (groups[0] if lead else []), [list(g) for g in (groups[1:] if lead else groups)]


def columns_of(ds: _Dataset, topology: str, k: int, leader_columns: list[int] | None,
               follower_columns: list[list[int]] | None) -> tuple[list[int], list[list[int]]]:
    """(leader columns, follower columns) of a built-in dataset for a topology and ``k`` followers."""
    lead, feat = _TOPOLOGIES[topology]
    n = ds.X.shape[1]
    if ds.scenario is not None and leader_columns is None and follower_columns is None and feat:
        return _scenario_columns(ds, lead, k, topology)
    if not feat:  # U-shape: the leader holds every feature, the follower a middle part
        leader = list(range(n)) if leader_columns is None else list(leader_columns)
        followers = [[]] if follower_columns is None else [list(c) for c in follower_columns]
    elif not lead:  # only followers hold features
        leader = [] if leader_columns is None else list(leader_columns)
        followers = _blocks(n, ds.image_width, k) if follower_columns is None else follower_columns
    else:
        if leader_columns is not None:
            leader = list(leader_columns)
        elif ds.name == "breast_cancer":
            leader = list(range(10))
        elif ds.image_width is not None:
            leader = [c for c in range(n) if c % ds.image_width < ds.image_width // 2]
        else:
            leader = _blocks(n, None, k + 1)[0]
        if follower_columns is not None:
            followers = [list(c) for c in follower_columns]
        elif ds.image_width is not None:
            followers = _blocks(n, ds.image_width, k, ds.image_width // 2)
        else:
            rest = [c for c in range(n) if c not in set(leader)]
            followers = [[int(rest[i]) for i in b] for b in np.array_split(np.arange(len(rest)), k)]
    _check_columns(ds, topology, k, leader, followers)
    return leader, [list(c) for c in followers]


def _check_columns(ds: _Dataset, topology: str, k: int, leader: list[int], followers: list[list[int]]) -> None:
    lead, feat = _TOPOLOGIES[topology]
    n = ds.X.shape[1]
    if len(followers) != k:
        raise DataError(f"data.follower_columns lists {len(followers)} followers but followers = {k}")
    for who, cols in [("leader", leader)] + [(f"follower {i + 1}", c) for i, c in enumerate(followers)]:
        bad = [c for c in cols if not 0 <= c < n]
        if bad:
            raise DataError(f"{who} columns {bad[:5]} are out of range; {ds.name} has columns 0-{n - 1}")
    if feat and any(not c for c in followers):
        raise DataError(f"in topology {topology} every follower needs at least one feature column")
    if lead and not leader:
        role = "its bottom model C1" if feat else "the U-shape's first part A1"
        raise DataError(f"in topology {topology} the leader holds features for {role}; give it some columns")


def mlp(in_dim: int, hidden: list[int], out_dim: int, activation: str, final_activation: bool,
        batch_norm: bool, dtype: str) -> nn.Sequential:
    """Linear -> [BatchNorm] -> activation per hidden layer, then Linear [-> activation]; weights from a
    generator seeded with ``torch.initial_seed()``."""
    if activation not in _ACT or dtype not in _DTYPES:
        raise ConfigError(f"model.activation must be one of {', '.join(_ACT)} and model.dtype one of "
                          f"{', '.join(_DTYPES)}, got {activation!r} and {dtype!r}")
    dims = [int(in_dim), *[int(h) for h in hidden], int(out_dim)]
    if any(d <= 0 for d in dims):
        raise ConfigError(f"model layer widths must be positive, got {dims}")
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
        layers.append(nn.Linear(a, b))
        if i < len(dims) - 2:
            if batch_norm:
                layers.append(nn.BatchNorm1d(b))
            layers.append(_ACT[activation]())
        elif final_activation:
            layers.append(_ACT[activation]())
    model = nn.Sequential(*layers).to(_DTYPES[dtype])
    gen = torch.Generator().manual_seed(torch.initial_seed())
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Linear):
                bound = 1.0 / m.in_features**0.5
                m.weight.uniform_(-bound, bound, generator=gen)
                m.bias.uniform_(-bound, bound, generator=gen)
    return model


def builtin_split(dataset: str = "breast_cancer", *, party: str = "leader", followers: int = 1,
                  topology: str = "6", seed: int = 0, n_samples: int = 20_000, n_features: int = 64,
                  n_informative: int = 16, n_classes: int = 2, leader_columns: list[int] | None = None,
                  follower_columns: list[list[int]] | None = None, scenario: dict[str, Any] | None = None,
                  bottom_hidden: list[int] = (32,), embedding: int = 16, top_hidden: list[int] = (32,),
                  middle_hidden: list[int] = (32,), activation: str = "relu", batch_norm: bool = False,
                  dtype: str = "float32") -> SplitTask:
    """``party``'s share of the built-in split task ``dataset`` (see the module docstring)."""
    from sluice.data.scenarios import SCENARIO_NAMES

    if topology not in _TOPOLOGIES:
        raise ConfigError(f"unknown topology {topology!r}; known: {', '.join(_TOPOLOGIES)}")
    if dataset in SCENARIO_NAMES:
        ds = _scenario(dataset, json.dumps(scenario or {}, sort_keys=True), seed)
    else:
        ds = _dataset(dataset, n_samples, n_features, n_informative, n_classes, seed)
    lead_cols, follower_cols = columns_of(ds, topology, followers, leader_columns, follower_columns)
    lead, feat = _TOPOLOGIES[topology]
    emb = int(embedding)

    def part(in_dim: int, hidden: list[int], out: int, final: bool, bn: bool) -> Any:
        return lambda: mlp(in_dim, list(hidden), out, activation, final, bn, dtype)

    if party == "leader":
        cols = np.array(lead_cols, dtype=np.int64)
        table = Table(ds.ids, ds.X[:, cols], ds.y, tuple(f"x{c}" for c in lead_cols),
                      None if ds.scenario is None else ds.scenario.test, name=dataset)
        inputs = 1 if not feat else followers + int(lead)
        return SplitTask(
            table=table, name=dataset,
            bottom=part(len(lead_cols), bottom_hidden, emb, True, batch_norm) if lead else None,
            top=part(emb * inputs, top_hidden, ds.outputs, False, False),
            metric_specs=() if ds.scenario is None else _scenario_specs(dataset),
            row_metrics=None if ds.scenario is None else _row_metrics(ds.scenario),
            model_type=None if ds.scenario is None else ds.scenario.model_type)
    index = _follower_index(party, followers)
    if not feat:
        return SplitTask(name=dataset, bottom=part(emb, middle_hidden, emb, True, batch_norm))
    cols = np.array(follower_cols[index], dtype=np.int64)
    table = Table(ds.ids, ds.X[:, cols], None, tuple(f"x{c}" for c in follower_cols[index]), name=dataset)
    return SplitTask(table=table, name=dataset, bottom=part(len(cols), bottom_hidden, emb, True, batch_norm))


def _follower_index(party: str, followers: int) -> int:
    prefix, _, number = party.rpartition("-")
    if prefix != "follower" or not number.isdigit() or not 1 <= int(number) <= followers:
        raise ConfigError(f"a built-in split task serves 'leader' or 'follower-1'..'follower-{followers}', not "
                          f"{party!r}")
    return int(number) - 1


def _scenario_specs(name: str) -> tuple[Any, ...]:
    from sluice.data.scenarios import get_spec

    return tuple(get_spec(name).metric_specs)


def _row_metrics(data: ScenarioData) -> Any:
    from sluice.data import scenarios

    return lambda rows: scenarios.scaled_metric_fns(data, rows, scenarios.get_spec(data.name))
