"""Upload compressors: chainable stages whose output is a :mod:`sluice.wire.vector` message.

:mod:`~sluice.compress.stages` holds the stages (``chain(topk(0.01), cast("int8"), to_bytes())``),
:mod:`~sluice.compress.estimate` what a receiver makes of their messages, :mod:`~sluice.compress.values` the
value types and quantisers, and :mod:`~sluice.compress.codecs` the client's :class:`Compressor`, built from
``[compression]`` by :func:`make_uplink` (the names of :data:`UPLINKS`, or the user's function that
``compression.uplink`` names).
"""

from sluice.compress.codecs import UPLINKS, Compressor, make_uplink
from sluice.compress.estimate import (
    decode_to_dense,
    randk_indices,
    sketch_hashes,
    to_dense,
    topk_indices,
    unsketch,
)
from sluice.compress.stages import (
    Stage,
    cast,
    chain,
    count_sketch,
    dense,
    error_feedback,
    randk,
    sample,
    sample_signs,
    to_bytes,
    topk,
    zstd,
)
from sluice.compress.values import value_type

__all__ = [
    "UPLINKS",
    "Compressor",
    "Stage",
    "cast",
    "chain",
    "count_sketch",
    "decode_to_dense",
    "dense",
    "error_feedback",
    "make_uplink",
    "randk",
    "randk_indices",
    "sample",
    "sample_signs",
    "sketch_hashes",
    "to_bytes",
    "to_dense",
    "topk",
    "topk_indices",
    "unsketch",
    "value_type",
    "zstd",
]
