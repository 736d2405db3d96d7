"""Upload compressors: unbiasedness, sampling, top-k, chaining, determinism and byte costs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.compress import (
    Compressor,
    cast,
    chain,
    count_sketch,
    decode_to_dense,
    dense,
    make_uplink,
    randk,
    randk_indices,
    to_bytes,
    to_dense,
    topk,
    topk_indices,
    unsketch,
    value_type,
    zstd,
)
from sluice.compress.values import quantize_sign
from sluice.errors import ConfigError, WireError
from sluice.hfl.config import CompressionConfig
from sluice.wire.vector import FLAG_ZSTD, DensePayload, SketchPayload, SparsePayload, decode, encode

SETTINGS = settings(max_examples=80, deadline=None)


# ---------------------------------------------------------------------------------------- sampling
@SETTINGS
@given(d=st.integers(0, 5000), frac=st.floats(0, 1), seed=st.integers(0, 2**64 - 1))
def test_randk_indices_are_a_sorted_k_subset(d: int, frac: float, seed: int) -> None:
    k = int(round(frac * d))
    idx = randk_indices(d, k, seed)
    assert idx.dtype == np.int64 and idx.shape == (k,)
    assert np.all(np.diff(idx) > 0)
    if k:
        assert 0 <= idx[0] and idx[-1] < d
    assert np.array_equal(idx, randk_indices(d, k, seed))


def _reference_randk(d: int, k: int, seed: int) -> list[int]:
    """Plain-loop statement of the sampler: the first m distinct values of the PCG64 raw stream mapped
    exactly uniformly to [0, d) (Lemire rejection on the high 32 bits); m = k, or d - k (complement)."""
    bitgen = np.random.PCG64(seed)
    m = k if 2 * k <= d else d - k
    seen: list[int] = []
    while len(seen) < m:
        u = int(bitgen.random_raw()) >> 32
        prod = u * d
        if prod & 0xFFFFFFFF < (1 << 32) % d:
            continue
        if prod >> 32 not in seen:
            seen.append(prod >> 32)
    return sorted(seen) if 2 * k <= d else sorted(set(range(d)) - set(seen))


@pytest.mark.parametrize(("d", "k"), [
    (20, 4), (20, 17), (1000, 37), (1000, 999), (3, 1), (2**32 - 1, 50),
    (3 * 2**30, 60),  # 2^32 mod d = 2^30: a quarter of the raw draws is rejected
])
def test_randk_indices_follow_the_stated_stream(d: int, k: int) -> None:
    """Independent of numpy's Generator methods, so senders and receivers on other builds agree."""
    for seed in (0, 12345, 2**64 - 1):
        assert randk_indices(d, k, seed).tolist() == _reference_randk(d, k, seed)


def test_randk_indices_depend_on_the_seed() -> None:
    a = randk_indices(2**32 - 1, 1000, 1)
    b = randk_indices(2**32 - 1, 1000, 2)
    assert a.shape == (1000,) and a[-1] < 2**32 - 1 and not np.array_equal(a, b)
    assert len(set(tuple(randk_indices(20, 4, s)) for s in range(50))) > 40


@pytest.mark.parametrize("k", [3, 14])  # below and above d/2 (complement path)
def test_randk_indices_are_uniform(k: int) -> None:
    """Chi-square test of inclusion counts: each coordinate is kept with probability k/d."""
    d, n = 20, 4000
    counts = np.zeros(d)
    for s in range(n):
        counts[randk_indices(d, k, s)] += 1
    p = k / d
    expected = n * p
    # inclusion indicators of a fixed-size sample are negatively correlated, which only shrinks this
    chi2 = float(np.sum((counts - expected) ** 2 / (expected * (1 - p))))
    assert chi2 < 45.3  # 99.9 % quantile of chi-square with 19 degrees of freedom


def test_randk_indices_refuse_bad_arguments() -> None:
    with pytest.raises(WireError):
        randk_indices(5, 6, 0)
    with pytest.raises(WireError):
        randk_indices(5, 2, -1)


