"""The single-vector messages of :mod:`sluice.wire.vector`: dense, sparse and sketch (layout documented there).

The three kinds share one pipeline, :class:`VectorCodec`; a kind supplies only what differs: the fields its
payload puts in the message (:class:`Fields`: header varints, seed and scale, index block, high flag bits) and,
on the way back, how it reads its header (:class:`Head`) and builds its payload. The flags' value coding and
value type, the float32 value scale, the sign-bit packing and zstd are common. Decoding reads the header's size
fields, checks the message's length against them, checks the CRC and only then interprets the body.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from sluice.errors import WireError
from sluice.wire._vector_index import CODING_SEED, IndexCoding, block_bounds, decode_indices, encode_indices
from sluice.wire._vector_payloads import MAX_D, DensePayload, Payload, SketchPayload, SparsePayload, _value_type
from sluice.wire.dtypes import INT8, VECTOR_DTYPES
from sluice.wire.frame import (
    HEADER,
    KIND_DENSE,
    KIND_SKETCH,
    KIND_SPARSE,
    TRAILER,
    check_crc,
    frame,
    kind_name,
    read_varint,
    varint,
)

FLAG_FP16 = 1 << 2
"""Flags bit: the values are fp16 (:data:`sluice.wire.dtypes.FP16`), else fp32."""
FLAG_ZSTD = 1 << 3
"""Flags bit: the body is zstd-compressed."""
_VALUE_CODING = 0b11
_QUANT_INT8 = 1
_QUANT_SIGN = 2
_SCALE_ONE, _SCALE_D_OVER_K, _SCALE_EXPLICIT = 0, 1, 2
_FIXED = HEADER + 1  # frame header and flags

_ZSTD_LEVEL = 3
_ZSTD_PARAMS = zstandard.ZstdCompressionParameters.from_level(
    _ZSTD_LEVEL,
    format=zstandard.FORMAT_ZSTD1_MAGICLESS,
    write_content_size=True,
    write_checksum=False,
    write_dict_id=False,
)


# ---------------------------------------------------------------------------------------------- helpers
def _truncated(expected: int, got: int, *, at_least: bool = False) -> WireError:
    qual = "at least " if at_least else ""
    return WireError(f"message truncated: expected {qual}{expected} bytes, got {got}")


def _reserved(flags: int) -> WireError:
    return WireError(f"malformed header: reserved flag bits set (flags=0x{flags:02x})")


def _unpack(buf: bytes, pos: int, fmt: str) -> tuple[Any, int]:
    """One fixed-size field at ``pos`` and the position after it; truncation when the CRC would not fit."""
    size = struct.calcsize(fmt)
    if len(buf) < pos + size + TRAILER:
        raise _truncated(pos + size + TRAILER, len(buf), at_least=True)
    (value,) = struct.unpack_from(fmt, buf, pos)
    return value, pos + size


def _only_signs(arr: np.ndarray) -> bool:
    """Whether every value is +1 or -1 (an int8 payload whose values value coding 2 carries)."""
    return bool(np.all((arr == 1) | (arr == -1)))


def _value_bytes(arr: np.ndarray, signs: bool = False) -> bytes:
    """The values as they travel: packed sign bits (1 = negative, MSB first) or in their wire layout."""
    if signs:
        return np.packbits(arr < 0).tobytes()
    t = INT8 if arr.dtype == INT8.numpy else _value_type(arr)
    assert t is not None  # payload constructors check the value type
    return arr.astype(t.wire, copy=False).tobytes()


def _read_signs(block: bytes, count: int) -> np.ndarray:
    """int8 ``+-1`` from ``count`` packed sign bits (1 = negative); set padding bits are corruption."""
    bits = np.unpackbits(np.frombuffer(block, dtype=np.uint8))
    if np.any(bits[count:]):
        raise WireError("corrupt values: sign padding bits are set")
    return np.where(bits[:count] == 1, -1, 1).astype(np.int8)


def _unzstd(body: bytes, min_size: int, max_size: int) -> bytes:
    """Decompress a magicless zstd frame whose declared size lies in ``[min_size, max_size]``."""
    try:
        params = zstandard.get_frame_parameters(body, format=zstandard.FORMAT_ZSTD1_MAGICLESS)
        size = params.content_size
        if size == zstandard.CONTENTSIZE_UNKNOWN or not min_size <= size <= max_size:
            raise WireError(
                f"corrupt compressed body: declared size {size}, allowed [{min_size}, {max_size}]"
            )
        dctx = zstandard.ZstdDecompressor(format=zstandard.FORMAT_ZSTD1_MAGICLESS)
        reader = dctx.decompressobj()
        out = reader.decompress(body)
        if not reader.eof or reader.unused_data or len(out) != size:
            raise WireError("corrupt compressed body: zstd frame incomplete or followed by extra bytes")
        return out
    except zstandard.ZstdError as exc:
        raise WireError(f"corrupt compressed body: {exc}") from exc


def _read_body(buf: bytes, pos: int, zstd_body: bool, value_bytes: int, block: tuple[int, int, bool]) -> bytes:
    """The body from ``pos`` (decompressed): the message's length is checked against the header's sizes, then
    the CRC, then the body's own length (``value_bytes`` plus an index block of ``block`` bounds)."""
    n = len(buf)
    min_block, max_block, exact = block
    least = pos + value_bytes + min_block + TRAILER
    if zstd_body:
        if n < pos + 1 + TRAILER:
            raise _truncated(pos + 1 + TRAILER, n, at_least=True)
    elif exact:
        if n < least:
            raise _truncated(least, n)
        if n > least:
            raise WireError(f"message has trailing bytes: expected {least} bytes, got {n}")
    elif n < least:
        raise _truncated(least, n, at_least=True)
    check_crc(buf)
    body = buf[pos : n - TRAILER]
    if zstd_body:
        body = _unzstd(body, value_bytes + min_block, value_bytes + max_block)
    if len(body) < value_bytes + min_block or len(body) > value_bytes + max_block:
        raise WireError(f"corrupt body: {len(body)} bytes, expected {value_bytes + min_block}")
    return body


