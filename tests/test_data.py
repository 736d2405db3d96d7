"""Datasets, partitioners, the Synthetic(alpha, beta) generator and load_federated."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.data import (
    Dataset,
    FederatedData,
    label_histogram,
    load_dataset,
    load_federated,
    partition,
    synthetic,
)
from sluice.data.config import DataConfig
from sluice.data.datasets import raw_dataset
from sluice.errors import DataError


def _check_cover(parts: list[np.ndarray], n: int, num_clients: int) -> None:
    assert len(parts) == num_clients
    assert all(p.dtype == np.int64 for p in parts)
    assert all(len(p) >= 1 for p in parts), [len(p) for p in parts]
    allidx = np.concatenate(parts)
    assert len(allidx) == n  # no sample twice ...
    assert np.array_equal(np.sort(allidx), np.arange(n))  # ... and none missing


def _mean_entropy(parts: list[np.ndarray], y: np.ndarray, num_classes: int) -> float:
    h = label_histogram(parts, y, num_classes).astype(float)
    p = h / h.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
    return float(ent.mean())


# ---------------------------------------------------------------- datasets


@pytest.mark.parametrize(
    ("name", "n", "d", "c"),
    [("digits", 1797, 64, 10), ("breast_cancer", 569, 30, 2), ("mnist", 5000, 784, 10)],
)
def test_load_dataset_shapes_types_and_scaling(name: str, n: int, d: int, c: int) -> None:
    ds = load_dataset(name, seed=0, test_fraction=0.2)
    assert isinstance(ds, Dataset) and ds.name == name and ds.num_classes == c
    assert len(ds.y_train) + len(ds.y_test) == n
    assert abs(len(ds.y_test) - 0.2 * n) <= 1
    assert ds.X_train.shape == (len(ds.y_train), d) and ds.X_test.shape == (len(ds.y_test), d)
    assert ds.num_features == d
    for arr in (ds.X_train, ds.X_test):
        assert arr.dtype == np.float32 and np.isfinite(arr).all()
    assert ds.y_train.dtype == np.int64 and ds.y_test.dtype == np.int64
    assert set(np.unique(ds.y_train)) == set(range(c)) == set(np.unique(ds.y_test))
    if name == "breast_cancer":
        np.testing.assert_allclose(ds.X_train.mean(axis=0), 0.0, atol=1e-4)
        np.testing.assert_allclose(ds.X_train.std(axis=0), 1.0, atol=1e-3)
        assert np.abs(ds.X_test.mean(axis=0)).max() > 1e-3  # test set uses TRAIN statistics
    else:
        assert ds.X_train.min() >= 0.0 and ds.X_train.max() == pytest.approx(1.0)


def test_load_dataset_stratified_and_seeded() -> None:
    a = load_dataset("digits", seed=3)
    b = load_dataset("digits", seed=3)
    c = load_dataset("digits", seed=4)
    assert np.array_equal(a.X_train, b.X_train) and np.array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.y_train, c.y_train)
    full = np.bincount(np.concatenate([a.y_train, a.y_test]), minlength=10)
    test = np.bincount(a.y_test, minlength=10)
    # stratified: each class's test count is its share of the test set, to within one sample
    assert np.all(np.abs(test - full * len(a.y_test) / full.sum()) <= 1.0)


@pytest.mark.parametrize(("name", "scale"), [("digits", 16.0), ("mnist", 255.0)])
def test_load_dataset_scales_the_raw_samples(name: str, scale: float) -> None:
    X, y = raw_dataset(name)
    assert not X.flags.writeable and not y.flags.writeable and y.dtype == np.int64
    assert X.max() == scale
    ds = load_dataset(name, seed=1)
    pooled = np.concatenate([ds.X_train, ds.X_test])
    expected = X.astype(np.float32) / np.float32(scale)
    # the split only reorders rows: the same multiset of rows
    assert np.array_equal(pooled[np.lexsort(pooled.T)], expected[np.lexsort(expected.T)])


def test_raw_dataset_refuses_unknown_names() -> None:
    with pytest.raises(DataError, match="unknown dataset 'iris'"):
        raw_dataset("iris")


def test_mnist_has_5000_samples() -> None:
    ds = load_dataset("mnist", test_fraction=0.1)
    assert len(ds.y_train) + len(ds.y_test) == 5000
    assert np.array_equal(np.bincount(ds.y_test), np.full(10, 50))


def test_load_dataset_errors() -> None:
    with pytest.raises(DataError, match=r"unknown dataset 'cifar'.*digits, breast_cancer, mnist"):
        load_dataset("cifar")
    with pytest.raises(DataError, match="test_fraction must be a number strictly between 0 and 1"):
        load_dataset("digits", test_fraction=1.5)
    with pytest.raises(DataError, match="seed must be an integer"):
        load_dataset("digits", seed=-1)
    with pytest.raises(DataError, match="both parts hold every class"):
        load_dataset("digits", test_fraction=0.001)


# ---------------------------------------------------------------- partitioners

_Y = np.repeat(np.arange(10), 60)  # 600 samples, 60 per label, sorted by label


@pytest.mark.parametrize("method", ["iid", "dirichlet", "shards"])
@pytest.mark.parametrize("num_clients", [1, 7, 30])
def test_partition_disjoint_complete_nonempty(method: str, num_clients: int) -> None:
    parts = partition(_Y, num_clients, method, alpha=0.1, seed=5)
    _check_cover(parts, len(_Y), num_clients)


@pytest.mark.parametrize("method", ["iid", "dirichlet", "shards"])
def test_partition_is_seeded(method: str) -> None:
    a = partition(_Y, 12, method, seed=1)
    b = partition(_Y, 12, method, seed=1)
    c = partition(_Y, 12, method, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert any(not np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_is_balanced() -> None:
    parts = partition(_Y, 7, "iid", seed=0)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    h = label_histogram(parts, _Y, 10)
    # each client (about 86 samples) sees nearly every label
    assert (h > 0).sum(axis=1).min() >= 8
    assert _mean_entropy(parts, _Y, 10) > 0.9 * np.log(10)


def test_dirichlet_skew_grows_as_alpha_shrinks() -> None:
    ent = {a: _mean_entropy(partition(_Y, 10, "dirichlet", alpha=a, seed=0), _Y, 10) for a in (0.1, 1.0, 100)}
    assert ent[0.1] < ent[1.0] < ent[100]
    assert ent[100] > 0.95 * np.log(10)
    assert ent[0.1] < 0.6 * np.log(10)


def test_dirichlet_never_leaves_a_client_empty() -> None:
    # 20 samples for 20 clients at tiny alpha: redraws alone will not succeed, the top-up must
    y = np.repeat(np.arange(2), 10)
    for seed in range(5):
        parts = partition(y, 20, "dirichlet", alpha=0.01, seed=seed)
        _check_cover(parts, 20, 20)
        assert all(len(p) == 1 for p in parts)


def test_shards_limit_labels_per_client() -> None:
    # num_clients * spc = 60 shards of 10 samples; each label (60 samples) fills whole shards
    for spc in (1, 2, 3):
        num_clients = 60 // spc  # shard size 600 / (num_clients * spc) = 10 divides 60
        parts = partition(_Y, num_clients, "shards", shards_per_client=spc, seed=9)
        _check_cover(parts, len(_Y), num_clients)
        h = label_histogram(parts, _Y, 10)
        assert (h > 0).sum(axis=1).max() <= spc
        assert all(len(p) == 600 // num_clients for p in parts)
    parts = partition(_Y, 10, "shards", seed=0)  # 20 shards of 30: each label fills 2 shards
    assert (label_histogram(parts, _Y, 10) > 0).sum(axis=1).max() <= 2


def test_shards_on_shuffled_labels() -> None:
    y = np.random.default_rng(0).permutation(_Y)
    parts = partition(y, 10, "shards", shards_per_client=2, seed=0)
    _check_cover(parts, len(y), 10)
    assert (label_histogram(parts, y, 10) > 0).sum(axis=1).max() <= 2


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"num_clients": 601, "method": "iid"}, r"num_clients=601 exceeds the number of samples \(600\)"),
        ({"num_clients": 0, "method": "iid"}, r"num_clients must be an integer >= 1"),
        ({"num_clients": 5, "method": "dirichlet", "alpha": 0.0}, r"alpha must be a number > 0"),
        ({"num_clients": 5, "method": "dirichlet", "alpha": -1}, r"alpha must be a number > 0"),
        ({"num_clients": 5, "method": "zipf"}, r"method 'zipf'; allowed: iid, dirichlet, shards"),
        ({"num_clients": 5, "method": "shards", "shards_per_client": 0}, r"shards_per_client must be"),
        ({"num_clients": 400, "method": "shards"}, r"shards_per_client = 400 \* 2 = 800 exceeds"),
        ({"num_clients": 5, "method": "iid", "seed": -3}, r"seed must be an integer"),
    ],
)
def test_partition_errors(kwargs: dict, pattern: str) -> None:
    with pytest.raises(DataError, match=pattern):
        partition(_Y, **kwargs)


@pytest.mark.parametrize("method", ["dirichlet", "shards"])
def test_partition_by_label_rejects_bad_labels(method: str) -> None:
    with pytest.raises(DataError, match="1-D"):
        partition(np.zeros((4, 2), dtype=int), 2, method)
    with pytest.raises(DataError, match="non-negative"):
        partition(np.array([0, -1, 2]), 2, method)
    with pytest.raises(DataError, match="must be integers.*take method 'iid'"):
        partition(np.array([0.5, 1.2, 3.0]), 2, method)


def test_iid_partition_takes_any_targets() -> None:
    """A regression task's float targets, or 2-D targets, split by their number alone."""
    for y in (np.linspace(-1, 1, 9), np.zeros((9, 2))):
        parts = partition(y, 3, "iid", seed=0)
        assert sorted(np.concatenate(parts).tolist()) == list(range(9)) and [len(p) for p in parts] == [3, 3, 3]