# ------------------------------------------------------------------------------------- unbiasedness
def test_randk_is_unbiased() -> None:
    """Mean of N decoded rand-k estimates is within 5 standard errors of x at every coordinate."""
    rng = np.random.default_rng(0)
    d, n = 40, 3000
    x = rng.standard_normal(d)
    comp = Compressor(chain(randk(0.1), cast("fp32"), to_bytes()))
    state = comp.init(d)
    est = np.empty((n, d))
    for t in range(n):
        buf, state = comp.encode(x, state, rng)
        est[t] = decode_to_dense(buf, d)
    k = 4
    x32 = x.astype(np.float32).astype(np.float64)
    # Var(x_hat_i) = x_i^2 (d/k - 1)
    se = np.abs(x32) * np.sqrt((d / k - 1) / n)
    assert np.all(np.abs(est.mean(axis=0) - x32) < 5 * se + 1e-12)
    # the same data without the d/k scale is far off: the test can tell a biased estimator
    assert np.max(np.abs(est.mean(axis=0) * k / d - x32) / se) > 5


def test_count_sketch_mean_is_unbiased() -> None:
    """Mean of N unsketched estimates (fresh hash seed each time) is within 5 standard errors of x."""
    rng = np.random.default_rng(1)
    d, n, rows, cols = 30, 3000, 3, 6
    x = rng.standard_normal(d)
    stage = count_sketch(rows, cols)
    state = stage.init(d)
    est = np.empty((n, d))
    for t in range(n):
        p, state = stage.update(x, state, rng)
        est[t] = to_dense(p)
    se = est.std(axis=0, ddof=1) / np.sqrt(n)
    x32 = x.astype(np.float32)
    assert np.all(np.abs(est.mean(axis=0) - x32) < 5 * se + 1e-6)
    # one row of 6 buckets for 30 coordinates is noisy: the bound above is not trivially loose
    assert np.mean(np.abs(est[0] - x)) > 0.1


def test_count_sketch_is_linear_and_exact_without_collisions() -> None:
    rng = np.random.default_rng(2)
    d = 200
    x, y = rng.standard_normal(d), rng.standard_normal(d)
    stage = count_sketch(4, cols_ratio=0.25, seed=99)
    st_ = stage.init(d)
    assert st_ == 50
    px, _ = stage.update(x, st_, rng)
    py, _ = stage.update(y, st_, rng)
    pxy, _ = stage.update(x + y, st_, rng)
    assert px.seed == py.seed == 99
    np.testing.assert_allclose(px.table.astype(np.float64) + py.table, pxy.table, rtol=1e-5, atol=1e-5)
    # a single nonzero coordinate collides with nothing: both estimators recover it exactly; the mean
    # leaks s_j(l) s_j(i) e_i / R into coordinates l that share a bucket with it, the median rarely
    e = np.zeros(d)
    e[17] = 3.5
    pe, _ = stage.update(e, st_, rng)
    mean, median = unsketch(pe), unsketch(pe, "median")
    assert mean[17] == 3.5 and median[17] == 3.5
    assert np.all(np.isin(np.abs(np.delete(mean, 17)), [0.0, 3.5 / 4, 3.5 / 2]))
    assert np.count_nonzero(median) < np.count_nonzero(mean)
    with pytest.raises(ConfigError):
        unsketch(pe, "mode")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- top-k
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(0, 300), k=st.integers(-1, 320), ties=st.booleans())
def test_topk_indices_match_a_stable_sort(seed: int, d: int, k: int, ties: bool) -> None:
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, size=d).astype(np.float64) if ties else rng.standard_normal(d)
    got = topk_indices(x, k)
    order = np.argsort(-np.abs(x), kind="stable")  # stable: equal magnitudes keep index order
    want = np.sort(order[: max(0, min(k, d))])
    assert np.array_equal(got, want)


def test_topk_treats_nan_as_largest() -> None:
    x = np.array([0.5, np.nan, -2.0, 1.0])
    assert topk_indices(x, 2).tolist() == [1, 2]


def test_topk_stage_keeps_largest_values() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1000)
    out, _ = topk(0.05).update(x, None, rng)
    assert isinstance(out, SparsePayload) and out.k == 50 and out.scale == 1.0
    est = to_dense(out)
    assert np.count_nonzero(est) == 50
    assert np.min(np.abs(est[est != 0])) >= np.max(np.abs(x[est == 0]))


# -------------------------------------------------------------------------------------- byte costs
def test_randk_message_carries_no_indices() -> None:
    rng = np.random.default_rng(4)
    d = 26_000
    x = rng.standard_normal(d).astype(np.float32)
    comp = make_uplink(CompressionConfig(up="randk", up_ratio=0.02, up_values="fp16"))
    buf, _ = comp.encode(x, comp.init(d), rng)
    k = 520
    # header: magic, version, kind, flags + varint d (3 bytes) + varint k (2) + seed (8); CRC trailer 4
    assert len(buf) == 4 + 3 + 2 + 8 + 2 * k + 4
    p = decode(buf)
    assert isinstance(p, SparsePayload) and p.indices is None and p.k == k and p.scale == d / k
    est = to_dense(p)
    idx = randk_indices(d, k, p.seed)
    np.testing.assert_allclose(est[idx], x[idx].astype(np.float16).astype(np.float64) * d / k)
    assert np.count_nonzero(est) == np.count_nonzero(x[idx])


