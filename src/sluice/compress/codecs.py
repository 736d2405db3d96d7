"""A client's uplink compressor: a stage chain (:mod:`sluice.compress.stages`) whose output is wire bytes, and
how the ``[compression]`` section builds it.

``compression.up`` names a main stage in :data:`UPLINKS`; ``up_values``, ``up_feedback``, ``up_sure_fp16`` and
``lossless`` put the value rounding, the error feedback and the final stage around it (:func:`make_uplink`).
``compression.uplink = "package.module:function"`` names a function that builds the whole chain instead
(:func:`user_uplink`). Either way every message is a :mod:`sluice.wire.vector` message that the server reads
with :func:`~sluice.compress.estimate.decode_to_dense`, and its length is what the upload costs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from sluice.compress.estimate import _is_tensor
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
from sluice.compress.values import ValueType, value_type
from sluice.errors import ConfigError, TaskError
from sluice.wire.vector import encode


class Compressor:
    """A client's uplink compressor: a stage chain whose output is encoded to bytes.

    ``state = c.init(d)``; ``buf, state = c.encode(x, state, rng)``; the server calls
    :func:`~sluice.compress.estimate.decode_to_dense` ``(buf)``. ``len(buf)`` is the uplink cost of the message,
    header included. A chain that ends in a payload instead of bytes has it encoded
    (:func:`sluice.wire.vector.encode`, no lossless stage). ``x`` may be a torch tensor on a GPU: top-k, sample
    and error feedback then compute there (:mod:`sluice.compress.device`), the other stages on its copy on the
    CPU.
    """

    def __init__(self, stage: Stage, *, name: str = "custom") -> None:
        self.stage = stage
        self.name = name

    def __repr__(self) -> str:
        return f"Compressor({self.name})"

    def init(self, d: int) -> tuple[int, Any]:
        """State for vectors of length ``d``."""
        if d < 0:
            raise ConfigError(f"vector length must be >= 0, got {d}")
        return (int(d), self.stage.init(int(d)))

    def encode(
        self, vec: np.ndarray, state: tuple[int, Any], rng: np.random.Generator
    ) -> tuple[bytes, tuple[int, Any]]:
        """Compress ``vec`` and return the wire message and the new state."""
        d, inner = state
        x = vec if _is_tensor(vec) else np.asarray(vec)
        if tuple(x.shape) != (d,):
            raise ValueError(f"compressor was initialised for d={d}, got a vector of shape {x.shape}")
        out, inner = self.stage.update(x, inner, rng)
        if not isinstance(out, bytes):
            out = encode(out)
        return out, (d, inner)


class Uplink(NamedTuple):
    """A main stage that ``compression.up`` names, and what :func:`make_uplink` puts around it."""

    stage: Callable[[Any], Stage]
    """The main stage, from the compression config."""
    auto: ValueType
    """The value type ``up_values = "auto"`` gives it."""
    sized: bool = False
    """It keeps ``k = up_ratio·d`` coordinates: its name carries ``up_ratio``, and ``up_feedback`` wraps it in
    :func:`~sluice.compress.stages.error_feedback`."""
    biased: bool = False
    """Its error feedback keeps everything the receiver's estimate lacks, not only the rounding of the values."""


UPLINKS: dict[str, Uplink] = {
    "dense": Uplink(lambda cfg: dense(), auto="fp32"),
    "randk": Uplink(lambda cfg: randk(cfg.up_ratio), auto="int8", sized=True),
    "topk": Uplink(lambda cfg: topk(cfg.up_ratio), auto="int8", sized=True, biased=True),
    "sample": Uplink(lambda cfg: sample(cfg.up_ratio), auto="sign", sized=True),
    "sketch": Uplink(lambda cfg: count_sketch(cfg.sketch_rows, cols_ratio=cfg.sketch_cols_ratio), auto="int8"),
}
"""The main stages ``compression.up`` names: dense fp32; rand-k, top-k and sample of ``up_ratio``; a count sketch
of ``sketch_rows`` rows and ``sketch_cols_ratio·d`` columns. Signs are the automatic values of sample uploads,
whose values below the cap are all ``±λ``; int8 those of the other compressed ones."""


