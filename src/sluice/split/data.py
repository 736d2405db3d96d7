"""Datasets split by columns across parties (vertical partitioning), with sample ids.

- ``breast_cancer``: 569 x 30, split as FATE's hetero examples do: the leader (guest) holds x0-x9 and
  the label, the follower (host) x10-x29; several followers share x10-x29 in equal blocks.
- ``digits``: 1797 8x8 images; the leader holds the left half (pixel columns 0-3), followers the right
  half (pixel columns 4-7, in blocks of whole pixel columns when there are several followers).
- ``classification``: ``make_classification`` at any size; features split in equal blocks.
- a scenario (:mod:`sluice.data.scenarios`): classification (``kpi_anomaly``, ``coverage`` with
  ``target = "problems"``) or regression (``energy``, ``coverage`` with ``target = "signals"``; the targets
  standardised with the train rows' statistics, one model output per target): its rows in natural units,
  its own held-out rows as the test set and its vertical feature groups as the parties' columns: in
  topology 6 the leader holds group 0 (the group that comes with the labels) and follower ``i`` group
  ``i`` (so ``followers`` = groups − 1); where only followers hold features (4A) follower ``i`` holds group
  ``i − 1`` (``followers`` = groups). The leader evaluates the scenario's type-specific errors on the
  test rows.

Which party holds features depends on the topology: in 4A only followers do (the leader holds labels
and the top model), in 5 (U-shape) only the leader does (the follower holds the middle model), in 6
both do. Every row has an id ``<dataset>-<row:06d>``; train/test membership is a stratified split
seeded by the config (a scenario: its own held-out rows). Each party standardises its own columns with
train-set statistics (a per-column operation, so it needs nothing from the other parties).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split

from sluice.data.datasets import raw_dataset
from sluice.data.scenarios import SCENARIO_NAMES
from sluice.errors import DataError

from .config import SplitConfig, SplitDataConfig
from .topology import topology

if TYPE_CHECKING:
    from sluice.data.scenarios import ScenarioData


@dataclass(frozen=True)
class Table:
    """A whole dataset as one party would see it if it held every column."""

    name: str
    ids: np.ndarray  # str, one per row
    X: np.ndarray  # float64 (rows, features)
    y: np.ndarray  # classification: int64 class ids (rows,); regression: float32 targets (rows, targets)
    outputs: int  # the top model's output width: classes, or regression targets
    task: Literal["classification", "regression"] = "classification"
    image_width: int | None = None  # digits: columns are pixels of rows of this width
    scenario: ScenarioData | None = None  # a generated scenario: test rows, vertical groups, metrics

    def groups(self) -> list[list[int]] | None:
        """A scenario's vertical feature groups as column indices (None for the other datasets)."""
        if self.scenario is None:
            return None
        return [[int(c) for c in self.scenario.columns(g)] for g in self.scenario.vertical]

    def metric_fns(self, test_ids: list[str]) -> dict[str, Any]:
        """A scenario's type-specific errors ``f(outputs, y)`` on the rows ``test_ids`` (outputs: logits, or
        standardised targets; empty for the other datasets)."""
        if self.scenario is None:
            return {}
        from sluice.data import scenarios

        index = {sid: i for i, sid in enumerate(self.ids.tolist())}
        rows = np.array([index[s] for s in test_ids], dtype=np.int64)
        return scenarios.scaled_metric_fns(self.scenario, rows, scenarios.get_spec(self.scenario.name))


@lru_cache(maxsize=8)
def _scenario_table(name: str, params_json: str, seed: int) -> Table:
    from sluice.data.scenarios import load_scenario

    data = load_scenario(name, json.loads(params_json), seed)
    ids = np.array([f"{name}-{i:06d}" for i in range(len(data.y))])
    X = data.X.astype(np.float64)
    if data.task == "regression":
        y = data.scaled()[1].reshape(len(ids), -1)
        return Table(name, ids, X, y, y.shape[1], "regression", scenario=data)
    classes = max(int(data.y.max()) + 1, len(data.target_names))
    return Table(name, ids, X, data.y.astype(np.int64), classes, scenario=data)


@lru_cache(maxsize=8)
def _table(
    name: str, n_samples: int, n_features: int, n_informative: int, n_classes: int, seed: int
) -> Table:
    if name in ("breast_cancer", "digits"):
        X, y = raw_dataset(name)
        width = 8 if name == "digits" else None
    elif name == "classification":
        if n_informative > n_features:
            raise DataError(
                f"data.n_informative ({n_informative}) must be <= data.n_features ({n_features})"
            )
        if n_classes * 2 > 2**n_informative:
            raise DataError(f"data.n_classes={n_classes} needs more informative columns")
        X, y = make_classification(
            n_samples=n_samples,
            n_features=n_features,
            n_informative=n_informative,
            n_redundant=0,
            n_classes=n_classes,
            random_state=seed,
        )
        width = None
    else:
        raise DataError(f"unknown dataset {name!r}; allowed: breast_cancer, digits, classification")
    ids = np.array([f"{name}-{i:06d}" for i in range(len(y))])
    return Table(name, ids, X.astype(np.float64), y.astype(np.int64), int(y.max()) + 1, image_width=width)


def load_table(cfg: SplitDataConfig, seed: int) -> Table:
    """The full table for ``cfg`` (cached; ``seed`` only matters for ``classification`` and scenarios)."""
    if cfg.dataset in SCENARIO_NAMES:
        return _scenario_table(cfg.dataset, json.dumps(cfg.scenario, sort_keys=True), seed)
    return _table(cfg.dataset, cfg.n_samples, cfg.n_features, cfg.n_informative, cfg.n_classes, seed)