@pytest.mark.parametrize("up", ["dense", "randk", "topk", "sketch"])
@pytest.mark.parametrize("values", ["auto", "fp32", "fp16", "int8", "sign"])
@pytest.mark.parametrize("lossless", ["none", "zstd"])
def test_make_uplink_round_trips(up: str, values: str, lossless: str) -> None:
    rng = np.random.default_rng(5)
    d = 3000
    x = rng.standard_normal(d)
    cfg = CompressionConfig(up=up, up_ratio=0.1, up_values=values, sketch_rows=3, sketch_cols_ratio=0.2,
                            lossless=lossless)
    comp = make_uplink(cfg)
    state = comp.init(d)
    buf, state = comp.encode(x, state, np.random.default_rng(6))
    again, _ = comp.encode(x, comp.init(d), np.random.default_rng(6))
    assert buf == again  # same seed, same bytes
    other, _ = comp.encode(x, comp.init(d), np.random.default_rng(7))
    assert (buf != other) == (up in ("randk", "sketch"))
    p = decode(buf)
    vtype = value_type(values, dense=up == "dense")
    wire = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8, "sign": np.int8}[vtype]
    if up == "sketch" and wire == np.int8:
        wire = np.float16  # a sketch table is not quantised
    arr = p.table if isinstance(p, SketchPayload) else p.values
    assert arr.dtype == wire
    est = decode_to_dense(buf, d)
    assert est.shape == (d,) and est.dtype == np.float64
    if wire == np.int8 and vtype == "sign":  # x as it travels: its signs times the message's scale
        xr = np.where(x < 0, -1.0, 1.0) * np.float64(np.float32(p.vscale))
        assert buf[3] & 3 == 2  # one bit a value
    elif wire == np.int8:  # x as it travels: int8 steps of the message's scale
        xr = np.rint(x / p.vscale) * np.float64(np.float32(p.vscale))
    else:
        xr = x.astype(wire).astype(np.float64)
    if up == "dense":
        np.testing.assert_allclose(est, xr, rtol=1e-6, atol=0)
        assert isinstance(p, DensePayload)
    elif up == "topk":
        np.testing.assert_allclose(est[p.indices], xr[p.indices], rtol=1e-6, atol=0)
        assert p.k == 300
    elif up == "randk":
        assert p.k == 300 and p.indices is None
    else:
        assert isinstance(p, SketchPayload) and p.table.shape == (3, 600)
    assert (buf[3] & FLAG_ZSTD != 0) <= (lossless == "zstd")


def test_report_sizes_for_the_engine() -> None:
    """Reference sizes: d=26,000 rand-k of 520 fp16 values; 130 explicit fp32 values spread uniformly."""
    rng = np.random.default_rng(8)
    d = 26_000
    randk_msg = encode(SparsePayload(d=d, values=np.zeros(520, np.float16), seed=1, scale=d / 520))
    assert len(randk_msg) == 1061
    idx = np.sort(rng.choice(d, 130, replace=False))
    sparse = encode(SparsePayload(d=d, values=np.zeros(130, np.float32), indices=idx))
    assert (sparse[3] >> 4) & 3 == 1  # Golomb-Rice chosen
    # 130 * 4 value bytes + ~ 130 * (log2(200) + 1.5) / 8 index bytes + header
    assert 520 + 130 * 8 / 8 < len(sparse) < 520 + 130 * 10 / 8 + 20


# ------------------------------------------------------------------------------------ composition
def test_chain_composition_and_state() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal(500)
    pipeline = chain(randk(0.2), cast("fp16"), zstd())
    state = pipeline.init(500)
    assert isinstance(state, tuple) and len(state) == 3
    buf, state2 = pipeline.update(x, state, np.random.default_rng(10))
    assert isinstance(buf, bytes) and len(state2) == 3
    comp = Compressor(pipeline)
    buf2, _ = comp.encode(x, comp.init(500), np.random.default_rng(10))
    assert buf == buf2
    # stages taking a payload work on its estimate: top-k of a dense payload == top-k of the vector
    a, _ = chain(dense(), topk(0.1)).update(x, (None, None), rng)
    b, _ = topk(0.1).update(x.astype(np.float32), None, rng)
    assert a == b
    # count sketch of a rand-k estimate, cols from the ratio at init
    sk = chain(randk(0.5), count_sketch(2, cols_ratio=0.1), cast("fp16"))
    out, st_ = sk.update(x, sk.init(500), rng)
    assert isinstance(out, SketchPayload) and out.table.shape == (2, 50) and out.table.dtype == np.float16
    assert st_ == (None, 50, None)