def test_label_histogram_counts() -> None:
    y = np.array([0, 1, 1, 2, 2, 2])
    h = label_histogram([np.array([0, 3]), np.array([1, 2, 4, 5])], y, 4)
    assert h.tolist() == [[1, 0, 1, 0], [0, 2, 2, 0]]
    with pytest.raises(DataError, match="out of range"):
        label_histogram([np.array([0])], y, 2)


# ---------------------------------------------------------------- synthetic


def test_synthetic_shapes_and_seed() -> None:
    clients, X_test, y_test = synthetic(1.0, 1.0, 8, seed=2, test_fraction=0.25)
    assert len(clients) == 8
    total_train = 0
    for X, y in clients:
        assert X.dtype == np.float32 and y.dtype == np.int64
        assert X.shape == (len(y), 60) and len(y) >= 37  # n_k >= 50, 75 % kept for training
        assert y.min() >= 0 and y.max() < 10
        total_train += len(y)
    assert X_test.shape == (len(y_test), 60) and X_test.dtype == np.float32
    assert abs(len(y_test) / (len(y_test) + total_train) - 0.25) < 0.02
    again = synthetic(1.0, 1.0, 8, seed=2, test_fraction=0.25)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(clients, again[0], strict=True))
    assert np.array_equal(y_test, again[2])
    other = synthetic(1.0, 1.0, 8, seed=3, test_fraction=0.25)
    assert not np.array_equal(clients[0][0][:5], other[0][0][0][:5])
    c5, _, _ = synthetic(0.5, 0.5, 4, num_features=7, num_classes=3)
    assert c5[0][0].shape[1] == 7 and max(int(y.max()) for _, y in c5) < 3


