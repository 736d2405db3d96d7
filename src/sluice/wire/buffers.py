"""A federated message with the model's floating-point buffers beside it (frame kind 5, ``buffers``).

Models with running statistics (BatchNorm) carry them dense: every upload holds the client's buffers after
its local training, every downlink message the server's weighted average of the last round's (FedAvg of
the buffers; :mod:`sluice.hfl.server`). Body::

    varint n   length of the inner message
    n bytes    the inner message (a vector payload or a patch chain, framed as usual)
    4·b bytes  the b buffers, float32 little-endian

A model without floating-point buffers sends its messages bare, without this frame, and pays nothing for it.
"""

from __future__ import annotations

import numpy as np

from sluice.errors import WireError
from sluice.wire.frame import KIND_BUFFERS, check_header, frame, read_varint, unframe, varint

KINDS = (KIND_BUFFERS,)


def with_buffers(message: bytes, buffers: np.ndarray | None) -> bytes:
    """``message`` with ``buffers`` beside it; ``message`` itself when there are none."""
    if buffers is None or buffers.size == 0:
        return message
    return frame(KIND_BUFFERS, varint(len(message)), message, np.asarray(buffers, dtype="<f4").tobytes())


def split_buffers(buf: bytes, size: int) -> tuple[bytes, np.ndarray | None]:
    """``(inner message, buffers)`` of a message of :func:`with_buffers` for a model with ``size`` buffer
    scalars; ``(buf, None)`` for a message without buffers. :class:`WireError` when the buffers' count is not
    ``size``."""
    if len(buf) < 3 or check_header(buf) != KIND_BUFFERS:
        return buf, None
    _, body = unframe(buf)
    n, pos = read_varint(body, 0, "inner length")
    rest = len(body) - pos - n
    if rest < 0 or rest != 4 * size:
        raise WireError(f"buffers message: {max(rest, 0)} bytes of buffers after the {n}-byte message, the model "
                        f"has {size} buffer values ({4 * size} bytes)")
    inner = bytes(body[pos:pos + n])
    return inner, np.frombuffer(body[pos + n:], dtype="<f4").astype(np.float32)