def test_cast_saturates_fp16_and_keeps_nan() -> None:
    x = np.array([1e6, -1e6, np.nan, 0.25, np.inf])
    p, _ = cast("fp16").update(x, None, np.random.default_rng(0))
    assert p.values.dtype == np.float16
    assert p.values[0] == 65504 and p.values[1] == -65504 and np.isnan(p.values[2])
    assert p.values[3] == 0.25 and np.isinf(p.values[4])
    q, _ = cast("fp32").update(p, None, np.random.default_rng(0))
    assert q.values.dtype == np.float32


def test_float64_inputs_travel_as_float32() -> None:
    rng = np.random.default_rng(11)
    x = rng.standard_normal(100)
    for stage in (dense(), randk(0.3), topk(0.3)):
        p, _ = stage.update(x, None, rng)
        assert p.values.dtype == np.float32


@pytest.mark.parametrize(
    ("setting", "dense_", "expected"),
    [("auto", True, "fp32"), ("auto", False, "int8"), ("fp16", True, "fp16"), ("fp32", False, "fp32"),
     ("int8", False, "int8"), ("sign", False, "sign"), ("sign", True, "sign")],
)
def test_value_type_auto_is_fp32_dense_and_int8_compressed(setting: str, dense_: bool, expected: str) -> None:
    assert value_type(setting, dense=dense_) == expected


def test_value_type_refuses_other_names() -> None:
    for bad in ("bf16", "float16", "fp64", ""):
        with pytest.raises(ConfigError, match="auto, fp32, fp16, int8, sign"):
            value_type(bad, dense=True)


def test_quantize_sign_is_the_mean_magnitude_times_the_signs() -> None:
    """STC's μ: s = mean |v| (float32), q = sign(v) with 0 and NaN as +1; s·q is the best fit of v by
    these signs (a larger or smaller scale fits worse)."""
    v = np.array([0.5, -2.0, 0.0, 1.5, -0.25])
    q, s = quantize_sign(v)
    assert q.dtype == np.int8 and q.tolist() == [1, -1, 1, 1, -1]
    assert s == float(np.float32(0.85))
    err = [np.linalg.norm(v - c * q) for c in (0.8 * s, s, 1.2 * s)]
    assert err[1] < err[0] and err[1] < err[2]
    q, s = quantize_sign(np.array([np.nan, -np.inf, 3.0]))
    assert q.tolist() == [1, -1, 1] and s == 3.0  # non-finite values do not enter the scale
    q, s = quantize_sign(np.zeros(4))
    assert s == 0.0 and set(q.tolist()) == {1}
    assert quantize_sign(np.array([1e300]))[1] == float(np.finfo(np.float32).max)  # saturates, stays finite
    out, _ = cast("sign").update(DensePayload(np.array([1.0, -3.0], np.float32)), None, None)
    assert isinstance(out, DensePayload) and out.vscale == 2.0 and out.values.tolist() == [1, -1]
    table, _ = cast("sign").update(SketchPayload(d=4, seed=1, table=np.ones((1, 2), np.float32)), None, None)
    assert table.table.dtype == np.float16  # a sketch table is not quantised


def test_errors_are_clear() -> None:
    with pytest.raises(ConfigError, match="ratio"):
        randk(0.0)
    with pytest.raises(ConfigError, match="ratio"):
        topk(1.5)
    with pytest.raises(ConfigError, match="exactly one"):
        count_sketch(3)
    with pytest.raises(ConfigError, match="rows"):
        count_sketch(0, 10)
    with pytest.raises(ConfigError, match="fp16"):
        cast("bf16")  # type: ignore[arg-type]
    comp = make_uplink(CompressionConfig())
    with pytest.raises(ValueError, match="d=10"):
        comp.encode(np.zeros(11), comp.init(10), np.random.default_rng(0))
    buf, _ = comp.encode(np.ones(10), comp.init(10), np.random.default_rng(0))
    with pytest.raises(WireError, match="expected 12"):
        decode_to_dense(buf, 12)
    with pytest.raises(WireError, match="1-D float"):
        dense().update(np.zeros((2, 2)), None, np.random.default_rng(0))
