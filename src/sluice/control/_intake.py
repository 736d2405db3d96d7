"""Training data on its way into the engine of a :class:`sluice.control.TrainingProcess`.

Data comes from three places: items handed to :meth:`TrainingProcess.add_data <sluice.control.TrainingProcess.add_data>`
(queued until the training thread takes them), the ``.npz`` files of an inbox folder (:mod:`sluice.control.inbox`)
and a data provider asked while the process awaits data. Every item passes the engine's optional
``check_data(data)`` before ``add_data(data)``: a :class:`~sluice.errors.DataError` refuses it, and the reason
is kept in :attr:`DataIntake.refused`. Any other error an engine call raises becomes :class:`EngineFailed`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.control import inbox as _inbox
from sluice.errors import DataError

if TYPE_CHECKING:
    from sluice.control.report import TrainingReport
    from sluice.engine import Engine


class EngineFailed(Exception):
    """The engine raised ``error`` during training."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def engine_call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the engine; an error it raises becomes :class:`EngineFailed`."""
    try:
        return fn(*args)
    except Exception as exc:
        raise EngineFailed(exc) from exc


class DataIntake:
    """The data a process hands its engine, and what became of it.

    ``cv`` is the process's condition: :meth:`add` notifies it, and :meth:`wait` waits on it, so a cancel
    wakes a wait at once. :attr:`taken` counts the queued items taken out for the engine (given or refused);
    :attr:`refused` holds ``"<source>: <reason>"`` for every item the engine refused.
    """

    def __init__(
        self,
        engine: Engine,
        cv: threading.Condition,
        inbox: str | Path | None = None,
        adapter: Callable[[dict[str, Any]], Any] | None = None,
        provider: Callable[[TrainingReport], Any] | None = None,
    ) -> None:
        self.engine, self.cv = engine, cv
        self.inbox = None if inbox is None else Path(inbox)
        self.adapter, self.provider = adapter, provider
        self.queue: list[Any] = []
        self.refused: list[str] = []
        self.taken = 0

    def add(self, data: Any) -> None:
        """Queue ``data`` for the engine (any thread)."""
        with self.cv:
            self.queue.append(data)
            self.cv.notify_all()

    def drain(self) -> list[Any]:
        """Every queued item, taken out of the queue (and counted in :attr:`taken`)."""
        with self.cv:
            data, self.queue = self.queue, []
            self.taken += len(data)
        return data

    def give(self, data: Any, source: str) -> bool:
        """Hand ``data`` to the engine after its ``check_data``; a :class:`DataError` refuses it: the reason
        is recorded in :attr:`refused` and False returned."""
        check = getattr(self.engine, "check_data", None)
        try:
            if check is not None:
                check(data)
            self.engine.add_data(data)
        except DataError as exc:
            self.refused.append(f"{source}: {exc}")
            return False
        except Exception as exc:
            raise EngineFailed(exc) from exc
        return True

    def take(self, interim: TrainingReport, asked: bool) -> bool | None:
        """Hand the engine the next data on offer: True = taken, False = refused, None = none on offer. The
        queue comes first, then the oldest inbox file, then (unless ``asked`` already) the provider, which
        is given ``interim``."""
        with self.cv:
            data = self.queue.pop(0) if self.queue else None
            self.taken += data is not None
        if data is not None:
            return self.give(data, "add_data")
        f = _inbox.oldest(self.inbox) if self.inbox is not None else None
        if f is not None:
            try:
                got = _inbox.load_arrays(f)
                got = self.adapter(got) if self.adapter else got
            except DataError as exc:
                self.refused.append(f"inbox {f.name}: {exc}")
                _inbox.settle(f, str(exc))
                return False
            taken = self.give(got, f"inbox {f.name}")
            _inbox.settle(f, None if taken else self.refused[-1])
            return taken
        if self.provider is not None and not asked:
            data = self.provider(interim)
            if data is not None:
                return self.give(data, "data provider")
        return None

    def wait(self, interim: TrainingReport, wait_s: float, cancelled: Callable[[], bool]) -> bool:
        """Take data until the engine accepts some (True), ``cancelled()`` holds or ``wait_s`` seconds have
        passed (False). Refused data does not end the wait; the provider is asked once."""
        deadline = time.monotonic() + wait_s
        asked = False
        while True:
            got = self.take(interim, asked)
            asked = True
            if got is not None:
                if got:
                    return True
                continue
            if cancelled():
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with self.cv:
                self.cv.wait(min(0.2, left))
