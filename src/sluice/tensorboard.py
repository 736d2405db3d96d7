"""A run's metrics also as TensorBoard event files: ``--log-to tensorboard DIR`` of ``sluice run``, ``sluice local``
and ``sluice split run``.

Each ``metrics.jsonl`` line a run writes (:meth:`sluice.runs.RunDir.log`) becomes scalars at the step of its
iteration (``round``, ``step`` or ``iteration``): every metric under its own name, the bytes of the iteration
and so far under ``bytes/`` (``bytes/up``, ``bytes/down``, ``bytes/cum_up``, ``bytes/cum_down``) and the
estimate under ``estimate/``. Each run writes into ``DIR/<run directory's name>``, so that TensorBoard
(``tensorboard --logdir DIR``) shows the runs side by side. The writer is PyTorch's
:class:`torch.utils.tensorboard.SummaryWriter` (it needs the ``tensorboard`` package: ``sluice[tensorboard]``);
events are flushed as each line is written, so TensorBoard follows a run live.

Where to log is process-wide (:data:`LOG_TO`, set by the command line before the run starts): every
:class:`~sluice.runs.RunDir` made afterwards in this process writes to it.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from sluice.errors import ConfigError

KINDS = ("tensorboard",)
LOG_TO: list[tuple[str, Path]] = []
"""``(kind, folder)`` of every place runs also log to."""

_ITERATION = ("round", "step", "iteration", "epoch")
_BYTES = {"bytes_up": "bytes/up", "bytes_down": "bytes/down", "cum_bytes_up": "bytes/cum_up",
          "cum_bytes_down": "bytes/cum_down"}


def add_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-to", nargs=2, action="append", metavar=("KIND", "DIR"), default=None,
                        help="also write the metrics elsewhere: `tensorboard DIR` (event files under "
                        "DIR/<run>; needs sluice[tensorboard]); repeatable")


def configure(pairs: list[list[str]] | None) -> None:
    """Take the ``--log-to`` pairs of the command line (checked: a known kind, its package installed)."""
    LOG_TO.clear()
    for kind, folder in pairs or []:
        if kind not in KINDS:
            raise ConfigError(f"--log-to {kind}: unknown; one of {', '.join(KINDS)}")
        try:
            import tensorboard  # noqa: F401 - SummaryWriter needs it
        except ImportError as exc:
            raise ConfigError("--log-to tensorboard needs the tensorboard package: "
                              "pip install 'sluice[tensorboard]'") from exc
        LOG_TO.append((kind, Path(folder)))


class TensorBoardSink:
    """Scalars of one run's metrics lines in ``folder/<name>``."""

    def __init__(self, folder: Path, name: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(folder / name))

    def log(self, record: dict[str, Any]) -> None:
        step = next((record[k] for k in _ITERATION if isinstance(record.get(k), int)), None)
        if step is None:
            return
        for key, value in record.items():
            if key in _ITERATION or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not math.isfinite(value):
                continue
            tag = _BYTES.get(key) or (f"estimate/{key}" if key.startswith(("remaining_", "reach_", "progress_"))
                                      else key)
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def sinks_for(run_name: str) -> list[Any]:
    """The sinks a new run directory named ``run_name`` writes to (none unless ``--log-to`` was given)."""
    return [TensorBoardSink(folder, run_name) for kind, folder in LOG_TO if kind == "tensorboard"]