# -------------------------------------------------------------------------------------------- the pipeline
@dataclass(frozen=True)
class Fields:
    """What a single-vector payload puts in its message besides the flags' value bits and the value scale."""

    values: np.ndarray
    vscale: float | None
    high: int  # flag bits 4-7
    head: bytes  # the varints
    extra: bytes = b""  # seed and scale
    block: bytes = b""  # index block, after the values


@dataclass(frozen=True)
class Head:
    """A single-vector message's header fields before the value scale, and the body they announce."""

    d: int
    count: int  # values in the body
    shape: tuple[int, ...] = ()
    seed: int | None = None
    scale: float = 1.0
    coding: int = CODING_SEED
    block: tuple[int, int, bool] = (0, 0, True)  # index block bounds (vector_index.block_bounds)


@dataclass(frozen=True)
class VectorCodec:
    """One single-vector kind: ``fields`` (encode), ``read_head`` and ``build`` (decode) are its own; int8 values
    with a value scale are refused on decode unless ``quantisable``."""

    kind: int
    fields: Callable[[Any, IndexCoding], Fields]
    read_head: Callable[[bytes, int], tuple[Head, int]]
    build: Callable[[Head, np.ndarray, bytes, float | None], Payload]
    quantisable: bool = True

    def encode(self, payload: Any, lossless: bool, index_coding: IndexCoding) -> bytes:
        """The message of ``payload``; ``lossless`` zstd-compresses the body when that makes it smaller."""
        f = self.fields(payload, index_coding)
        signs = f.vscale is not None and _only_signs(f.values)
        body = _value_bytes(f.values, signs) + f.block
        extra = f.extra
        if f.vscale is not None:
            flags = (_QUANT_SIGN if signs else _QUANT_INT8) | f.high
            extra += struct.pack("<f", f.vscale)
        else:
            vtype = _value_type(f.values)
            assert vtype is not None and vtype.vector_bit is not None
            flags = (vtype.vector_bit << 2) | f.high
        if lossless and body:
            packed = zstandard.ZstdCompressor(compression_params=_ZSTD_PARAMS).compress(body)
            if len(packed) < len(body):
                body = packed
                flags |= FLAG_ZSTD
        return frame(self.kind, bytes([flags]), f.head, extra, body)

    def decode(self, buf: bytes) -> Payload:
        """The payload of a message of this kind (frame header and length already checked by the caller)."""
        flags = buf[HEADER]
        quant = flags & _VALUE_CODING
        if quant > _QUANT_SIGN or (quant and (not self.quantisable or flags & FLAG_FP16)):
            raise _reserved(flags)
        vtype = INT8 if quant else VECTOR_DTYPES[(flags >> 2) & 1]
        head, pos = self.read_head(buf, flags)
        vscale: float | None = None
        if quant:
            vscale, pos = _unpack(buf, pos, "<f")
        value_bytes = (head.count + 7) // 8 if quant == _QUANT_SIGN else head.count * vtype.itemsize
        body = _read_body(buf, pos, bool(flags & FLAG_ZSTD), value_bytes, head.block)
        try:
            if quant == _QUANT_SIGN:
                values = _read_signs(body[:value_bytes], head.count)
            else:
                values = np.frombuffer(body, dtype=vtype.wire, count=head.count).astype(vtype.numpy)
            return self.build(head, values, body[value_bytes:], vscale)
        except WireError:
            raise
        except (ValueError, IndexError, OverflowError) as exc:  # pragma: no cover - CRC makes this unlikely
            raise WireError(f"corrupt {kind_name(self.kind)} body: {exc}") from exc


