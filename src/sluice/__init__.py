"""Sluice: train models across parties that cannot pool their data or bandwidth.

The public Python API: :class:`Task` (the model and the data a job trains), :class:`Partition` (how Sluice
splits one dataset among clients) and :func:`run_task` (train a task as ``sluice run`` or ``sluice local``
would). Everything else may change between versions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice._lazy import lazy_exports

if TYPE_CHECKING:
    from sluice.api import run_task
    from sluice.tasks.task import Partition, Task

__version__ = "0.1.0"

__all__ = ["Partition", "Task", "__version__", "run_task"]

__getattr__ = lazy_exports(__name__, {"Partition": "tasks.task", "Task": "tasks.task", "run_task": "api"})
