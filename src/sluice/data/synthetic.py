"""The FedProx Synthetic(alpha, beta) generator.

Li et al. 2020, "Federated Optimization in Heterogeneous Networks", section 5.1
(its "devices" are Sluice's clients). For client ``k``:

* model skew: ``u_k ~ N(0, alpha)``, ``W_k[j, c] ~ N(u_k, 1)`` (``d x C``), ``b_k[c] ~ N(u_k, 1)``;
* data skew: ``B_k ~ N(0, beta)``, ``v_k[j] ~ N(B_k, 1)``, ``x ~ N(v_k, Sigma)`` with ``Sigma`` diagonal,
  ``Sigma_jj = j^-1.2`` for ``j = 1..d``;
* label: ``y = argmax(softmax(x W_k + b_k)) = argmax(x W_k + b_k)``;
* size: ``n_k = floor(LogNormal(4, 2)) + 50`` samples (a heavy-tailed, power-law-like spread).

As in the authors' released generator, ``alpha`` and ``beta`` are the standard deviations of the
normal laws written ``N(0, alpha)`` and ``N(0, beta)``; ``alpha = beta = 0`` still leaves every
client with its own ``W_k, b_k, v_k`` (drawn around 0).
"""

from __future__ import annotations

import numbers

import numpy as np

from sluice.data._checks import check_fraction, check_positive_int, check_seed
from sluice.errors import DataError


def _check_std(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= float(value) < np.inf:
        raise DataError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def synthetic(
    alpha: float,
    beta: float,
    num_clients: int,
    *,
    seed: int = 0,
    num_features: int = 60,
    num_classes: int = 10,
    test_fraction: float = 0.2,
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """Generate Synthetic(alpha, beta) for ``num_clients`` clients.

    Each client's ``n_k`` samples are split into a train part and a held-out part of
    ``max(1, round(test_fraction * n_k))`` samples. Returns ``(clients, X_test, y_test)``: ``clients[k]``
    is client ``k``'s ``(X, y)`` train set (float32 ``(n, d)``, int64 ``(n,)``); the test set pools all
    held-out parts in client order. The same arguments and ``seed`` give the same numbers.
    """
    alpha = _check_std("synthetic alpha", alpha)
    beta = _check_std("synthetic beta", beta)
    num_clients = check_positive_int("num_clients", num_clients)
    d = check_positive_int("num_features", num_features)
    num_classes = check_positive_int("num_classes", num_classes)
    if num_classes < 2:
        raise DataError(f"num_classes must be >= 2 for a classification task, got {num_classes}")
    test_fraction = check_fraction("test_fraction", test_fraction)
    rng = np.random.default_rng(check_seed(seed))

    sizes = np.floor(rng.lognormal(4.0, 2.0, num_clients)).astype(np.int64) + 50
    u = rng.normal(0.0, alpha, num_clients)
    B = rng.normal(0.0, beta, num_clients)
    sd = np.arange(1, d + 1, dtype=np.float64) ** -0.6  # sqrt(Sigma_jj) = (j^-1.2)^(1/2)

    clients: list[tuple[np.ndarray, np.ndarray]] = []
    tests_x: list[np.ndarray] = []
    tests_y: list[np.ndarray] = []
    for k in range(num_clients):
        W = rng.normal(u[k], 1.0, (d, num_classes))
        b = rng.normal(u[k], 1.0, num_classes)
        v = rng.normal(B[k], 1.0, d)
        X = v + sd * rng.standard_normal((int(sizes[k]), d))
        y = np.argmax(X @ W + b, axis=1).astype(np.int64)
        n_test = max(1, round(test_fraction * len(y)))
        n_test = min(n_test, len(y) - 1)
        X32 = X.astype(np.float32)
        clients.append((X32[:-n_test].copy(), y[:-n_test].copy()))
        tests_x.append(X32[-n_test:])
        tests_y.append(y[-n_test:])
    return clients, np.concatenate(tests_x), np.concatenate(tests_y)
