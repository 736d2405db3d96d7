"""The shared Sluice frame: kind registry, varints, old-format refusal and sizes against version 1."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import WireError
from sluice.wire import buffers, dtypes, tensor, vector
from sluice.wire import frame as wf
from sluice.wire.frame import (
    FRAME_OVERHEAD,
    MAGIC,
    VERSION,
    frame,
    kind_name,
    kinds,
    read_varint,
    register_kind,
    unframe,
    varint,
)
from sluice.wire.vector import DensePayload, PatchChain, SketchPayload, SparsePayload, index_block_sizes

OLD_FORMAT = r"old Sluice wire format \(version 1"


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kinds registered in the test vanish afterwards."""
    monkeypatch.setattr(wf, "_KINDS", dict(wf._KINDS))


# ----------------------------------------------------------------------------------------- registry
def test_builtin_kinds() -> None:
    assert kinds() == {1: "dense", 2: "sparse", 3: "sketch", 4: "chain", 5: "buffers", 16: "tensor", 17: "control",
                       18: "raw"}
    assert set(vector.KINDS) | set(tensor.KINDS) | set(buffers.KINDS) == set(kinds())
    assert kind_name(wf.KIND_SPARSE) == "sparse"


@pytest.mark.usefixtures("scratch_registry")
def test_registering_a_kind_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="kind 1 is already registered as 'dense'"):
        register_kind(1, "something-else")
    with pytest.raises(ValueError, match="name 'dense' is already registered with id 1"):
        register_kind(99, "dense")
    register_kind(99, "probe-99")
    with pytest.raises(ValueError, match="already registered"):
        register_kind(99, "probe-99")
    for bad in (0, 256, -1, True, "5"):
        with pytest.raises(ValueError, match=r"\[1, 255\]"):
            register_kind(bad, "x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty name"):
        register_kind(100, "")


def test_unknown_kind_is_refused_with_its_number() -> None:
    body = b"payload"
    head = bytes([MAGIC, VERSION, 0x77])
    buf = head + body + struct.pack("<I", zlib.crc32(head + body))
    for decode in (unframe, vector.decode, tensor.decode):
        with pytest.raises(WireError, match="unknown message kind 119"):
            decode(buf)
    with pytest.raises(WireError, match="unknown message kind 119"):
        frame(0x77, body)
    with pytest.raises(WireError, match="unknown message kind 0"):
        kind_name(0)


@pytest.mark.usefixtures("scratch_registry")
def test_a_new_kind_round_trips_without_touching_the_existing_ones() -> None:
    before = kinds()
    dense = DensePayload(np.arange(5, dtype=np.float32))
    dense_bytes = vector.encode(dense)
    control_bytes = tensor.encode_control("hello", {"n": 1})
    note = register_kind(200, "note")
    assert note == 200 and kind_name(200) == "note"
    assert {k: v for k, v in kinds().items() if k != note} == before
    for body in (b"", b"x", bytes(range(256)) * 3):
        buf = frame(note, body)
        assert len(buf) == FRAME_OVERHEAD + len(body)
        kind, got = unframe(buf)
        assert kind == note and bytes(got) == body
        with pytest.raises(WireError, match="not a vector payload: message kind 200 \\(note\\)"):
            vector.decode(buf)
        with pytest.raises(WireError, match="not a split-training message: message kind 200 \\(note\\)"):
            tensor.decode(buf)
    # the existing kinds encode the same bytes and still decode
    assert vector.encode(dense) == dense_bytes and vector.decode(dense_bytes) == dense
    assert tensor.encode_control("hello", {"n": 1}) == control_bytes
    assert tensor.decode(control_bytes) == tensor.ControlMsg("hello", {"n": 1})


def test_vector_and_tensor_decoders_refuse_each_others_kinds() -> None:
    with pytest.raises(WireError, match=r"not a vector payload: message kind 17 \(control\)"):
        vector.decode(tensor.encode_control("x"))
    with pytest.raises(WireError, match=r"not a split-training message: message kind 1 \(dense\)"):
        tensor.decode(vector.encode(DensePayload(np.zeros(3, np.float16))))


# ------------------------------------------------------------------------------------------ frames
@settings(max_examples=60, deadline=None)
@given(body=st.binary(max_size=300), parts=st.lists(st.binary(max_size=40), max_size=3))
def test_frame_round_trip_truncation_and_corruption(body: bytes, parts: list[bytes]) -> None:
    buf = frame(wf.KIND_RAW, body, *parts)
    assert buf[:3] == bytes([MAGIC, VERSION, wf.KIND_RAW])
    assert buf[-4:] == struct.pack("<I", zlib.crc32(buf[:-4]))
    kind, got = unframe(buf)
    assert kind == wf.KIND_RAW and bytes(got) == body + b"".join(parts)
    for n in range(len(buf)):
        with pytest.raises(WireError):
            unframe(buf[:n])
    for pos in range(len(buf)):
        bad = bytearray(buf)
        bad[pos] ^= 0x01
        with pytest.raises(WireError):
            unframe(bytes(bad))


