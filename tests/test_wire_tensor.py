"""Split-training messages on the wire: exact round trips and loud failures on damaged frames."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import WireError
from sluice.wire import frame as wire_frame
from sluice.wire.tensor import (
    FRAME_OVERHEAD,
    ControlMsg,
    RawMsg,
    TensorMsg,
    decode,
    encode,
    encode_control,
    encode_raw,
    encode_tensor,
)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8,
          torch.bool]


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(0, 5), min_size=0, max_size=4),
    dtype=st.sampled_from(DTYPES),
    step=st.integers(0, 2**32 - 1),
    group=st.integers(0, 2**32 - 1),
    tag=st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=20),
    seed=st.integers(0, 1000),
)
def test_tensor_round_trip_is_exact(shape, dtype, step, group, tag, seed):
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g) * 100).to(dtype)
    frame = encode_tensor(step, group, tag, t)
    msg = decode(frame)
    assert isinstance(msg, TensorMsg)
    assert (msg.step, msg.group, msg.tag) == (step, group, tag)
    assert msg.tensor.dtype == dtype and list(msg.tensor.shape) == list(shape)
    assert torch.equal(msg.tensor, t)
    # size is header + tag + dims + raw element bytes, nothing hidden
    itemsize = torch.empty((), dtype=dtype).element_size()
    assert len(frame) == FRAME_OVERHEAD + 11 + len(tag) + 4 * len(shape) + itemsize * int(np.prod(shape))


def test_noncontiguous_tensor_is_sent_as_its_values():
    t = torch.arange(12.0).reshape(3, 4).t()
    assert torch.equal(decode(encode_tensor(0, 0, "x", t)).tensor, t)


def test_control_and_raw_round_trip():
    m = decode(encode_control("propose", {"ids": ["a", "b"], "g": 3}))
    assert m == ControlMsg("propose", {"ids": ["a", "b"], "g": 3})
    assert decode(encode_raw(b"\x00" * 10)) == RawMsg(b"\x00" * 10)
    assert decode(encode(ControlMsg("x"))) == ControlMsg("x", {})
    with pytest.raises(WireError):
        encode_control("x", {"type": "y"})


@pytest.mark.parametrize("pos", [3, 10, 20, -1])
def test_flipped_byte_is_detected(pos):
    frame = bytearray(encode_tensor(1, 2, "emb", torch.randn(4, 3)))
    frame[pos] ^= 0x40
    with pytest.raises(WireError):
        decode(bytes(frame))


def test_truncated_and_foreign_frames_are_rejected():
    frame = encode_tensor(1, 2, "emb", torch.randn(4, 3))
    for cut in (0, 5, FRAME_OVERHEAD + 3, len(frame) - 1):
        with pytest.raises(WireError):
            decode(frame[:cut])
    with pytest.raises(WireError, match="magic"):
        decode(b"XYZ" + frame[3:])
    with pytest.raises(WireError, match="version"):
        decode(frame[:1] + bytes([99]) + frame[2:])


def test_consistent_but_wrong_length_is_rejected():
    # a frame with a valid checksum whose data does not match its declared shape
    body = struct.pack("<IIBBB", 0, 0, 1, 1, 1) + b"x" + struct.pack("<I", 5) + b"\x00" * 8
    with pytest.raises(WireError, match="needs 20"):
        decode(wire_frame.frame(wire_frame.KIND_TENSOR, body))


def test_unencodable_tensors_are_refused():
    with pytest.raises(WireError, match="dtype"):
        encode_tensor(0, 0, "x", torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(WireError, match="tag"):
        encode_tensor(0, 0, "", torch.zeros(2))
    with pytest.raises(WireError, match="32 bits"):
        encode_tensor(2**32, 0, "x", torch.zeros(2))