def test_synthetic_heterogeneity() -> None:
    def feature_mean_spread(beta: float) -> float:
        clients, _, _ = synthetic(0.0, beta, 30, seed=0)
        return float(np.std([X.mean() for X, _ in clients]))

    # client feature means are B_k + noise: their spread grows with beta
    assert feature_mean_spread(3.0) > 2.0 * feature_mean_spread(0.0)

    def total_variation(labels: list[np.ndarray]) -> float:
        pooled = np.bincount(np.concatenate(labels), minlength=10) / sum(len(y) for y in labels)
        tv = [0.5 * np.abs(np.bincount(y, minlength=10) / len(y) - pooled).sum() for y in labels]
        return float(np.mean(tv))

    clients, _, _ = synthetic(1.0, 1.0, 30, seed=1)
    device_labels = [y for _, y in clients]
    # every device labels with its own model, so its label mix is far from the pooled one,
    # unlike an IID split of the same pooled labels
    pooled = np.concatenate(device_labels)
    iid = [pooled[p] for p in partition(pooled, 30, "iid", seed=0)]
    assert total_variation(device_labels) > 0.4
    assert total_variation(device_labels) > 3 * total_variation(iid)


def test_synthetic_labels_follow_the_device_model() -> None:
    # a linear classifier fit on one device should beat chance on that device by a wide margin
    clients, _, _ = synthetic(1.0, 1.0, 3, seed=4)
    X, y = max(clients, key=lambda c: len(c[1]))
    from sklearn.linear_model import LogisticRegression

    acc = LogisticRegression(max_iter=300).fit(X, y).score(X, y)
    assert acc > 0.8