def test_frame_errors_say_what_is_wrong() -> None:
    buf = frame(wf.KIND_RAW, b"abc")
    with pytest.raises(WireError, match=r"truncated: expected at least 7 bytes, got 0"):
        unframe(b"")
    with pytest.raises(WireError, match=r"not a Sluice message: first byte \(magic\) is 0x00, expected 0x53"):
        unframe(b"\x00" + buf[1:])
    with pytest.raises(WireError, match=r"unsupported version 3 \(this build reads 2\)"):
        unframe(buf[:1] + b"\x03" + buf[2:])
    bad = bytearray(buf)
    bad[4] ^= 0xFF
    with pytest.raises(WireError, match="checksum mismatch"):
        unframe(bytes(bad))


# ----------------------------------------------------------------------------------------- varints
@settings(max_examples=300, deadline=None)
@given(n=st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1)), pad=st.binary(max_size=3))
def test_varint_round_trip(n: int, pad: bytes) -> None:
    enc = varint(n)
    assert len(enc) == max(1, -(-n.bit_length() // 7))
    assert read_varint(enc + pad, 0, "n") == (n, len(enc))
    assert read_varint(b"\x05" + enc + pad, 1, "n", reserve=len(pad)) == (n, 1 + len(enc))


@pytest.mark.parametrize(("n", "enc"), [(0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (300, b"\xac\x02"),
                                        (2**64 - 1, b"\xff" * 9 + b"\x01")])
def test_varint_known_encodings(n: int, enc: bytes) -> None:
    assert varint(n) == enc


def test_varint_truncation_and_malformed() -> None:
    enc = varint(300)
    with pytest.raises(WireError, match=r"truncated: expected at least 2 bytes, got 1 \(varint d at offset 0"):
        read_varint(enc[:1], 0, "d")
    with pytest.raises(WireError, match="truncated: expected at least 1 bytes, got 0"):
        read_varint(b"", 0, "d")
    with pytest.raises(WireError, match=r"truncated: expected at least 6 bytes, got 5"):
        read_varint(enc + b"\0\0\0", 0, "d", reserve=4)
    with pytest.raises(WireError, match="not minimally encoded"):
        read_varint(b"\x80\x00", 0, "k")
    with pytest.raises(WireError, match="exceeds 64 bits"):
        read_varint(b"\xff" * 9 + b"\x02", 0, "k")
    with pytest.raises(WireError, match="longer than 64 bits"):
        read_varint(b"\xff" * 10 + b"\x01", 0, "k")
    for bad in (-1, 2**64, True):
        with pytest.raises(WireError, match=r"\[0, 2\*\*64\)"):
            varint(bad)


# -------------------------------------------------------------------------------------- old format
def _v1_vector_message() -> bytes:
    """A dense fp16 message of format version 1: magic, version 1, flags (kind 0, fp16), varint d, CRC."""
    msg = bytes([0x53, 1, 0b100]) + varint(3) + np.ones(3, "<f2").tobytes()
    return msg + struct.pack("<I", zlib.crc32(msg))


def _v1_split_frame() -> bytes:
    """A control message of format version 1: "SLT", version 1, kind 2, reserved, CRC of the body, body."""
    body = json.dumps({"type": "propose"}).encode()
    return struct.pack("<3sBBBI", b"SLT", 1, 2, 0, zlib.crc32(body)) + body


@pytest.mark.parametrize("decode", [unframe, vector.decode, tensor.decode], ids=["frame", "vector", "tensor"])
def test_old_format_is_refused_clearly(decode) -> None:
    with pytest.raises(WireError, match=OLD_FORMAT + r", vector payload\) that this build no longer reads"):
        decode(_v1_vector_message())
    with pytest.raises(WireError, match=OLD_FORMAT + r", split-training 'SLT' frame\) that this build no longer"):
        decode(_v1_split_frame())
    # even the first bytes alone are recognised
    with pytest.raises(WireError, match=OLD_FORMAT):
        decode(_v1_vector_message()[:2])
    with pytest.raises(WireError, match=OLD_FORMAT):
        decode(b"SLT")


# ------------------------------------------------------------------------- sizes against version 1
def _v1_size(p: DensePayload | SparsePayload | SketchPayload) -> int:
    """Size in format version 1 (magic, version, flags, varints, seed, scale, body, CRC-32), uncompressed."""
    fixed = 3 + 4
    if isinstance(p, DensePayload):
        return fixed + len(varint(p.d)) + p.values.nbytes
    if isinstance(p, SketchPayload):
        return fixed + len(varint(p.d)) + len(varint(p.rows)) + len(varint(p.cols)) + 8 + p.table.nbytes
    size = fixed + len(varint(p.d)) + len(varint(p.k)) + p.values.nbytes
    if p.scale != 1.0 and not (p.k and p.scale == p.d / p.k):
        size += 8
    if p.indices is None:
        return size + 8
    return size + min(index_block_sizes(p.indices, p.d).values())


def _cases() -> list[DensePayload | SparsePayload | SketchPayload]:
    rng = np.random.default_rng(3)
    out: list = []
    for dt in (np.float16, np.float32):
        for d in (0, 1, 127, 128, 16_383, 16_384, 26_000):
            out.append(DensePayload(rng.standard_normal(d).astype(dt)))
        for d, k in ((26_000, 520), (1, 1), (200, 0), (128, 127), (20_000, 16_384)):
            out.append(SparsePayload(d=d, values=rng.standard_normal(k).astype(dt), seed=int(rng.integers(2**63)),
                                     scale=d / k if k else 1.0))
            out.append(SparsePayload(d=d, values=np.ones(k, dt), seed=7, scale=0.25))
            idx = np.sort(rng.choice(d, size=k, replace=False))
            out.append(SparsePayload(d=d, values=rng.standard_normal(k).astype(dt), indices=idx))
            out.append(SparsePayload(d=d, values=np.ones(k, dt), indices=idx, scale=3.0))
        for rows, cols in ((1, 1), (3, 200), (5, 5000)):
            out.append(SketchPayload(d=26_000, seed=11, table=rng.standard_normal((rows, cols)).astype(dt)))
    return out


@pytest.mark.parametrize("p", _cases(), ids=lambda p: f"{vector.payload_kind(p)}")
def test_each_vector_message_is_one_byte_longer_than_in_version_1(p) -> None:
    assert len(vector.encode(p)) == _v1_size(p) + 1


def test_randk_reference_size() -> None:
    """d=26,000, k=520 fp16 rand-k: 2k + 20 bytes in version 1, 2k + 21 now."""
    k = 520
    p = SparsePayload(d=26_000, values=np.zeros(k, np.float16), seed=1, scale=26_000 / k)
    assert _v1_size(p) == 2 * k + 20
    assert len(vector.encode(p)) == 2 * k + 21


def test_compact_patch_chain_parts_drop_frame_d_and_crc() -> None:
    """Against version 1 a compact chain part has no magic, version, CRC or d of its own (the chain carries
    d once and one CRC for all) and gains a kind-free header: ``6 + len(varint d)`` bytes shorter a part;
    the chain itself gains its flags byte and d."""
    rng = np.random.default_rng(4)
    d = 5000
    parts = tuple(
        SparsePayload(d=d, values=rng.standard_normal(k).astype(np.float16),
                      indices=np.sort(rng.choice(d, size=k, replace=False)))
        for k in (0, 3, 40, 500, 17)
    )
    chain = PatchChain(parts)
    v1_parts = [_v1_size(p) for p in parts]
    v1 = 3 + len(varint(len(parts))) + sum(len(varint(n)) + n for n in v1_parts) + 4
    compact = [n - 6 - len(varint(d)) for n in v1_parts]
    now = 3 + 1 + len(varint(len(parts))) + len(varint(d)) + sum(len(varint(n)) + n for n in compact) + 4
    assert len(vector.encode(chain)) == now
    assert v1 - now >= len(parts) * (6 + len(varint(d))) - 1 - len(varint(d))


def test_tensor_frames_are_three_bytes_shorter_than_in_version_1() -> None:
    assert FRAME_OVERHEAD == tensor.FRAME_OVERHEAD == 7  # version 1: "SLT", version, kind, reserved, CRC = 10
    assert len(tensor.encode_raw(b"abc")) == 10 - 3 + 3
    t = torch.zeros(4, 3)
    assert len(tensor.encode_tensor(0, 0, "emb", t)) == 10 - 3 + 11 + 3 + 4 * 2 + 48


# --------------------------------------------------------------------------------------- dtype table
def test_dtype_table_is_consistent() -> None:
    assert [t.code for t in dtypes.DTYPES] == list(range(1, 10))
    for t in dtypes.DTYPES:
        assert dtypes.by_code(t.code) is t and dtypes.by_name(t.name) is t and dtypes.by_name(t.long_name) is t
        assert dtypes.of_torch(t.torch) is t
        assert torch.empty((), dtype=t.torch).element_size() == t.itemsize
        if t is not dtypes.BF16:
            assert dtypes.of_numpy(t.numpy) is t
    assert [t.vector_bit for t in dtypes.VECTOR_DTYPES] == [0, 1]
    assert dtypes.by_name("fp16").numpy == np.float16 and dtypes.by_name("float32").torch == torch.float32
    assert dtypes.of_torch(torch.complex64) is None and dtypes.of_numpy(">f4") is None
    assert dtypes.by_code(0) is None and dtypes.by_name("half") is None
