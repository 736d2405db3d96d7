"""Messages of split training over the Sluice frame (format version 2, :mod:`sluice.wire.frame`).

Every byte count Sluice reports for split training is ``len()`` of a string produced here.

Layout (all integers little-endian)::

    frame   = magic 0x53 | version u8 (2) | kind u8 | body | crc32 u32 (of every byte before it)
    kind 16 tensor  = step u32 | group u32 | dtype u8 | ndim u8 | tag_len u8 | tag (ASCII) | dims u32 * ndim
                      | data
    kind 17 control = UTF-8 JSON object {"type": str, ...}
    kind 18 raw     = opaque bytes (link probes)

A frame adds :data:`FRAME_OVERHEAD` = 7 bytes to its body. The CRC is checked
before the body is interpreted, so a truncated or corrupted frame raises :class:`WireError` instead of
yielding wrong numbers. Tensor data is the C-contiguous little-endian element array; its length must equal
``prod(dims) * itemsize``. The dtype byte is the code of :mod:`sluice.wire.dtypes`.
"""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sluice.errors import WireError
from sluice.wire import dtypes
from sluice.wire.frame import FRAME_OVERHEAD, KIND_CONTROL, KIND_RAW, KIND_TENSOR, frame, kind_name, unframe

__all__ = [
    "FRAME_OVERHEAD",
    "KINDS",
    "ControlMsg",
    "Message",
    "RawMsg",
    "TensorMsg",
    "decode",
    "encode",
    "encode_control",
    "encode_raw",
    "encode_tensor",
    "tensor_to_bytes",
]

KINDS = (KIND_TENSOR, KIND_CONTROL, KIND_RAW)
"""The frame kinds of split-training messages."""

_TENSOR = struct.Struct("<IIBBB")  # step, group, dtype, ndim, tag_len


@dataclass
class TensorMsg:
    """One tensor of one group of one step, labelled with a short ASCII ``tag`` (``"emb"``, ``"grad"``...)."""

    step: int
    group: int
    tag: str
    tensor: torch.Tensor


@dataclass
class ControlMsg:
    """A control message (negotiation, reports, stop): a type name and a JSON-serialisable body."""

    type: str
    body: dict[str, Any] = field(default_factory=dict)


@dataclass
class RawMsg:
    """Opaque bytes, used to probe a link's bandwidth."""

    data: bytes


Message = TensorMsg | ControlMsg | RawMsg


def tensor_to_bytes(t: torch.Tensor) -> bytes:
    """The element array of ``t`` as little-endian bytes (C order)."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        arr = t.view(torch.int16).numpy()
    elif t.dtype == torch.bool:
        arr = t.to(torch.uint8).numpy()
    else:
        arr = t.numpy()
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts only
        arr = arr.byteswap()
    return arr.tobytes()


def encode_tensor(step: int, group: int, tag: str, tensor: torch.Tensor) -> bytes:
    """Encode one tensor message; raises :class:`WireError` for unsupported dtypes or oversized fields."""
    wdt = dtypes.of_torch(tensor.dtype)
    if wdt is None:
        allowed = ", ".join(f"torch.{t.long_name}" for t in dtypes.DTYPES)
        raise WireError(f"cannot encode a tensor of dtype {tensor.dtype}; allowed: {allowed}")
    tag_b = tag.encode("ascii")
    if not 0 < len(tag_b) < 256:
        raise WireError(f"tensor tag must be 1-255 ASCII characters, got {tag!r}")
    if tensor.dim() > 255:
        raise WireError(f"tensor has {tensor.dim()} dimensions; at most 255 are allowed")
    if not (0 <= step < 2**32 and 0 <= group < 2**32):
        raise WireError(f"step and group must fit in 32 bits, got step={step} group={group}")
    head = _TENSOR.pack(step, group, wdt.code, tensor.dim(), len(tag_b)) + tag_b
    head += struct.pack(f"<{tensor.dim()}I", *tensor.shape)
    return frame(KIND_TENSOR, head, tensor_to_bytes(tensor))


def encode_control(type_: str, body: dict[str, Any] | None = None) -> bytes:
    """Encode a control message as JSON; ``body`` may not contain the key ``"type"``."""
    obj = dict(body or {})
    if "type" in obj:
        raise WireError("control message body may not contain the key 'type'")
    obj["type"] = type_
    return frame(KIND_CONTROL, json.dumps(obj, separators=(",", ":")).encode("utf-8"))


def encode_raw(data: bytes) -> bytes:
    """Encode opaque bytes (a bandwidth probe)."""
    return frame(KIND_RAW, data)


def encode(msg: Message) -> bytes:
    """Encode any message."""
    if isinstance(msg, TensorMsg):
        return encode_tensor(msg.step, msg.group, msg.tag, msg.tensor)
    if isinstance(msg, ControlMsg):
        return encode_control(msg.type, msg.body)
    return encode_raw(msg.data)


def decode(buf: bytes | bytearray | memoryview) -> Message:
    """Decode a frame produced by :func:`encode`; raises :class:`WireError` on any inconsistency."""
    kind, body = unframe(buf)
    if kind == KIND_CONTROL:
        try:
            obj = json.loads(bytes(body).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise WireError(f"control message is not valid UTF-8 JSON: {exc}") from exc
        if not isinstance(obj, dict) or not isinstance(obj.get("type"), str):
            raise WireError("control message must be a JSON object with a string 'type'")
        type_ = obj.pop("type")
        return ControlMsg(type_, obj)
    if kind == KIND_RAW:
        return RawMsg(bytes(body))
    if kind != KIND_TENSOR:
        raise WireError(f"not a split-training message: message kind {kind} ({kind_name(kind)})")
    if len(body) < _TENSOR.size:
        raise WireError("tensor header truncated")
    step, group, code, ndim, tag_len = _TENSOR.unpack_from(body)
    off = _TENSOR.size
    wdt = dtypes.by_code(code)
    if wdt is None:
        raise WireError(f"unknown dtype code {code}; known codes are {[t.code for t in dtypes.DTYPES]}")
    if len(body) < off + tag_len + 4 * ndim:
        raise WireError("tensor header truncated")
    try:
        tag = bytes(body[off : off + tag_len]).decode("ascii")
    except UnicodeDecodeError as exc:
        raise WireError("tensor tag is not ASCII") from exc
    off += tag_len
    shape = struct.unpack_from(f"<{ndim}I", body, off)
    off += 4 * ndim
    dtype = wdt.torch
    count = int(np.prod(shape, dtype=np.int64)) if ndim else 1
    if len(body) - off != count * wdt.itemsize:
        raise WireError(
            f"tensor data is {len(body) - off} bytes but shape {list(shape)} of {dtype} needs "
            f"{count * wdt.itemsize}"
        )
    arr = np.frombuffer(body[off:], dtype=wdt.wire).copy().reshape(shape)
    t = torch.from_numpy(arr)
    if dtype == torch.bfloat16:
        t = t.view(torch.int16).view(torch.bfloat16)
    elif dtype == torch.bool:
        t = t.to(torch.bool)
    return TensorMsg(step, group, tag, t)