def test_synthetic_errors() -> None:
    with pytest.raises(DataError, match="synthetic alpha must be a finite number >= 0"):
        synthetic(-1.0, 1.0, 3)
    with pytest.raises(DataError, match="synthetic beta"):
        synthetic(1.0, float("nan"), 3)
    with pytest.raises(DataError, match="num_clients must be an integer >= 1"):
        synthetic(1.0, 1.0, 0)
    with pytest.raises(DataError, match="test_fraction"):
        synthetic(1.0, 1.0, 2, test_fraction=0.0)


# ---------------------------------------------------------------- load_federated


def test_load_federated_default_config() -> None:
    cfg = DataConfig()
    fed = load_federated(cfg, seed=0)
    assert isinstance(fed, FederatedData) and fed.name == "digits"
    assert len(fed.clients) == 20 and fed.num_features == 64 and fed.num_classes == 10
    assert sum(fed.sizes) + len(fed.y_test) == 1797
    assert min(fed.sizes) >= 1 and max(fed.sizes) > 2 * min(fed.sizes)  # Dirichlet(0.3) skews sizes
    ds = load_dataset("digits", seed=0)
    assert np.array_equal(fed.X_test, ds.X_test)
    # the client rows are exactly the train rows, each used once
    rows = np.concatenate([X for X, _ in fed.clients])
    assert np.array_equal(np.unique(rows, axis=0), np.unique(ds.X_train, axis=0))
    h = fed.label_histogram()
    assert h.shape == (20, 10) and h.sum() == len(ds.y_train)
    assert "20 clients" in fed.summary()
    again = load_federated(cfg, seed=0)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(fed.clients, again.clients, strict=True))


def test_load_federated_synthetic_and_shards() -> None:
    fed = load_federated(DataConfig(dataset="synthetic", num_clients=6, partition="shards"), seed=1)
    assert len(fed.clients) == 6 and fed.num_features == 60 and fed.num_classes == 10
    assert fed.name.startswith("synthetic")
    fed = load_federated(DataConfig(dataset="breast_cancer", num_clients=5, partition="shards"), seed=0)
    assert (fed.label_histogram() > 0).sum(axis=1).max() <= 2
    with pytest.raises(DataError, match="num_clients=1000 exceeds"):
        load_federated(DataConfig(dataset="breast_cancer", num_clients=1000, partition="iid"), seed=0)
