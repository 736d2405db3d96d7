"""Seeded partitioners that split one labelled dataset among ``N`` clients.

Every partitioner returns ``N`` sorted int64 index arrays that are pairwise disjoint, cover every sample
exactly once, and are each non-empty.

* ``iid``: a uniform random permutation cut into ``N`` nearly equal parts (sizes differ by at most 1); the
  targets may be anything (a regression task's too): only their number counts.
* ``dirichlet`` (label skew, Hsu et al. 2019, "Measuring the Effects of Non-Identical Data
  Distribution for Federated Visual Classification"): for every class ``c`` draw client proportions
  ``p_c ~ Dir(alpha * 1_N)`` and give client ``k`` the ``k``-th slice of class ``c``'s shuffled samples,
  with slice bounds ``floor(n_c * sum_{j<=k} p_c[j])``. Small ``alpha`` puts most of a class on few
  clients (strong skew); large ``alpha`` tends to IID. Draws that leave a client empty are redrawn (up
  to ``_MAX_REDRAWS`` times); if clients are still empty, each empty client takes one sample from the
  client that currently holds the most.
* ``shards`` (McMahan et al. 2017, "Communication-Efficient Learning of Deep Networks from
  Decentralized Data"): sort samples by label (ties in random order), cut the sorted list into
  ``N * shards_per_client`` contiguous shards of nearly equal size, and give each client
  ``shards_per_client`` shards chosen at random without replacement. When every class size is a
  multiple of the shard size, a shard holds one label and a client at most ``shards_per_client`` labels.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from sluice.data._checks import check_labels, check_positive_int, check_seed
from sluice.errors import DataError

PARTITION_METHODS: tuple[str, ...] = ("iid", "dirichlet", "shards")
_MAX_REDRAWS = 100


def partition(
    y: np.ndarray,
    num_clients: int,
    method: str,
    *,
    alpha: float = 0.3,
    shards_per_client: int = 2,
    seed: int = 0,
) -> list[np.ndarray]:
    """Split sample indices ``0..len(y)-1`` among ``num_clients`` clients (see the module docstring).

    ``alpha`` is used by ``dirichlet`` only, ``shards_per_client`` by ``shards`` only. The same
    arguments and ``seed`` give the same partition. Raises :class:`DataError` naming the bad field.
    """
    if method not in PARTITION_METHODS:
        raise DataError(f"unknown partition method {method!r}; allowed: {', '.join(PARTITION_METHODS)}")
    if method == "iid":  # any targets: only their number counts
        labels = np.asarray(y)
    else:
        try:
            labels = check_labels(y)
        except DataError as exc:
            raise DataError(f"{exc}: the {method} partition splits class labels; targets that are not "
                            "labels (a regression task's) take method 'iid'") from None
    num_clients = check_positive_int("num_clients", num_clients)
    seed = check_seed(seed)
    n = len(labels)
    if num_clients > n:
        raise DataError(
            f"num_clients={num_clients} exceeds the number of samples ({n}); "
            f"every client needs at least one sample, so allowed: 1..{n}"
        )
    rng = np.random.default_rng(seed)
    if method == "iid":
        parts = np.array_split(rng.permutation(n), num_clients)
    elif method == "dirichlet":
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not float(alpha) > 0:
            raise DataError(f"alpha must be a number > 0 for the dirichlet partition, got {alpha!r}")
        if not np.isfinite(float(alpha)):
            raise DataError(f"alpha must be finite, got {alpha!r}")
        parts = _dirichlet(labels, num_clients, float(alpha), rng)
    else:
        spc = check_positive_int("shards_per_client", shards_per_client)
        if num_clients * spc > n:
            raise DataError(
                f"shards: num_clients * shards_per_client = {num_clients} * {spc} = {num_clients * spc} "
                f"exceeds the number of samples ({n}); allowed: num_clients * shards_per_client <= {n}"
            )
        parts = _shards(labels, num_clients, spc, rng)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _dirichlet(
    labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Per-class Dirichlet split with redraws and a final top-up so that no client is empty."""
    classes = np.unique(labels)
    by_class = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    parts: list[list[np.ndarray]] = []
    for _ in range(_MAX_REDRAWS):
        parts = [[] for _ in range(num_clients)]
        for idx in by_class:
            p = rng.dirichlet(np.full(num_clients, alpha))
            cuts = np.floor(np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        if all(sum(len(c) for c in pk) > 0 for pk in parts):
            break
    merged = [np.concatenate(pk) if pk else np.empty(0, np.int64) for pk in parts]
    for k in range(num_clients):  # top-up: at most one sample moves per empty client
        if len(merged[k]) == 0:
            donor = int(np.argmax([len(m) for m in merged]))
            take = int(rng.integers(len(merged[donor])))
            merged[k] = merged[donor][take : take + 1]
            merged[donor] = np.delete(merged[donor], take)
    return merged


def _shards(labels: np.ndarray, num_clients: int, spc: int, rng: np.random.Generator) -> list[np.ndarray]:
    """McMahan-style label-sorted shards, ``spc`` random shards per client."""
    perm = rng.permutation(len(labels))
    order = perm[np.argsort(labels[perm], kind="stable")]
    shards = np.array_split(order, num_clients * spc)
    owner = rng.permutation(num_clients * spc).reshape(num_clients, spc)
    return [np.concatenate([shards[s] for s in row]) for row in owner]


def label_histogram(parts: Sequence[np.ndarray], y: np.ndarray, num_classes: int) -> np.ndarray:
    """Return the ``(len(parts), num_classes)`` int64 matrix ``H[k, c] = #{i in parts[k] : y[i] = c}``."""
    labels = check_labels(y)
    num_classes = check_positive_int("num_classes", num_classes)
    if labels.size and labels.max() >= num_classes:
        raise DataError(f"label {int(labels.max())} is out of range for num_classes={num_classes}")
    out = np.zeros((len(parts), num_classes), dtype=np.int64)
    for k, idx in enumerate(parts):
        out[k] = np.bincount(labels[np.asarray(idx, dtype=np.int64)], minlength=num_classes)
    return out
