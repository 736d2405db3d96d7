"""Seeded MLPs and flat parameter vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from sluice.errors import ConfigError
from sluice.models import get_flat, mlp, num_params, set_flat

torch.set_num_threads(1)


def test_mlp_structure_and_size() -> None:
    m = mlp(64, [32, 16], 10)
    linears = [x for x in m.modules() if isinstance(x, nn.Linear)]
    assert [(x.in_features, x.out_features) for x in linears] == [(64, 32), (32, 16), (16, 10)]
    assert sum(isinstance(x, nn.ReLU) for x in m.modules()) == 2
    assert num_params(m) == 64 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10
    assert all(p.dtype == torch.float32 for p in m.parameters())
    out = m(torch.zeros(5, 64))
    assert out.shape == (5, 10)
    logreg = mlp(30, [], 2)
    assert [type(x) for x in logreg] == [nn.Linear] and num_params(logreg) == 62


def test_mlp_is_seeded_and_leaves_global_rng_alone() -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a, b, c = mlp(20, [8], 3, seed=7), mlp(20, [8], 3, seed=7), mlp(20, [8], 3, seed=8)
    assert torch.equal(before, torch.get_rng_state())
    assert np.array_equal(get_flat(a), get_flat(b))
    assert not np.array_equal(get_flat(a), get_flat(c))


def test_mlp_init_follows_the_default_bounds() -> None:
    m = mlp(100, [400], 5, seed=0)
    w1, b1, w2, b2 = (p.detach() for p in m.parameters())
    for w, fan_in in ((w1, 100), (b1, 100), (w2, 400), (b2, 400)):
        bound = 1.0 / fan_in**0.5
        assert w.abs().max() <= bound
        if w.numel() >= 400:
            assert w.abs().max() > 0.95 * bound  # uses the range, not zeros or a tiny scale
    assert abs(float(w1.mean())) < 0.01  # U(-0.1, 0.1) over 40000 values averages near 0


def test_mlp_rejects_bad_sizes() -> None:
    with pytest.raises(ConfigError, match="hidden layer sizes must be integers >= 1"):
        mlp(4, [8, 0], 2)
    with pytest.raises(ConfigError, match="in_dim must be an integer >= 1"):
        mlp(0, [8], 2)
    with pytest.raises(ConfigError, match="out_dim"):
        mlp(4, [8], 2.5)  # type: ignore[arg-type]
    assert num_params(mlp(np.int64(4), [np.int64(3)], 2)) == 4 * 3 + 3 + 3 * 2 + 2


def test_flat_round_trip_and_order() -> None:
    m = mlp(6, [5], 3, seed=1)
    v = get_flat(m)
    assert v.dtype == np.float32 and v.shape == (num_params(m),)
    expected = np.concatenate([p.detach().numpy().ravel() for p in m.parameters()])
    assert np.array_equal(v, expected)
    v[0] += 1.0  # a copy: changing it leaves the model alone
    assert get_flat(m)[0] == pytest.approx(v[0] - 1.0)

    new = np.random.default_rng(0).standard_normal(num_params(m)).astype(np.float32)
    set_flat(m, new)
    assert np.array_equal(get_flat(m), new)
    w1 = m[0].weight.detach().numpy()
    assert np.array_equal(w1, new[: 5 * 6].reshape(5, 6))  # weight of layer 0 comes first, row-major
    assert np.array_equal(m[0].bias.detach().numpy(), new[30:35])
    new[0] = 99.0  # set_flat copies: later edits of the source do not leak into the model
    assert m[0].weight[0, 0].item() != 99.0

    other = mlp(6, [5], 3, seed=2)
    set_flat(other, get_flat(m))
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(m(x), other(x))


def test_set_flat_accepts_float64_and_checks_length() -> None:
    m = mlp(3, [2], 2)
    d = num_params(m)
    set_flat(m, np.arange(d, dtype=np.float64))
    assert get_flat(m).tolist() == [float(i) for i in range(d)]
    with pytest.raises(ValueError, match=rf"shape \({d},\), got \({d + 1},\)"):
        set_flat(m, np.zeros(d + 1, dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        set_flat(m, np.zeros((1, d), dtype=np.float32))


def test_flat_update_trains() -> None:
    # a plain gradient step through the flat view lowers the loss on a separable toy problem
    g = torch.Generator().manual_seed(0)
    X = torch.randn(64, 4, generator=g)
    y = (X[:, 0] > 0).long()
    m = mlp(4, [8], 2, seed=0)
    loss_fn = nn.CrossEntropyLoss()
    first = last = float(loss_fn(m(X), y).detach())
    for _ in range(50):
        m.zero_grad()
        loss = loss_fn(m(X), y)
        loss.backward()
        grad = np.concatenate([p.grad.numpy().ravel() for p in m.parameters()])
        set_flat(m, get_flat(m) - 0.5 * grad)
        last = float(loss.detach())
    assert last < 0.5 * first
