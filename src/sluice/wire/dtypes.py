"""The one table of element types Sluice puts on the wire.

Each :class:`WireDtype` ties together the short name used in configuration (``"fp16"``), the numpy and
torch type names (``"float16"``), the code byte a tensor message carries, the little-endian element
layout on the wire, and whether vector payloads may carry it (their flags byte has one bit for it)::

    code  name   numpy/torch name  wire layout        vector flag bit
    1     fp32   float32           <f4                0
    2     fp64   float64           <f8                -
    3     fp16   float16           <f2                1
    4     bf16   bfloat16          <i2 (raw 16 bits)  -
    5     int64  int64             <i8                -
    6     int32  int32             <i4                -
    7     uint8  uint8             u1                 -
    8     bool   bool              u1 (0 or 1)        -
    9     int8   int8              i1                 (quantised: flags bits 0-1 = 1, with a scale)

The table needs no torch import: :attr:`WireDtype.torch` resolves the torch type when first asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class WireDtype:
    """One element type: its names, tensor code byte and wire layout."""

    code: int
    """Byte that names the type in a tensor message."""
    name: str
    """Short name, as in configuration files (``"fp16"``)."""
    long_name: str
    """numpy and torch attribute name (``"float16"``; ``"bfloat16"`` exists in torch only)."""
    wire: np.dtype
    """Little-endian element layout on the wire (bfloat16 travels as its raw 16-bit pattern)."""
    vector_bit: int | None = None
    """Value of the dtype bit in a vector payload's flags, or None when vector payloads cannot carry it."""

    @property
    def numpy(self) -> np.dtype:
        """The native numpy type of the values (the wire layout for bfloat16, which numpy lacks)."""
        return np.dtype(self.long_name) if self.long_name != "bfloat16" else self.wire

    @property
    def torch(self) -> Any:
        """The ``torch.dtype`` (imports torch)."""
        import torch

        return getattr(torch, self.long_name)

    @property
    def itemsize(self) -> int:
        """Bytes per element on the wire."""
        return self.wire.itemsize


FP32 = WireDtype(1, "fp32", "float32", np.dtype("<f4"), vector_bit=0)
FP64 = WireDtype(2, "fp64", "float64", np.dtype("<f8"))
FP16 = WireDtype(3, "fp16", "float16", np.dtype("<f2"), vector_bit=1)
BF16 = WireDtype(4, "bf16", "bfloat16", np.dtype("<i2"))
INT64 = WireDtype(5, "int64", "int64", np.dtype("<i8"))
INT32 = WireDtype(6, "int32", "int32", np.dtype("<i4"))
UINT8 = WireDtype(7, "uint8", "uint8", np.dtype("u1"))
BOOL = WireDtype(8, "bool", "bool", np.dtype("u1"))
INT8 = WireDtype(9, "int8", "int8", np.dtype("i1"))

FP16_MAX: float = float(np.finfo(np.float16).max)
"""Largest finite fp16 value (65504): where values rounded to fp16 saturate instead of overflowing."""

DTYPES: tuple[WireDtype, ...] = (FP32, FP64, FP16, BF16, INT64, INT32, UINT8, BOOL, INT8)
"""Every element type, in code order."""

VECTOR_DTYPES: tuple[WireDtype, ...] = (FP32, FP16)
"""Value types of vector payloads, indexed by their flag bit."""

_BY_CODE = {t.code: t for t in DTYPES}
_BY_NAME = {**{t.long_name: t for t in DTYPES}, **{t.name: t for t in DTYPES}}


def by_code(code: int) -> WireDtype | None:
    """The type with this tensor code byte, or None."""
    return _BY_CODE.get(code)


def by_name(name: str) -> WireDtype | None:
    """The type called ``name``: short (``"fp16"``) or numpy/torch (``"float16"``); None if unknown."""
    return _BY_NAME.get(name)


def of_torch(dtype: Any) -> WireDtype | None:
    """The entry of a ``torch.dtype`` (``torch.float16`` -> :data:`FP16`), or None if it cannot travel."""
    return _BY_NAME.get(str(dtype).removeprefix("torch."))


def of_numpy(dtype: Any) -> WireDtype | None:
    """The entry of a numpy type of native or little-endian byte order, or None if it cannot travel."""
    dt = np.dtype(dtype)
    if dt.byteorder == ">" or (dt.byteorder == "=" and not np.little_endian):
        return None
    return _BY_NAME.get(dt.name)


def names(types: tuple[WireDtype, ...] = DTYPES) -> str:
    """``"fp32, fp64, ..."``: the short names, for error messages."""
    return ", ".join(t.name for t in types)
