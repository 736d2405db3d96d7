"""Links: full-duplex, message-oriented connections between two parties, with byte meters.

A :class:`Link` sends byte strings (encoded with :mod:`sluice.wire.tensor`) without blocking: each
message waits in the link's send queue, FIFO, until the transport has put it on the wire. The number
of queued bytes is :meth:`Link.pending_bytes` (the back-pressure signal of SPEC P4).

Received messages go to an :class:`Inbox`. A party with several peers attaches all its links to one
inbox and waits on it; every item carries the peer name and its arrival time. A failed link (peer
died, closed, stream broken) delivers a :class:`Delivery` with ``error`` set, so the waiting party
raises :class:`TransportError` at once instead of hanging; a silent peer is caught by the timeout of
:meth:`Inbox.get`.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

from sluice.errors import TransportError


@dataclass
class LinkStats:
    """Cumulative counters of one link end: ``len()`` of every message that went out and came in."""

    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "messages_sent": self.messages_sent,
            "messages_received": self.messages_received,
        }


@dataclass
class Delivery:
    """One item in an inbox: a payload from ``peer``, or the ``error`` that ended that peer's link."""

    peer: str
    payload: bytes | None
    arrived: float
    error: TransportError | None = None


class Inbox:
    """Where a party's links deliver. ``get`` waits at most ``timeout`` seconds (``None``: forever)."""

    def __init__(self) -> None:
        self._q: queue.Queue[Delivery] = queue.Queue()

    def put(self, item: Delivery) -> None:
        self._q.put(item)

    def get(self, timeout: float | None, waiting_for: str = "a message",
            setting: str = "transport.timeout_s") -> Delivery:
        """Next delivery (possibly a failure: check ``error``); raises :class:`TransportError` on timeout, naming
        ``setting``, the one that sets ``timeout``."""
        try:
            item = self._q.get(timeout=timeout)
        except queue.Empty:
            raise TransportError(
                f"no message arrived for {timeout:g} s while waiting for {waiting_for}; "
                f"the peer stalled or died (raise {setting} if it is just slow)"
            ) from None
        return item

    def get_nowait(self) -> Delivery | None:
        """Next delivery if one is waiting, else ``None``."""
        try:
            return self._q.get_nowait()
        except queue.Empty:
            return None

    def empty(self) -> bool:
        return self._q.empty()


class Link:
    """One end of a connection. Subclasses implement :meth:`send`, :meth:`pending_bytes`, :meth:`close`.

    Until :meth:`attach` is called, received messages collect in a private inbox read by :meth:`recv`.
    """

    #: whether the transport encrypts and authenticates (TLS)
    secure: bool = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.stats = LinkStats()
        self._lock = threading.Lock()
        self._inbox = Inbox()
        self._peer = name
        self._closed = False
        self._failure: TransportError | None = None

    # -- receiving -------------------------------------------------------------------------------
    def attach(self, inbox: Inbox, peer: str) -> None:
        """Deliver everything received from now on (and anything already waiting) to ``inbox``."""
        with self._lock:
            old, self._inbox, self._peer = self._inbox, inbox, peer
            while True:
                try:
                    item = old._q.get_nowait()
                except queue.Empty:
                    break
                item.peer = peer
                inbox.put(item)

    def recv(self, timeout: float | None = None) -> bytes:
        """Next payload of an unattached link; raises :class:`TransportError` on timeout or failure."""
        item = self._inbox.get(timeout, f"a message on {self.name}")
        if item.error is not None:
            raise item.error
        assert item.payload is not None
        return item.payload

    def _deliver(self, payload: bytes) -> None:
        with self._lock:
            self.stats.bytes_received += len(payload)
            self.stats.messages_received += 1
            self._inbox.put(Delivery(self._peer, payload, time.perf_counter()))

    def _fail(self, message: str) -> None:
        with self._lock:
            err = TransportError(f"{self._peer}: {message}")
            self._failure = err
            self._inbox.put(Delivery(self._peer, None, time.perf_counter(), err))

    def _count_sent(self, n: int) -> None:
        with self._lock:
            self.stats.bytes_sent += n
            self.stats.messages_sent += 1

    # -- sending ---------------------------------------------------------------------------------
    def send(self, payload: bytes) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def pending_bytes(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def flush(self, timeout: float) -> bool:
        """Wait until the send queue is empty; ``False`` if it did not drain within ``timeout``."""
        end = time.perf_counter() + timeout
        while self.pending_bytes() > 0:
            if time.perf_counter() > end:
                return False
            time.sleep(0.002)
        return True

    def close(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        return self._closed
