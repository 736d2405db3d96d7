"""Sluice: train models across parties that cannot pool their data or bandwidth.

The public Python API: :class:`Task` (the model and the data a job trains), :class:`Partition` (how Sluice
splits one dataset among clients) and :func:`run_task` (train a task as ``sluice run`` or ``sluice local``
would); for split (vertical) training, :class:`SplitTask` (one party's share: its table and its parts),
:class:`Table` and :func:`read_table` (a party's own rows from CSV or Parquet); :class:`MetricSpec` (how a
task's own metric is read: its direction and range); the errors a caller may catch, :class:`SluiceError` and
its kinds :class:`ConfigError`, :class:`DataError` and :class:`TaskError`. Everything else may change between
versions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice._lazy import lazy_exports

if TYPE_CHECKING:
    from sluice.errors import ConfigError, DataError, SluiceError, TaskError
    from sluice.metrics import MetricSpec
    from sluice.runtimes.api import run_task
    from sluice.tasks.split import SplitTask
    from sluice.tasks.table import Table, read_table
    from sluice.tasks.task import Partition, Task

__version__ = "0.1.0"

__all__ = ["ConfigError", "DataError", "MetricSpec", "Partition", "SluiceError", "SplitTask", "Table", "Task",
           "TaskError", "__version__", "read_table", "run_task"]

__getattr__ = lazy_exports(__name__, {"Partition": "tasks.task", "Task": "tasks.task", "run_task": "runtimes.api",
                                      "SplitTask": "tasks.split", "Table": "tasks.table", "read_table": "tasks.table",
                                      "MetricSpec": "metrics", "SluiceError": "errors", "ConfigError": "errors",
                                      "DataError": "errors", "TaskError": "errors"})
