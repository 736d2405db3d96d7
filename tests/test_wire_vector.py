"""Vector payloads on the wire: exact round trips, index coding choice, clear errors on malformed messages."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.errors import WireError
from sluice.wire.frame import KIND_CHAIN, frame
from sluice.wire.frame import varint as _varint
from sluice.wire.vector import (
    FLAG_ZSTD,
    MAX_D,
    DensePayload,
    PatchChain,
    SketchPayload,
    SparsePayload,
    _rice_bits,
    decode,
    encode,
    index_block_sizes,
    rice_parameter,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CODINGS = ["auto", "rice", "bitmap", "raw"]


def _values(rng: np.random.Generator, n: int, dtype: str) -> np.ndarray:
    """Arbitrary bit patterns (NaNs, infinities and subnormals included) of the given float width."""
    if dtype == "fp16":
        return rng.integers(0, 2**16, size=n, dtype=np.uint16).view(np.float16)
    return rng.integers(0, 2**32, size=n, dtype=np.uint32).view(np.float32)


def _indices(rng: np.random.Generator, d: int, k: int) -> np.ndarray:
    """Exactly ``k`` sorted distinct indices in ``[0, d)``."""
    if d > 10**7:
        pool = rng.permutation(np.unique(rng.integers(0, d, size=2 * k + 10)))
        return np.sort(pool[:k]).astype(np.int64)
    return np.sort(rng.choice(d, size=k, replace=False)).astype(np.int64)


def _resign(msg: bytes) -> bytes:
    """The message with its CRC recomputed (to build well-signed but malformed messages)."""
    body = msg[:-4]
    return body + struct.pack("<I", zlib.crc32(body))


def _check_round_trip(p, **kw) -> bytes:
    buf = encode(p, **kw)
    q = decode(buf)
    assert q == p
    assert type(q) is type(p)
    return buf


# ------------------------------------------------------------------------------------- round trips
@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    d=st.one_of(st.just(0), st.just(1), st.integers(0, 3000)),
    dtype=st.sampled_from(["fp16", "fp32"]),
    lossless=st.booleans(),
)
def test_dense_round_trip(seed: int, d: int, dtype: str, lossless: bool) -> None:
    rng = np.random.default_rng(seed)
    p = DensePayload(_values(rng, d, dtype))
    buf = _check_round_trip(p, lossless=lossless)
    if not lossless:
        assert len(buf) == 4 + len(_varint_len(d)) + d * p.values.itemsize + 4


def _varint_len(n: int) -> bytes:
    out = b""
    while True:
        out += b"x"
        n >>= 7
        if not n:
            return out


@st.composite
def sparse_payloads(draw: st.DrawFn) -> SparsePayload:
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    d = draw(st.one_of(st.just(1), st.integers(0, 2500), st.integers(2500, MAX_D)))
    shape = draw(st.sampled_from(["empty", "full", "any"]))
    k_max = min(d, 3000)
    k = 0 if shape == "empty" else (k_max if shape == "full" else draw(st.integers(0, k_max)))
    dtype = draw(st.sampled_from(["fp16", "fp32"]))
    scale = draw(st.sampled_from(["one", "d/k", "other"]))
    scale_v = 1.0 if scale == "one" or k == 0 else (d / k if scale == "d/k" else draw(st.floats()))
    vals = _values(rng, k, dtype)
    if draw(st.booleans()):
        return SparsePayload(d=d, values=vals, seed=draw(st.integers(0, 2**64 - 1)), scale=scale_v)
    return SparsePayload(d=d, values=vals, indices=_indices(rng, d, k), scale=scale_v)


@SETTINGS
@given(p=sparse_payloads(), coding=st.sampled_from(CODINGS), lossless=st.booleans())
def test_sparse_round_trip(p: SparsePayload, coding: str, lossless: bool) -> None:
    if coding == "bitmap" and p.d > 10**6:
        coding = "auto"  # a forced bitmap over billions of coordinates is legal but too big for a test
    _check_round_trip(p, index_coding=coding, lossless=lossless)


@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    d=st.one_of(st.just(0), st.just(1), st.integers(0, 5000), st.just(MAX_D)),
    rows=st.integers(1, 7),
    cols=st.integers(1, 300),
    dtype=st.sampled_from(["fp16", "fp32"]),
    lossless=st.booleans(),
    hseed=st.integers(0, 2**64 - 1),
)
def test_sketch_round_trip(
    seed: int, d: int, rows: int, cols: int, dtype: str, lossless: bool, hseed: int
) -> None:
    rng = np.random.default_rng(seed)
    p = SketchPayload(d=d, seed=hseed, table=_values(rng, rows * cols, dtype).reshape(rows, cols))
    _check_round_trip(p, lossless=lossless)


@pytest.mark.parametrize("coding", CODINGS)
@pytest.mark.parametrize("lossless", [False, True])
@pytest.mark.parametrize(("d", "k"), [(0, 0), (1, 0), (1, 1), (100, 0), (100, 100), (7, 7), (9, 1), (64, 63)])
def test_sparse_edge_cases(d: int, k: int, coding: str, lossless: bool) -> None:
    rng = np.random.default_rng(d * 1000 + k)
    idx = _indices(rng, d, k)
    for dtype in ("fp16", "fp32"):
        p = SparsePayload(d=d, values=_values(rng, k, dtype), indices=idx, scale=d / k if k else 1.0)
        _check_round_trip(p, index_coding=coding, lossless=lossless)
        q = SparsePayload(d=d, values=_values(rng, k, dtype), seed=2**64 - 1)
        _check_round_trip(q, lossless=lossless)


def test_large_sparse_round_trip_is_fast_enough() -> None:
    rng = np.random.default_rng(1)
    d, k = 10_000_000, 300_000
    idx = np.unique(rng.integers(0, d, size=k))
    p = SparsePayload(d=d, values=np.ones(idx.shape[0], np.float16), indices=idx)
    buf = _check_round_trip(p, index_coding="rice")
    # uniform gaps of mean ~ d/k cost about log2(d/k) + 2 bits each with a good Rice parameter
    per_index_bits = 8 * (len(buf) - 2 * idx.shape[0]) / idx.shape[0]
    assert per_index_bits < np.log2(d / k) + 2.2


# ------------------------------------------------------------------------------- index coding choice
@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    d=st.integers(1, 20_000),
    frac=st.floats(0.0, 1.0),
    clustered=st.booleans(),
)
def test_chosen_coding_is_never_larger(seed: int, d: int, frac: float, clustered: bool) -> None:
    rng = np.random.default_rng(seed)
    k = int(round(frac * d))
    if clustered and k:
        start = int(rng.integers(0, d - k + 1))
        idx = np.arange(start, start + k, dtype=np.int64)
    else:
        idx = _indices(rng, d, k)
    p = SparsePayload(d=d, values=np.zeros(k, np.float32), indices=idx)
    sizes = {c: len(encode(p, index_coding=c)) for c in CODINGS}
    assert sizes["auto"] == min(sizes["rice"], sizes["bitmap"], sizes["raw"])
    block = index_block_sizes(idx, d)
    assert sizes["raw"] - sizes["bitmap"] == block["raw"] - block["bitmap"]
    assert sizes["rice"] - sizes["raw"] == block["rice"] - block["raw"]


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 2**32 - 1), k=st.integers(1, 400))
def test_rice_parameter_is_optimal(seed: int, d: int, k: int) -> None:
    rng = np.random.default_rng(seed)
    idx = np.unique(rng.integers(0, d, size=k))
    gaps = np.diff(idx, prepend=-1).astype(np.uint64) - np.uint64(1)
    best = min(range(33), key=lambda r: _rice_bits(gaps, r))
    assert _rice_bits(gaps, rice_parameter(gaps)) == _rice_bits(gaps, best)


@SETTINGS
@given(gaps=st.lists(st.integers(0, 2**31), min_size=1, max_size=12))
def test_rice_parameter_is_optimal_for_any_gaps(gaps: list[int]) -> None:
    g = np.array(gaps, dtype=np.uint64)
    best = min(_rice_bits(g, r) for r in range(33))
    assert _rice_bits(g, rice_parameter(g)) == best


@pytest.mark.parametrize("gaps", [[26, 9, 8, 14], [115, 70, 69, 193, 93], [0], [2**31 - 1, 0, 0]])
def test_rice_gaps_round_trip(gaps: list[int]) -> None:
    """Gap lists whose best parameter lies above log2(mean gap): the search must also walk upwards."""
    idx = np.cumsum(np.array(gaps, dtype=np.int64) + 1) - 1
    g = np.array(gaps, dtype=np.uint64)
    assert _rice_bits(g, rice_parameter(g)) == min(_rice_bits(g, r) for r in range(33))
    p = SparsePayload(d=int(idx[-1]) + 1, values=np.zeros(len(gaps), np.float16), indices=idx)
    _check_round_trip(p, index_coding="rice")


def test_each_coding_wins_somewhere() -> None:
    d = 10_000
    # two indices 2^31 apart: Rice needs 1 + 9 bytes, raw 8
    far = SparsePayload(d=MAX_D, values=np.zeros(2, np.float32), indices=np.array([5, 2**31 + 7]))
    spread = SparsePayload(d=d, values=np.zeros(200, np.float32), indices=np.arange(0, d, 50))
    dense = SparsePayload(d=d, values=np.zeros(d // 2, np.float32), indices=np.arange(0, d, 2))
    for p, want in ((far, "raw"), (spread, "rice"), (dense, "bitmap")):
        sizes = index_block_sizes(p.indices, p.d)
        assert min(sizes, key=sizes.get) == want
        assert (encode(p)[3] >> 4) & 3 == {"rice": 1, "bitmap": 2, "raw": 3}[want]


# -------------------------------------------------------------------------------------- byte counts
def test_randk_header_is_small() -> None:
    p = SparsePayload(d=26_000, values=np.zeros(500, np.float16), seed=123, scale=26_000 / 500)
    buf = encode(p)
    # magic, version, kind, flags (4) + varint d (3) + varint k (2) + seed (8) + CRC (4)
    assert len(buf) == 1000 + 21
    explicit_scale = SparsePayload(d=26_000, values=np.zeros(500, np.float16), seed=123, scale=3.0)
    assert len(encode(explicit_scale)) == len(buf) + 8


def test_lossless_flag_and_fallback() -> None:
    zeros = DensePayload(np.zeros(5000, np.float32))
    packed = encode(zeros, lossless=True)
    assert packed[3] & FLAG_ZSTD and len(packed) < 200
    noise = DensePayload(np.random.default_rng(0).standard_normal(5000).astype(np.float32))
    plain = encode(noise)
    maybe = encode(noise, lossless=True)
    assert len(maybe) <= len(plain)
    assert decode(maybe) == noise
    tiny = DensePayload(np.ones(1, np.float16))
    assert encode(tiny, lossless=True) == encode(tiny)  # zstd would grow it: sent uncompressed


def test_same_payload_same_bytes() -> None:
    rng = np.random.default_rng(5)
    idx = _indices(rng, 1000, 40)
    vals = _values(rng, 40, "fp16")
    a = encode(SparsePayload(d=1000, values=vals, indices=idx), lossless=True)
    b = encode(SparsePayload(d=1000, values=vals.copy(), indices=idx.copy()), lossless=True)
    assert a == b


# ------------------------------------------------------------------------------------------ errors
def _sample_messages() -> list[bytes]:
    rng = np.random.default_rng(11)
    idx = _indices(rng, 3000, 60)
    return [
        encode(DensePayload(_values(rng, 20, "fp16"))),
        encode(DensePayload(np.zeros(300, np.float32)), lossless=True),
        encode(SparsePayload(d=3000, values=_values(rng, 30, "fp16"), seed=77, scale=100.0)),
        encode(SparsePayload(d=3000, values=_values(rng, 60, "fp32"), indices=idx), index_coding="rice"),
        encode(SparsePayload(d=100, values=_values(rng, 60, "fp32"), indices=np.arange(60)),
               index_coding="bitmap"),
        encode(SparsePayload(d=3000, values=_values(rng, 60, "fp16"), indices=idx, scale=0.5),
               index_coding="raw"),
        encode(SparsePayload(d=3000, values=np.zeros(60, np.float16), indices=idx), lossless=True),
        encode(SketchPayload(d=500, seed=9, table=_values(rng, 24, "fp32").reshape(3, 8))),
        encode(SketchPayload(d=500, seed=9, table=np.zeros((3, 80), np.float16)), lossless=True),
        encode(SparsePayload(d=0, values=np.zeros(0, np.float16), indices=np.zeros(0, np.int64))),
    ]


def test_sample_messages_use_zstd_where_expected() -> None:
    msgs = _sample_messages()
    assert [bool(m[3] & FLAG_ZSTD) for m in msgs] == [False, True] + [False] * 4 + [True, False, True, False]


@pytest.mark.parametrize("index", range(10))
def test_every_truncation_raises(index: int) -> None:
    buf = _sample_messages()[index]
    assert decode(buf) is not None
    for n in range(len(buf)):
        with pytest.raises(WireError):
            decode(buf[:n])


def test_truncation_message_names_the_sizes() -> None:
    buf = _sample_messages()[0]
    with pytest.raises(WireError, match=rf"truncated: expected {len(buf)} bytes, got {len(buf) - 3}"):
        decode(buf[:-3])
    with pytest.raises(WireError, match="trailing bytes"):
        decode(buf + b"\x00")


@pytest.mark.parametrize("index", range(10))
def test_every_single_byte_corruption_raises(index: int) -> None:
    buf = _sample_messages()[index]
    rng = np.random.default_rng(index)
    for pos in range(len(buf)):
        for delta in (1, 0x80, int(rng.integers(1, 256))):
            bad = bytearray(buf)
            bad[pos] ^= delta
            with pytest.raises(WireError):
                decode(bytes(bad))


def test_checksum_mismatch_is_reported() -> None:
    buf = bytearray(_sample_messages()[2])
    buf[-6] ^= 0xFF  # a value byte
    with pytest.raises(WireError, match="checksum mismatch"):
        decode(bytes(buf))


def test_bad_version_and_magic() -> None:
    buf = bytearray(_sample_messages()[3])
    buf[1] = 7
    with pytest.raises(WireError, match=r"unsupported version 7 \(this build reads 2\)"):
        decode(bytes(buf))
    buf[0] = 0x00
    with pytest.raises(WireError, match="not a Sluice message"):
        decode(bytes(buf))
    with pytest.raises(WireError, match="truncated"):
        decode(b"")


def test_well_signed_but_inconsistent_messages_raise() -> None:
    # raw indices out of order
    p = SparsePayload(d=1000, values=np.zeros(3, np.float32), indices=np.array([1, 5, 9]))
    buf = bytearray(encode(p, index_coding="raw"))
    buf[-16:-4] = struct.pack("<3I", 5, 1, 9)
    with pytest.raises(WireError, match="not sorted"):
        decode(_resign(bytes(buf)))
    # raw index beyond d
    buf = bytearray(encode(p, index_coding="raw"))
    buf[-8:-4] = struct.pack("<I", 1000)
    with pytest.raises(WireError, match="in \\[0, 1000\\)"):
        decode(_resign(bytes(buf)))
    # bitmap marking more coordinates than k
    buf = bytearray(encode(p, index_coding="bitmap"))
    buf[-5] |= 0x01
    with pytest.raises(WireError, match="bitmap marks 4"):
        decode(_resign(bytes(buf)))
    # bitmap with a padding bit set (d = 1003: the last byte holds 3 coordinates and 5 padding bits)
    q = SparsePayload(d=1003, values=np.zeros(3, np.float32), indices=np.array([1, 5, 9]))
    buf = bytearray(encode(q, index_coding="bitmap"))
    buf[-5] |= 0x01
    with pytest.raises(WireError, match="padding"):
        decode(_resign(bytes(buf)))
    # Rice block with an extra unary code (bits: 3 remainders, then unary 1 01 01)
    buf = bytearray(encode(p, index_coding="rice"))
    assert buf[-5] & 0x1F == 0b10101
    buf[-5] |= 0x02
    with pytest.raises(WireError, match="index block"):
        decode(_resign(bytes(buf)))
    # Rice block followed by a stray byte
    buf = encode(p, index_coding="rice")
    with pytest.raises(WireError, match="trailing bytes after the last Rice code"):
        decode(_resign(buf[:-4] + b"\x00" + buf[-4:]))
    # patch chain with reserved flag bits set: bits 3-7, the replay bits without compact parts, the start bit
    # without the replay bit
    for bits in (0b1000, 0b10, 0b101):
        buf = bytearray(encode(DensePayload(np.zeros(2, np.float32))))
        buf[2] = KIND_CHAIN
        buf[3] = bits
        with pytest.raises(WireError, match="reserved flag bits"):
            decode(_resign(bytes(buf)))
    # reserved value coding 3 of a dense or sparse message, any coding of a sketch, int8 or signs with fp16
    for p, bits in ((DensePayload(np.zeros(2, np.float32)), (0b11, 0b101, 0b110)),
                    (SparsePayload(d=5, values=np.zeros(2, np.float32), seed=1), (0b11, 0b101, 0b110)),
                    (SketchPayload(d=5, seed=1, table=np.zeros((1, 2), np.float32)), (0b01, 0b10))):
        for bit in bits:
            buf = bytearray(encode(p))
            buf[3] |= bit
            with pytest.raises(WireError, match="reserved flag bits"):
                decode(_resign(bytes(buf)))
    # k > d in the header
    buf = bytearray(encode(SparsePayload(d=5, values=np.zeros(2, np.float16), seed=1)))
    buf[4] = 1
    with pytest.raises(WireError, match="k <= d"):
        decode(_resign(bytes(buf)))


def test_zstd_size_claims_are_checked() -> None:
    p = DensePayload(np.zeros(1000, np.float32))
    other = encode(DensePayload(np.zeros(999, np.float32)), lossless=True)
    buf = encode(p, lossless=True)
    head = 4 + 2
    spliced = buf[:head] + other[head:-4]
    with pytest.raises(WireError, match="compressed body"):
        decode(_resign(spliced + b"\0\0\0\0"))


def test_invalid_payloads_are_refused() -> None:
    with pytest.raises(WireError, match="float16 or float32"):
        DensePayload(np.zeros(3))
    with pytest.raises(WireError, match="sorted, unique"):
        SparsePayload(d=10, values=np.zeros(2, np.float32), indices=np.array([3, 3]))
    with pytest.raises(WireError, match="sorted, unique"):
        SparsePayload(d=10, values=np.zeros(1, np.float32), indices=np.array([10]))
    with pytest.raises(WireError, match="exactly one"):
        SparsePayload(d=10, values=np.zeros(1, np.float32), indices=np.array([1]), seed=3)
    with pytest.raises(WireError, match="exactly one"):
        SparsePayload(d=10, values=np.zeros(1, np.float32))
    with pytest.raises(WireError, match="seed"):
        SparsePayload(d=10, values=np.zeros(1, np.float32), seed=2**64)
    with pytest.raises(WireError, match="d must be"):
        SparsePayload(d=2**32, values=np.zeros(1, np.float32), seed=1)
    with pytest.raises(WireError, match="2-D"):
        SketchPayload(d=10, seed=1, table=np.zeros(4, np.float32))
    with pytest.raises(WireError, match="index_coding"):
        encode(DensePayload(np.zeros(1, np.float32)), index_coding="golomb")  # type: ignore[arg-type]
    with pytest.raises(WireError, match="cannot encode"):
        encode(np.zeros(3, np.float32))  # type: ignore[arg-type]


def _chain(seed: int, parts: int, d: int = 3000) -> PatchChain:
    rng = np.random.default_rng(seed)
    return PatchChain(tuple(
        SparsePayload(d=d, values=rng.normal(size=k).astype(np.float16),
                      indices=np.sort(rng.choice(d, size=k, replace=False)))
        for k in rng.integers(0, 40, size=parts)
    ))


@pytest.mark.parametrize("parts", [0, 1, 5])
def test_patch_chain_round_trip_and_corruption(parts: int) -> None:
    chain_ = _chain(parts, parts)
    buf = encode(chain_)
    assert decode(buf) == chain_
    d = 3000 if parts else 0
    compact = [len(encode(p)) - 7 - len(_varint(d)) for p in chain_.parts]  # no frame header, CRC or d
    assert len(buf) == 4 + 1 + len(_varint(d)) + sum(n + len(_varint(n)) for n in compact) + 4
    # the full-frame layout (flag bit 0 clear) still decodes to the same chain
    full = [encode(p) for p in chain_.parts]
    legacy = frame(KIND_CHAIN, bytes([0]) + _varint(len(full)), *(_varint(len(m)) + m for m in full))
    assert decode(legacy) == chain_ and len(legacy) - len(buf) == sum(
        len(m) - n for m, n in zip(full, compact, strict=True)) - len(_varint(d))
    for cut in range(len(buf)):
        with pytest.raises(WireError):
            decode(buf[:cut])
    for pos in range(0, len(buf), 7):
        bad = bytearray(buf)
        bad[pos] ^= 0x40
        with pytest.raises(WireError):
            decode(bytes(bad))


def test_patch_chain_rejects_mixed_lengths_and_seeded_parts() -> None:
    a = SparsePayload(d=10, values=np.ones(1, np.float32), indices=np.array([3]))
    b = SparsePayload(d=11, values=np.ones(1, np.float32), indices=np.array([3]))
    with pytest.raises(WireError, match="share d"):
        PatchChain((a, b))
    with pytest.raises(WireError, match="explicit indices"):
        PatchChain((SparsePayload(d=10, values=np.ones(2, np.float16), seed=5),))


# ------------------------------------------------------------------------------- sign values (coding 2)
def _signs(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.where(rng.random(n) < 0.5, -1, 1).astype(np.int8)


@pytest.mark.parametrize("lossless", [False, True])
@pytest.mark.parametrize(("d", "k"), [(0, 0), (1, 1), (9, 8), (100, 9), (26_122, 522)])
def test_sign_values_round_trip_at_one_bit_each(d: int, k: int, lossless: bool) -> None:
    """±1 int8 values with a scale travel as ceil(k/8) bytes of sign bits and come back bit for bit."""
    rng = np.random.default_rng(d + k)
    idx = _indices(rng, d, k)
    vscale = float(np.float32(0.0371))
    p = SparsePayload(d=d, values=_signs(rng, k), indices=idx, vscale=vscale)
    buf = _check_round_trip(p, lossless=lossless)
    assert buf[3] & 3 == 2  # value coding 2
    if not lossless:
        sizes = index_block_sizes(idx, d)
        block = min(sizes["raw"], sizes["bitmap"], sizes["rice"])
        header = 4 + len(_varint(d)) + len(_varint(k)) + 4  # frame header and flags, varints, the scale
        assert len(buf) == header + (k + 7) // 8 + block + 4
        as_int8 = encode(SparsePayload(d=d, values=np.full(k, 2, np.int8), indices=idx, vscale=vscale))
        assert len(as_int8) - len(buf) == k - (k + 7) // 8  # eight bits a value against one
    dense = DensePayload(_signs(rng, 13), vscale=vscale)
    dbuf = _check_round_trip(dense)
    assert dbuf[3] & 3 == 2 and len(dbuf) == 4 + 1 + 4 + 2 + 4
    seeded = SparsePayload(d=1000, values=_signs(rng, 20), seed=7, scale=50.0, vscale=vscale)
    assert decode(_check_round_trip(seeded)).scale == 50.0


def test_int8_values_other_than_signs_keep_coding_1() -> None:
    p = SparsePayload(d=10, values=np.array([1, -1, 0], np.int8), indices=np.array([0, 3, 9]), vscale=1.0)
    assert _check_round_trip(p)[3] & 3 == 1


def test_corrupt_sign_values_raise() -> None:
    rng = np.random.default_rng(3)
    k = 13  # 2 sign bytes, 3 padding bits
    p = SparsePayload(d=500, values=_signs(rng, k), indices=_indices(rng, 500, k), vscale=0.5)
    buf = encode(p, index_coding="raw")
    head = len(buf) - 4 - 2 - 4 * k  # where the sign bytes start
    padded = bytearray(buf)
    padded[head + 1] |= 0b001  # a padding bit of the last sign byte
    with pytest.raises(WireError, match="padding"):
        decode(_resign(bytes(padded)))
    truncated = buf[: head + 1] + buf[head + 2 : -4]  # one sign byte short
    with pytest.raises(WireError, match="truncated"):
        decode(_resign(truncated))
    on_sketch = bytearray(encode(SketchPayload(d=10, seed=1, table=np.ones((1, 2), np.float32))))
    on_sketch[3] |= 2  # signs are not a sketch table's coding
    with pytest.raises(WireError, match="reserved"):
        decode(_resign(bytes(on_sketch)))
    reserved = bytearray(buf)
    reserved[3] |= 3  # value coding 3 is reserved
    with pytest.raises(WireError, match="reserved"):
        decode(_resign(bytes(reserved)))
