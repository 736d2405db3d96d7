"""Wire format of split training: tensors and control messages as self-describing byte strings.

Every byte count Sluice reports for split training is ``len()`` of a string produced here.

Layout (all integers little-endian)::

    frame   = magic "SLT" | version u8 | kind u8 | reserved u8 | crc32 u32 | body
    body    = tensor | control | raw
    tensor  = step u32 | group u32 | dtype u8 | ndim u8 | tag_len u8 | tag (ASCII) | dims u32 * ndim | data
    control = UTF-8 JSON object {"type": str, ...}
    raw     = opaque bytes (link probes)

``crc32`` covers the body, so a truncated or corrupted frame is detected and raises :class:`WireError`
instead of yielding wrong numbers. Tensor data is the C-contiguous little-endian element array; its
length must equal ``prod(dims) * itemsize``.
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sluice.errors import WireError

MAGIC = b"SLT"
VERSION = 1
KIND_TENSOR = 1
KIND_CONTROL = 2
KIND_RAW = 3

_FRAME = struct.Struct("<3sBBBI")  # magic, version, kind, reserved, crc32
_TENSOR = struct.Struct("<IIBBB")  # step, group, dtype, ndim, tag_len

_DTYPES: dict[int, torch.dtype] = {
    1: torch.float32,
    2: torch.float64,
    3: torch.float16,
    4: torch.bfloat16,
    5: torch.int64,
    6: torch.int32,
    7: torch.uint8,
    8: torch.bool,
}
_CODES = {v: k for k, v in _DTYPES.items()}
_NP = {
    torch.float32: np.dtype("<f4"),
    torch.float64: np.dtype("<f8"),
    torch.float16: np.dtype("<f2"),
    torch.bfloat16: np.dtype("<i2"),  # raw 16-bit pattern
    torch.int64: np.dtype("<i8"),
    torch.int32: np.dtype("<i4"),
    torch.uint8: np.dtype("u1"),
    torch.bool: np.dtype("u1"),
}

FRAME_OVERHEAD = _FRAME.size


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


def _frame(kind: int, body: bytes | bytearray | memoryview, *parts: bytes) -> bytes:
    crc = zlib.crc32(body)
    for p in parts:
        crc = zlib.crc32(p, crc)
    return b"".join((_FRAME.pack(MAGIC, VERSION, kind, 0, crc), body, *parts))


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
    if tensor.dtype not in _CODES:
        allowed = ", ".join(str(d) for d in _CODES)
        raise WireError(f"cannot encode a tensor of dtype {tensor.dtype}; allowed: {allowed}")
    tag_b = tag.encode("ascii")
    if not 0 < len(tag_b) < 256:
        raise WireError(f"tensor tag must be 1-255 ASCII characters, got {tag!r}")
    if tensor.dim() > 255:
        raise WireError(f"tensor has {tensor.dim()} dimensions; at most 255 are allowed")
    if not (0 <= step < 2**32 and 0 <= group < 2**32):
        raise WireError(f"step and group must fit in 32 bits, got step={step} group={group}")
    head = _TENSOR.pack(step, group, _CODES[tensor.dtype], tensor.dim(), len(tag_b)) + tag_b
    head += struct.pack(f"<{tensor.dim()}I", *tensor.shape)
    return _frame(KIND_TENSOR, head, tensor_to_bytes(tensor))


def encode_control(type_: str, body: dict[str, Any] | None = None) -> bytes:
    """Encode a control message as JSON; ``body`` may not contain the key ``"type"``."""
    obj = dict(body or {})
    if "type" in obj:
        raise WireError("control message body may not contain the key 'type'")
    obj["type"] = type_
    return _frame(KIND_CONTROL, json.dumps(obj, separators=(",", ":")).encode("utf-8"))


def encode_raw(data: bytes) -> bytes:
    """Encode opaque bytes (a bandwidth probe)."""
    return _frame(KIND_RAW, data)


def encode(msg: Message) -> bytes:
    """Encode any message."""
    if isinstance(msg, TensorMsg):
        return encode_tensor(msg.step, msg.group, msg.tag, msg.tensor)
    if isinstance(msg, ControlMsg):
        return encode_control(msg.type, msg.body)
    return encode_raw(msg.data)


def decode(frame: bytes | bytearray | memoryview) -> Message:
    """Decode a frame produced by :func:`encode`; raises :class:`WireError` on any inconsistency."""
    view = memoryview(frame)
    if len(view) < _FRAME.size:
        raise WireError(f"frame of {len(view)} bytes is shorter than the {_FRAME.size}-byte header")
    magic, version, kind, _, crc = _FRAME.unpack_from(view)
    if magic != MAGIC:
        raise WireError(f"bad magic {bytes(magic)!r}: not a Sluice split-training frame")
    if version != VERSION:
        raise WireError(f"unsupported wire version {version}; this build reads version {VERSION}")
    body = view[_FRAME.size :]
    if zlib.crc32(body) != crc:
        raise WireError("checksum mismatch: the frame was truncated or corrupted in transit")
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
        raise WireError(f"unknown frame kind {kind}; known kinds are 1 (tensor), 2 (control), 3 (raw)")
    if len(body) < _TENSOR.size:
        raise WireError("tensor header truncated")
    step, group, code, ndim, tag_len = _TENSOR.unpack_from(body)
    off = _TENSOR.size
    if code not in _DTYPES:
        raise WireError(f"unknown dtype code {code}; known codes are {sorted(_DTYPES)}")
    if len(body) < off + tag_len + 4 * ndim:
        raise WireError("tensor header truncated")
    try:
        tag = bytes(body[off : off + tag_len]).decode("ascii")
    except UnicodeDecodeError as exc:
        raise WireError("tensor tag is not ASCII") from exc
    off += tag_len
    shape = struct.unpack_from(f"<{ndim}I", body, off)
    off += 4 * ndim
    dtype = _DTYPES[code]
    npdt = _NP[dtype]
    count = int(np.prod(shape, dtype=np.int64)) if ndim else 1
    if len(body) - off != count * npdt.itemsize:
        raise WireError(
            f"tensor data is {len(body) - off} bytes but shape {list(shape)} of {dtype} needs "
            f"{count * npdt.itemsize}"
        )
    arr = np.frombuffer(body[off:], dtype=npdt).copy().reshape(shape)
    t = torch.from_numpy(arr)
    if dtype == torch.bfloat16:
        t = t.view(torch.int16).view(torch.bfloat16)
    elif dtype == torch.bool:
        t = t.to(torch.bool)
    return TensorMsg(step, group, tag, t)
