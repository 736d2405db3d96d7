"""Tasks: the model and the data every engine trains (:class:`Task`), built-in or the user's own.

:func:`load_task` builds a job's task from its ``[task]``, ``[data]`` and ``[model]`` sections;
:func:`client_datasets` gives one training dataset per client, partitioning a task's one dataset with the
``[data]`` section's ``partition``, ``num_clients``, ``alpha`` and ``shards_per_client`` where given and the
task's :class:`Partition` otherwise. Importing this package (to read the ``[task]`` section) imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sluice._lazy import lazy_exports

if TYPE_CHECKING:
    from sluice.tasks.resolve import client_datasets, load_task
    from sluice.tasks.task import Partition, Task

__all__ = ["Partition", "Task", "client_datasets", "load_task"]

__getattr__ = lazy_exports(__name__, {"Partition": "task", "Task": "task", "client_datasets": "resolve",
                                      "load_task": "resolve"})
