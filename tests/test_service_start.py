"""What stands between a created request and its first iteration.

* The workers' forkserver preloads what a worker imports on its way to the first iteration of the default
  jobs (torch's optimizers import ``torch._dynamo`` when the first one is built: about a second of CPU in
  every worker when it is not preloaded).
* The supervisor sleeps until something happens: it asks for the next queued process when it is woken or a
  worker ends, never on a timer nor after each message of a worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from multiprocessing import Pipe
from typing import Any

from sluice.service.worker import Supervisor

# Run in a fresh interpreter: the modules a worker forked from the preloaded forkserver imports to build the
# default job of each engine, train it one iteration (through TrainingProcess, as the worker does) and save it.
_NEW_MODULES = r"""
import importlib, json, sys, tempfile
from sluice.service.worker import PRELOAD
for name in PRELOAD:
    importlib.import_module(name)
before = set(sys.modules)
from sluice.control import ProcessOptions, ResourceSampler, TrainingProcess
from sluice.control.params import parse_termination
from sluice.runtimes.jobs import job_from_dict
from sluice.service.capabilities import probe_main
for kind in ("local", "hfl"):
    job = job_from_dict(kind, {})
    engine = job.build()
    dict(engine.metrics)
    options = ProcessOptions(sampler=ResourceSampler(), save_path=tempfile.mkdtemp() + "/model.pt")
    proc = TrainingProcess(engine, parse_termination({"iterations": 1}), None, job.model, options=options)
    proc.run()
print(json.dumps(sorted(set(sys.modules) - before)))
"""

# what a worker may not import for itself: Sluice's own modules and torch's compiler stack (torch._dynamo
# brings sympy, torch.fx, torch.distributed...); a few small modules (torch.utils.serialization) may load late
LATE = ("sluice.", "sympy", "torch._dynamo", "torch._inductor", "torch.fx", "torch.distributed", "scipy")


def test_the_forkserver_preloads_what_a_worker_imports_before_its_first_iteration():
    out = subprocess.run([sys.executable, "-c", _NEW_MODULES], capture_output=True, text=True, timeout=240,
                         check=True)
    new = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m for m in new if m.startswith(LATE)] == []


# --------------------------------------------------------------------------------- the supervisor's loop


class _FakeProcess:
    """Stands for a worker's OS process: alive until its end of the connection closes."""

    def __init__(self) -> None:
        self.exitcode: int | None = None
        self._alive = threading.Event()
        self._alive.set()

    def is_alive(self) -> bool:
        return self._alive.is_set()

    def join(self, timeout: float | None = None) -> None:
        pass

    def end(self) -> None:
        self.exitcode = 0
        self._alive.clear()

    terminate = kill = end


class _Recording(Supervisor):
    """A supervisor whose workers are a connection the test talks through (no OS process)."""

    def __init__(self, queue: list[dict[str, Any]]) -> None:
        self.queue = queue
        self.asked = 0
        self.asked_ev = threading.Condition()
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.got_ev = threading.Condition()
        self.worker_ends: dict[str, Any] = {}
        super().__init__(2, self._pick, self._message, start_method="spawn")

    def _pick(self) -> dict[str, Any] | None:
        with self.asked_ev:
            self.asked += 1
            self.asked_ev.notify_all()
            return self.queue.pop(0) if self.queue else None

    def _message(self, ldn: str, msg: dict[str, Any]) -> None:
        with self.got_ev:
            self.got.append((ldn, msg))
            self.got_ev.notify_all()

    def _launch(self, spec: dict[str, Any]) -> None:
        parent, child = Pipe(duplex=True)
        proc = _FakeProcess()
        self.worker_ends[spec["process"]] = (child, proc)
        from sluice.service.worker import Worker

        with self._registered:
            self.workers[spec["process"]] = Worker(spec["process"], proc, parent)
            self._registered.notify_all()

    def wait_asked(self, n: int) -> None:
        with self.asked_ev:
            assert self.asked_ev.wait_for(lambda: self.asked >= n, 30), (self.asked, n)

    def wait_got(self, n: int) -> None:
        with self.got_ev:
            assert self.got_ev.wait_for(lambda: len(self.got) >= n, 30), (self.got, n)


def test_the_supervisor_asks_for_the_next_process_only_when_woken_or_a_place_frees():
    sup = _Recording([{"process": "P1"}]).start()
    try:
        sup.wait_asked(2)  # at start: P1, then nothing more queued
        child, proc = sup.worker_ends["P1"]
        asked = sup.asked
        for i in range(1, 21):  # a worker's messages wake the loop: none of them looks at the queue
            child.send({"kind": "progress", "status": {"iterations": i}})
        sup.wait_got(20)
        assert sup.asked == asked, "the supervisor asked for the next process while a worker reported progress"
        sup.queue.append({"process": "P2"})
        sup.wake()  # a process was queued: started at once, with no polling interval
        sup.wait_asked(asked + 1)  # P2; two run: no more asking
        with sup._registered:
            assert sup._registered.wait_for(lambda: "P2" in sup.workers, 30)
        asked = sup.asked
        child.send({"kind": "done", "report": {}})  # P1's place frees: the queue is looked at again
        sup.wait_asked(asked + 1)
        sup.wait_got(21)
        assert sup.got[-1] == ("P1", {"kind": "done", "report": {}})
        child2, proc2 = sup.worker_ends["P2"]
        proc2.end()
        child2.close()  # a worker that exits without a word: died, reaped as soon as its connection closes
        sup.wait_got(22)
        assert sup.got[-1] == ("P2", {"kind": "died", "exitcode": 0})
        assert sup.running() in ([], ["P1"])
    finally:
        sup.stop(grace_s=0)
