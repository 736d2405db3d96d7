"""How a :class:`sluice.control.TrainingProcess` is wired: :class:`ProcessHooks` (what it calls while it
runs) and :class:`ProcessOptions` (how it runs and where more data comes from), each a frozen dataclass whose
fields all have defaults. :func:`sluice.control.make_process` and :func:`sluice.control.train` take the fields
of both as keyword arguments (:func:`split_keywords`); :func:`sampler_for` settles the resource sampler.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from sluice.control.params import ProcessState
from sluice.control.report import TrainingReport
from sluice.control.resources import ResourceSampler
from sluice.engine import IterationEvent
from sluice.errors import ConfigError

EventCallback = Callable[[IterationEvent, Any], None]
"""``on_event(event, process)``: after every iteration, with the :class:`~sluice.control.TrainingProcess`."""
StateCallback = Callable[[ProcessState, Any, TrainingReport | None], None]
"""``on_state(state, process, report)``: at every change of state."""
CheckpointCallback = Callable[[Any], None]
"""``on_checkpoint(process)``: when a checkpoint is due."""
DataProvider = Callable[[TrainingReport], Any]
"""``data_provider(interim report)``: more data, or None."""


@dataclass(frozen=True)
class ProcessHooks:
    """What a :class:`~sluice.control.TrainingProcess` calls while it runs.

    ``on_event(event, process)`` after every iteration; ``on_state(state, process, report)`` at every change
    of state (``report``: the interim report while awaiting data, the final one at the end, else None);
    ``on_checkpoint(process)`` after every ``checkpoint_every``-th iteration that training goes on from
    (``checkpoint_every`` 0: never; below 0 is refused when the process is built).
    """

    on_event: EventCallback | None = None
    on_state: StateCallback | None = None
    on_checkpoint: CheckpointCallback | None = None
    checkpoint_every: int = 0


@dataclass(frozen=True)
class ProcessOptions:
    """How a :class:`~sluice.control.TrainingProcess` runs and where more data comes from.

    ``save_path``: where the model is saved when training ends (None: not saved); ``sampler``: measures the
    resources (default: a :class:`ResourceSampler` when resource thresholds other than ``network_bytes`` are
    watched); ``data_provider(interim report)``: asked once each time the process awaits data, returns data
    or None; ``inbox``: a folder whose ``.npz`` files are taken as data while awaiting it
    (:mod:`sluice.control.inbox`), each file's arrays turned into the engine's data by ``inbox_adapter``;
    ``expected_iterations``: the iterations the preflight checks the compute requirement for (default: the
    iteration budget when the parameters name no result); ``probe_iterations``: the iterations measured to
    check ``max_training_time_s`` when the engine has no ``probe`` (at least 1); ``clock``: the time source
    (a :class:`~sluice.control.replay.ReplayEngine`'s ``clock`` replays a run's recorded times).
    """

    save_path: str | Path | None = None
    sampler: ResourceSampler | None = None
    data_provider: DataProvider | None = None
    inbox: str | Path | None = None
    inbox_adapter: Callable[[dict[str, Any]], Any] | None = None
    expected_iterations: int | None = None
    probe_iterations: int = 2
    clock: Callable[[], float] = time.monotonic


HOOKS = frozenset(f.name for f in fields(ProcessHooks))
OPTIONS = frozenset(f.name for f in fields(ProcessOptions))


def split_keywords(kwargs: Mapping[str, Any]) -> tuple[ProcessHooks, ProcessOptions]:
    """The hooks and options that keyword arguments name: ``hooks`` and ``options`` themselves (default: none
    and the defaults) with the fields of :class:`ProcessHooks` and :class:`ProcessOptions` given by name
    replaced; any other keyword is a :class:`TypeError`."""
    kw = dict(kwargs)
    hooks, options = kw.pop("hooks", None) or ProcessHooks(), kw.pop("options", None) or ProcessOptions()
    unknown = sorted(set(kw) - HOOKS - OPTIONS)
    if unknown:
        raise TypeError(f"unexpected keyword arguments {unknown}; a training process takes hooks, options and "
                        f"{sorted(HOOKS | OPTIONS)}")
    return (replace(hooks, **{k: v for k, v in kw.items() if k in HOOKS}),
            replace(options, **{k: v for k, v in kw.items() if k in OPTIONS}))


def sampler_for(sampler: ResourceSampler | None, watched: frozenset[str] | set[str]) -> ResourceSampler | None:
    """The sampler of the options, or a :class:`ResourceSampler` when none is given and resources other than
    ``network_bytes`` (which the process counts itself) are ``watched``; a :class:`ConfigError` when it cannot
    measure one of them."""
    watched = set(watched) - {"network_bytes"}
    if sampler is None and watched:
        sampler = ResourceSampler()
    if not watched:
        return sampler
    assert sampler is not None
    have = set(sampler.sample(force=True))
    missing = sorted(watched - have)
    if missing:
        raise ConfigError(f"resource thresholds {missing} cannot be measured here; measurable: "
                          f"{sorted(have | {'network_bytes'})}")
    return sampler