def make_uplink(cfg: Any) -> Compressor:
    """The uplink compressor described by a :class:`sluice.hfl.config.CompressionConfig`.

    With ``uplink`` set, the user's chain (:func:`user_uplink`). Otherwise ``up`` picks the main stage in
    :data:`UPLINKS`, ``up_values`` the value precision (:func:`~sluice.compress.values.value_type`, "auto" as
    the main stage says; with ``up_sure_fp16`` a sample upload sends the values above the cap in fp16,
    :func:`~sluice.compress.stages.sample_signs`), ``up_feedback`` the error feedback of the stages sized by
    ``up_ratio``, and ``lossless`` the zstd final stage::

        chain(error_feedback(main, rounding, biased=...), final)   # up_feedback, randk/topk/sample
        chain(main, rounding, final)                               # otherwise
    """
    if getattr(cfg, "uplink", None) is not None:
        return user_uplink(cfg)
    kind = UPLINKS.get(cfg.up)
    if kind is None:
        raise ConfigError(f"compression.up must be one of {', '.join(UPLINKS)}; got {cfg.up!r}")
    values = value_type(cfg.up_values, dense=False, compressed=kind.auto)
    main = kind.stage(cfg)
    if cfg.lossless not in ("none", "zstd"):
        raise ConfigError(f"compression.lossless must be 'none' or 'zstd', got {cfg.lossless!r}")
    if cfg.up_sure_fp16 and (cfg.up != "sample" or values != "sign"):
        raise ConfigError(f"compression.up_sure_fp16 needs sample uploads with sign values; got up={cfg.up!r}, "
                          f"up_values={cfg.up_values!r}")
    name = f"{cfg.up}" + (f"({cfg.up_ratio:g})" if kind.sized else "")
    name += f"+{values}" + ("+fp16 above the cap" if cfg.up_sure_fp16 else "") + (
        "+zstd" if cfg.lossless == "zstd" else "")
    final = zstd() if cfg.lossless == "zstd" else to_bytes()
    rounding = sample_signs() if cfg.up_sure_fp16 else cast(values)
    if cfg.up_feedback and kind.sized:
        return Compressor(chain(error_feedback(main, rounding, biased=kind.biased), final), name=name + "+ef")
    return Compressor(chain(main, rounding, final), name=name)


def user_uplink(cfg: Any) -> Compressor:
    """The compressor of ``compression.uplink = "package.module:function"``: ``function(cfg)``, called with the
    compression config (whose ``up_ratio`` is this upload's k/d), returns a :class:`~sluice.compress.stages.Stage`
    chain or a :class:`Compressor`.

    The function is imported as a task's factory is (:func:`sluice.tasks.config.import_factory`) and called
    every time a compressor is built (once per client, and for each upload given its own ``up_ratio``). A chain
    that ends in a payload instead of bytes has it encoded. A one-line :class:`ConfigError` names the reference
    when it cannot be imported, when the function raises, or when it returns anything else.
    """
    from sluice.tasks.config import import_factory

    ref = cfg.uplink
    try:
        fn = import_factory(ref, "compression.uplink")
    except TaskError as exc:
        raise ConfigError(_one_line(str(exc))) from None
    try:
        made = fn(cfg)
    except Exception as exc:  # the user's function: any failure is the configuration's
        raise ConfigError(_one_line(f"compression.uplink {ref!r} failed: {type(exc).__name__}: {exc}")) from exc
    if isinstance(made, Compressor):
        return made
    if isinstance(made, Stage):
        return Compressor(made, name=ref)
    raise ConfigError(f"compression.uplink {ref!r} returned {type(made).__name__}, not a sluice.compress Stage "
                      "(a chain of stages) or Compressor")


def _one_line(message: str) -> str:
    """``message`` with its line breaks and runs of spaces as single spaces."""
    return " ".join(message.split())
