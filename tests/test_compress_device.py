"""The compressors' and the aggregation's tensor path (sluice.compress.device) against the numpy path.

A GPU client keeps Δ on its device; these tests run the same code on CPU tensors, so that the selection,
the probabilities, the residuals and the aggregate are checked on every machine (tests/test_cuda.py runs
them on a GPU where there is one)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sluice.compress import device as dev
from sluice.compress.estimate import add_estimate, decode_estimate, to_dense, topk_indices
from sluice.compress.stages import cast as cast_stage
from sluice.compress.stages import (
    chain,
    error_feedback,
    keep_probabilities,
    sample,
    to_bytes,
    topk,
)
from sluice.hfl.config import CompressionConfig
from sluice.hfl.server import aggregate
from sluice.wire.vector import decode

RNG = np.random.default_rng(7)


def _vectors() -> list[np.ndarray]:
    heavy = RNG.standard_t(2, size=5000)
    ties = np.round(RNG.normal(size=3000), 1)
    holes = RNG.normal(size=2000) * (RNG.random(2000) < 0.01)
    bad = RNG.normal(size=1000)
    bad[[3, 500]] = [np.nan, np.inf]
    return [heavy, ties, holes, bad]


@pytest.mark.parametrize("k", [1, 17, 400, 999])
def test_topk_indices_and_keep_probabilities_match_numpy(k):
    for x in _vectors():
        t = torch.from_numpy(x)
        np.testing.assert_array_equal(dev.topk_indices(t, k).numpy(), topk_indices(x, k))
        # the tail sums Σa − Σ_{j<c} a_j cancel as c nears d: summation order (threads) shows at 1e-11
        np.testing.assert_allclose(dev.keep_probabilities(t, k).numpy(), keep_probabilities(x, k), rtol=1e-9,
                                   atol=1e-12)


def test_topk_stage_sends_the_same_bytes_from_a_tensor():
    stage = chain(topk(0.05), cast_stage("int8"), to_bytes())
    for x in _vectors():
        a, _ = stage.update(x, stage.init(x.shape[0]), np.random.default_rng(0))
        b, _ = stage.update(torch.from_numpy(x), stage.init(x.shape[0]), np.random.default_rng(0))
        assert a == b


def test_sample_from_a_tensor_is_unbiased_with_the_expected_budget():
    x = RNG.standard_t(2, size=4000)
    k, runs = 200, 400
    stage = sample(k / x.shape[0])
    total, kept = np.zeros_like(x), []
    for i in range(runs):
        payload, _ = stage.update(torch.from_numpy(x), None, np.random.default_rng(i))
        total += to_dense(payload)
        kept.append(payload.indices.shape[0])
        p = keep_probabilities(x, k)[payload.indices]
        np.testing.assert_allclose(payload.values, (x[payload.indices] / p).astype(np.float32), rtol=1e-6)
    assert abs(np.mean(kept) - k) < 3 * np.sqrt(k / runs) + 1
    sure = keep_probabilities(x, k) == 1  # kept every time: their estimate is exact
    np.testing.assert_allclose(total[sure] / runs, x[sure], rtol=1e-6)
    # the rest: the mean of `runs` unbiased estimates, within 5 standard errors of x
    p = keep_probabilities(x, k)[~sure]
    se = np.sqrt(x[~sure] ** 2 * (1 / p - 1) / runs)
    assert np.mean(np.abs(total[~sure] / runs - x[~sure]) <= 5 * se + 1e-9) > 0.99


@pytest.mark.parametrize("main, biased", [(topk(0.02), True), (sample(0.02), False)])
def test_error_feedback_keeps_a_tensor_residual_that_accounts_for_everything(main, biased):
    stage = error_feedback(main, cast_stage("int8"), biased=biased)
    state_np, state_t = stage.init(3000), stage.init(3000)
    rng = np.random.default_rng(3)
    for rnd in range(4):
        x = rng.standard_t(1, size=3000)  # heavy tails: some coordinates above the cap
        x_in = torch.from_numpy(x) + torch.as_tensor(state_t[0])
        out_t, state_t = stage.update(torch.from_numpy(x), state_t, np.random.default_rng(rnd))
        residual = state_t[0]
        assert isinstance(residual, torch.Tensor) and residual.dtype == torch.float64
        sent = torch.from_numpy(to_dense(out_t, 3000))
        if biased:  # deterministic: the numpy path gives the same payload and residual
            out_np, state_np = stage.update(x, state_np, np.random.default_rng(rnd))
            assert out_np == out_t
            np.testing.assert_array_equal(residual.numpy(), state_np[0])
            torch.testing.assert_close(sent + residual, x_in, rtol=1e-12, atol=1e-15)
        else:  # only the rounding of the values sent is kept
            assert torch.all(residual[sent == 0] == 0) and torch.any(residual != 0)
    assert isinstance(dev.to_host(state_t)[0], np.ndarray)


def test_aggregate_of_payloads_equals_the_dense_sum_on_numpy_and_on_a_device():
    d, payloads, weights = 5000, [], [3.0, 1.0, 0.0, 2.5]
    for i, up in enumerate(["sample", "topk", "dense", "randk"]):
        from sluice.compress import make_uplink

        cfg = CompressionConfig(up=up, up_ratio=0.03, up_sure_fp16=up == "sample")
        comp = make_uplink(cfg)
        buf, _ = comp.encode(RNG.normal(size=d), comp.init(d), np.random.default_rng(i))
        payloads.append(decode_estimate(buf, d))
    dense = [to_dense(p, d) for p in payloads]
    expect = np.zeros(d)
    for est, w in zip(dense, weights, strict=True):
        expect += (w / sum(weights)) * est
    np.testing.assert_array_equal(aggregate(payloads, weights, d), expect)
    np.testing.assert_array_equal(aggregate(payloads, weights, d, torch.device("cpu")), expect)
    np.testing.assert_array_equal(aggregate(dense, weights, d), expect)


def test_add_estimate_puts_only_the_entries_on_a_tensor():
    d = 1000
    stage = chain(topk(0.01), cast_stage("fp16"), to_bytes())
    buf, _ = stage.update(RNG.normal(size=d), stage.init(d), np.random.default_rng(0))
    g = torch.ones(d, dtype=torch.float64)
    add_estimate(g, decode(buf), 2.0)
    np.testing.assert_array_equal(g.numpy(), 1 + 2.0 * to_dense(decode(buf)))


def test_decode_estimate_refuses_what_to_dense_refuses():
    from sluice.errors import WireError

    stage = chain(topk(0.1), to_bytes())
    buf, _ = stage.update(RNG.normal(size=100), stage.init(100), np.random.default_rng(0))
    with pytest.raises(WireError, match="length 100, expected 99"):
        decode_estimate(buf, 99)