def split_ids(table: Table, test_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Stratified train/test split of the sample ids, seeded (a scenario: its own held-out rows)."""
    if table.scenario is not None:
        test = table.scenario.test
        return [str(i) for i in table.ids[~test]], [str(i) for i in table.ids[test]]
    tr, te = train_test_split(
        np.arange(len(table.y)), test_size=test_fraction, random_state=seed, stratify=table.y
    )
    return [str(i) for i in table.ids[np.sort(tr)]], [str(i) for i in table.ids[np.sort(te)]]


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
    out = []
    for b in np.array_split(pix, parts):
        out.append(sorted(int(r * width + c) for r in range(rows) for c in b))
    return out


def default_columns(cfg: SplitConfig, table: Table) -> tuple[list[int], list[list[int]]]:
    """(leader columns, follower columns) for the config's dataset, topology and number of followers."""
    d = cfg.data
    n = table.X.shape[1]
    k = cfg.followers
    topo = topology(cfg.topology)
    followers: list[list[int]]
    groups = table.groups()
    if groups is not None and d.leader_columns is None and d.follower_columns is None and topo.follower_features:
        lead = topo.leader_bottom
        want = len(groups) - 1 if lead else len(groups)
        if k != want:
            raise DataError(f"scenario {table.name} splits its features into {len(groups)} vertical groups "
                            f"({'leader + ' if lead else ''}followers), so topology {topo.name} needs "
                            f"followers = {want}, got {k}")
        return (groups[0] if lead else []), [list(g) for g in (groups[1:] if lead else groups)]
    if not topo.follower_features:  # U-shape: the leader holds every feature, the follower a middle part
        leader = list(range(n)) if d.leader_columns is None else list(d.leader_columns)
        followers = [[]] if d.follower_columns is None else [list(c) for c in d.follower_columns]
    elif not topo.leader_bottom:  # only followers hold features
        leader = [] if d.leader_columns is None else list(d.leader_columns)
        followers = _blocks(n, table.image_width, k) if d.follower_columns is None else d.follower_columns
    else:
        if d.leader_columns is not None:
            leader = list(d.leader_columns)
        elif table.name == "breast_cancer":
            leader = list(range(10))
        elif table.image_width is not None:
            leader = [c for c in range(n) if c % table.image_width < table.image_width // 2]
        else:
            leader = _blocks(n, None, k + 1)[0]
        if d.follower_columns is not None:
            followers = [list(c) for c in d.follower_columns]
        elif table.image_width is not None:
            followers = _blocks(n, table.image_width, k, table.image_width // 2)
        else:
            rest = [c for c in range(n) if c not in set(leader)]
            followers = [[int(rest[i]) for i in b] for b in np.array_split(np.arange(len(rest)), k)]
    if len(followers) != k:
        raise DataError(f"data.follower_columns lists {len(followers)} followers but followers = {k}")
    for who, cols in [("leader", leader)] + [(f"follower {i + 1}", c) for i, c in enumerate(followers)]:
        bad = [c for c in cols if not 0 <= c < n]
        if bad:
            raise DataError(f"{who} columns {bad[:5]} are out of range; {table.name} has columns 0-{n - 1}")
    if topo.follower_features and any(not c for c in followers):
        raise DataError(f"in topology {topo.name} every follower needs at least one feature column")
    if topo.leader_bottom and not leader:
        role = "its bottom model C1" if topo.follower_features else "the U-shape's first part A1"
        raise DataError(f"in topology {topo.name} the leader holds features for {role}; give it some columns")
    return leader, [list(c) for c in followers]


@dataclass
class PartyData:
    """One party's view: its columns of the train and test rows (aligned to the agreed id order)."""

    X_train: np.ndarray
    X_test: np.ndarray
    y_train: np.ndarray | None = None
    y_test: np.ndarray | None = None


def party_data(
    table: Table,
    columns: list[int],
    train_ids: list[str],
    test_ids: list[str],
    with_labels: bool,
    dtype: np.dtype,
    missing_ids: set[str] | None = None,
) -> PartyData:
    """Gather a party's rows by id (raises :class:`DataError` listing ids it does not hold)."""
    index = {sid: i for i, sid in enumerate(table.ids.tolist())}
    missing_ids = missing_ids or set()
    unknown = [s for s in list(train_ids) + list(test_ids) if s not in index or s in missing_ids]
    if unknown:
        raise DataError(
            f"{len(unknown)} of the requested sample ids are not held here (first: {', '.join(unknown[:3])})"
        )
    tr = np.array([index[s] for s in train_ids], dtype=np.int64)
    te = np.array([index[s] for s in test_ids], dtype=np.int64)
    cols = np.array(columns, dtype=np.int64)
    Xtr = table.X[np.ix_(tr, cols)] if len(cols) else np.zeros((len(tr), 0))
    Xte = table.X[np.ix_(te, cols)] if len(cols) else np.zeros((len(te), 0))
    if len(cols):
        mu = Xtr.mean(axis=0)
        sd = Xtr.std(axis=0)
        sd[sd == 0] = 1.0
        Xtr = (Xtr - mu) / sd
        Xte = (Xte - mu) / sd
    return PartyData(
        X_train=Xtr.astype(dtype),
        X_test=Xte.astype(dtype),
        y_train=table.y[tr] if with_labels else None,
        y_test=table.y[te] if with_labels else None,
    )
