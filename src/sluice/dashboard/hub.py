"""Fan-out of dashboard events to the browsers connected by server-sent events.

A source (the service's change feed, or the files of run directories) publishes events from any thread;
each connected stream has its own asyncio queue on the server's event loop, and receives only the events
its caller may see (``accept``). A stream whose browser reads too slowly to keep up (its queue full) is
ended: the browser reconnects and starts again from a fresh snapshot, so no event is silently skipped.

A stream ends when the browser goes away, after :data:`STREAM_LIFETIME_S` (the browser reconnects at
once), or when the hub is closed. The hub closes when the server is told to stop (SIGINT/SIGTERM, see
:func:`close_on_exit_signals`): the web server waits for open responses before it stops, and an event
stream never ends by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

STREAM_LIFETIME_S = 300.0
KEEPALIVE_S = 10.0
QUEUE_MAX = 5000
RETRY_MS = 1000
"""What the stream tells ``EventSource``-like clients to wait before reconnecting."""

_CLOSED = object()


@dataclass(eq=False)
class _Stream:
    loop: asyncio.AbstractEventLoop
    accept: Callable[[dict[str, Any]], bool]
    queue: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(QUEUE_MAX))


class Hub:
    """Publish from any thread; :meth:`stream` yields the SSE text of one browser's events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: set[_Stream] = set()
        self.closed = threading.Event()

    @property
    def connected(self) -> int:
        with self._lock:
            return len(self._streams)

    def publish(self, event: dict[str, Any]) -> None:
        with self._lock:
            streams = list(self._streams)
        for s in streams:
            if s.accept(event):
                with contextlib.suppress(RuntimeError):  # its loop closed: the server is stopping
                    s.loop.call_soon_threadsafe(_put, s, event)

    def close(self) -> None:
        self.closed.set()
        with self._lock:
            streams = list(self._streams)
        for s in streams:
            with contextlib.suppress(RuntimeError):
                s.loop.call_soon_threadsafe(_put, s, _CLOSED)

    async def stream(self, accept: Callable[[dict[str, Any]], bool], first: list[dict[str, Any]],
                     disconnected: Callable[[], Any]) -> AsyncIterator[str]:
        """The SSE text of one connection: ``first`` (the snapshot), then every accepted event."""
        s = _Stream(asyncio.get_running_loop(), accept)
        with self._lock:
            self._streams.add(s)
        try:
            yield f"retry: {RETRY_MS}\n\n"
            for ev in first:
                yield sse(ev)
            t_end = time.monotonic() + STREAM_LIFETIME_S
            while not self.closed.is_set() and time.monotonic() < t_end:
                try:
                    ev = await asyncio.wait_for(s.queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    if await disconnected():
                        break
                    yield ": keep-alive\n\n"
                    continue
                if ev is _CLOSED:
                    break
                yield sse(ev)
        finally:
            with self._lock:
                self._streams.discard(s)


def _put(s: _Stream, event: Any) -> None:
    try:
        s.queue.put_nowait(event)
    except asyncio.QueueFull:  # too slow: end it, the browser reconnects from a snapshot
        while not s.queue.empty():
            s.queue.get_nowait()
        s.queue.put_nowait(_CLOSED)


def sse(event: dict[str, Any]) -> str:
    """One server-sent event: ``event: <type>`` and its JSON on one ``data:`` line."""
    return f"event: {event.get('type', 'message')}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


def close_on_exit_signals(hub: Hub) -> None:
    """Close ``hub`` first when the process is told to stop, then do what was done before (the web
    server's own stop). Only from the main thread (where signal handlers are set); elsewhere nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: Any, previous: Any = previous) -> None:
            hub.close()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)

        signal.signal(sig, handler)


@contextlib.asynccontextmanager
async def feeding(source: Any, hub: Hub) -> AsyncIterator[None]:
    """While the app runs: ``source`` publishes into ``hub``, and the hub closes on SIGINT/SIGTERM or at the end."""
    source.start()
    close_on_exit_signals(hub)
    try:
        yield
    finally:
        hub.close()
        source.stop()