# ----------------------------------------------------------------------------------------------- dense
def _dense_fields(p: DensePayload, index_coding: IndexCoding) -> Fields:
    return Fields(p.values, p.vscale, 0, varint(p.d))


def _dense_head(buf: bytes, flags: int) -> tuple[Head, int]:
    if flags >> 4:
        raise _reserved(flags)
    d, pos = read_varint(buf, _FIXED, "d", reserve=TRAILER)
    return Head(d, d), pos


def _dense_build(head: Head, values: np.ndarray, block: bytes, vscale: float | None) -> DensePayload:
    return DensePayload(values, vscale=vscale)


# ---------------------------------------------------------------------------------------------- sparse
def _sparse_fields(p: SparsePayload, index_coding: IndexCoding) -> Fields:
    d, k = p.d, p.k
    if p.indices is None:
        coding, block, extra = CODING_SEED, b"", struct.pack("<Q", p.seed)
    else:
        (coding, block), extra = encode_indices(p.indices, d, index_coding), b""
    if p.scale == 1.0:
        scale_mode = _SCALE_ONE
    elif k > 0 and p.scale == d / k:
        scale_mode = _SCALE_D_OVER_K
    else:
        scale_mode = _SCALE_EXPLICIT
        extra += struct.pack("<d", p.scale)
    return Fields(p.values, p.vscale, (coding << 4) | (scale_mode << 6), varint(d) + varint(k), extra, block)


def _sparse_head(buf: bytes, flags: int) -> tuple[Head, int]:
    coding, scale_mode = (flags >> 4) & 0b11, flags >> 6
    d, pos = read_varint(buf, _FIXED, "d", reserve=TRAILER)
    k, pos = read_varint(buf, pos, "k", reserve=TRAILER)
    if d > MAX_D or k > d:
        raise WireError(f"malformed header: sparse d={d}, k={k} (need k <= d <= {MAX_D})")
    if scale_mode == 3:
        raise WireError("malformed header: unknown scale mode 3")
    seed = None
    if coding == CODING_SEED:
        seed, pos = _unpack(buf, pos, "<Q")
    scale = 1.0
    if scale_mode == _SCALE_EXPLICIT:
        scale, pos = _unpack(buf, pos, "<d")
    elif scale_mode == _SCALE_D_OVER_K:
        if k == 0:
            raise WireError("malformed header: scale d/k with k=0")
        scale = d / k
    return Head(d, k, seed=seed, scale=scale, coding=coding, block=block_bounds(coding, k, d)), pos


def _sparse_build(head: Head, values: np.ndarray, block: bytes, vscale: float | None) -> SparsePayload:
    if head.coding == CODING_SEED:
        return SparsePayload(d=head.d, values=values, seed=head.seed, scale=head.scale, vscale=vscale)
    idx = decode_indices(head.coding, block, head.count, head.d)
    return SparsePayload(d=head.d, values=values, indices=idx, scale=head.scale, vscale=vscale)


# ---------------------------------------------------------------------------------------------- sketch
def _sketch_fields(p: SketchPayload, index_coding: IndexCoding) -> Fields:
    return Fields(p.table, None, 0, varint(p.d) + varint(p.rows) + varint(p.cols), struct.pack("<Q", p.seed))


def _sketch_head(buf: bytes, flags: int) -> tuple[Head, int]:
    if flags >> 4:
        raise _reserved(flags)
    d, pos = read_varint(buf, _FIXED, "d", reserve=TRAILER)
    rows, pos = read_varint(buf, pos, "rows", reserve=TRAILER)
    cols, pos = read_varint(buf, pos, "cols", reserve=TRAILER)
    if d > MAX_D or rows < 1 or cols < 1:
        raise WireError(f"malformed header: sketch d={d}, rows={rows}, cols={cols}")
    seed, pos = _unpack(buf, pos, "<Q")
    return Head(d, rows * cols, shape=(rows, cols), seed=seed), pos


def _sketch_build(head: Head, values: np.ndarray, block: bytes, vscale: float | None) -> SketchPayload:
    assert head.seed is not None
    return SketchPayload(d=head.d, seed=head.seed, table=values.reshape(head.shape))


DENSE = VectorCodec(KIND_DENSE, _dense_fields, _dense_head, _dense_build)
SPARSE = VectorCodec(KIND_SPARSE, _sparse_fields, _sparse_head, _sparse_build)
SKETCH = VectorCodec(KIND_SKETCH, _sketch_fields, _sketch_head, _sketch_build, quantisable=False)
