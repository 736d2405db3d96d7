"""In-process link with emulated bandwidth and latency (full duplex, one token bucket per direction).

Each direction is shaped like Linux ``tc tbf``: a bucket of ``burst`` bytes refills at ``rate`` bytes/s;
a message of ``n`` bytes leaves when the bucket holds ``n`` tokens (a message larger than the bucket
streams out at the rate: it finishes ``(n - tokens) / rate`` seconds after it starts). Messages leave
in FIFO order, so a direction is busy for ``n / rate`` per message under load, and each message arrives
``latency`` seconds after its last byte left. The two directions are independent (full duplex).

Sleeping past the planned end of a transmission refills the bucket, so pacing errors of the OS timer
do not accumulate while the queue is busy.
"""

from __future__ import annotations

import queue
import threading
import time

from sluice.errors import ConfigError, TransportError

from .link import Delivery, Link


def _sleep_until(t: float) -> None:
    while True:
        left = t - time.perf_counter()
        if left <= 0:
            return
        time.sleep(left)


class _Direction:
    """Shapes the traffic ``src`` sends to ``dst``."""

    def __init__(
        self, src: EmulatedLink, dst: EmulatedLink, rate: float | None, burst: int, latency: float
    ) -> None:
        self.src, self.dst = src, dst
        self.rate, self.burst, self.latency = rate, burst, latency
        self.q: queue.Queue[bytes | None] = queue.Queue()
        self.delay_q: queue.Queue[tuple[float, bytes | None]] = queue.Queue()
        self.dead = False
        self.tx = threading.Thread(target=self._transmit, name=f"tx-{src.name}", daemon=True)
        self.tx.start()
        self.rx: threading.Thread | None = None
        if latency > 0:
            self.rx = threading.Thread(target=self._arrive, name=f"rx-{dst.name}", daemon=True)
            self.rx.start()

    def _transmit(self) -> None:
        tokens = float(self.burst)
        last = time.perf_counter()
        while True:
            payload = self.q.get()
            if payload is None or self.dead:
                self._handoff(time.perf_counter(), None)
                return
            n = len(payload)
            now = time.perf_counter()
            if self.rate is not None:
                tokens = min(float(self.burst), tokens + (now - last) * self.rate)
                last = now
                if n > tokens:
                    end = now + (n - tokens) / self.rate
                    _sleep_until(end)
                    tokens, last, now = 0.0, end, end
                else:
                    tokens -= n
            if self.dead:
                return
            self.src._sent(n)
            self._handoff(now, payload)

    def _handoff(self, t_done: float, payload: bytes | None) -> None:
        if self.rx is None:
            self._arrive_now(payload)
        else:
            self.delay_q.put((t_done + self.latency, payload))

    def _arrive_now(self, payload: bytes | None) -> None:
        if self.dead:
            return
        if payload is None:
            self.dst._fail("the peer closed the connection")
        else:
            self.dst._deliver(payload)

    def _arrive(self) -> None:
        while True:
            t, payload = self.delay_q.get()
            _sleep_until(t)
            self._arrive_now(payload)
            if payload is None:
                return


class EmulatedLink(Link):
    """One end of an in-process link made by :func:`emulated_pair`."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._out: _Direction | None = None
        self._pending = 0
        self._plock = threading.Lock()
        self._other: EmulatedLink | None = None

    def send(self, payload: bytes) -> None:
        if self._closed:
            raise TransportError(f"{self.name}: cannot send on a closed link")
        assert self._out is not None
        if self._out.dead:
            raise TransportError(f"{self.name}: the link is broken")
        with self._plock:
            self._pending += len(payload)
        self._out.q.put(payload)

    def _sent(self, n: int) -> None:
        with self._plock:
            self._pending -= n
        self._count_sent(n)

    def pending_bytes(self) -> int:
        with self._plock:
            return self._pending

    def close(self) -> None:
        """Close gracefully: queued messages are still delivered, then the peer sees the close."""
        if self._closed:
            return
        self._closed = True
        assert self._out is not None
        self._out.q.put(None)

    def break_(self, reason: str = "the link broke") -> None:
        """Fail abruptly both ways (a crashed peer or cut cable): queued data is lost."""
        for end in (self, self._other):
            assert end is not None and end._out is not None
            end._out.dead = True
            end._out.q.put(None)
            end._closed = True
            with end._lock:
                err = TransportError(f"{end._peer}: {reason}")
                end._inbox.put(Delivery(end._peer, None, time.perf_counter(), err))


def emulated_pair(
    bandwidth_bps: float | None = None,
    latency_s: float = 0.0,
    burst_bytes: int = 16 * 1024,
    names: tuple[str, str] = ("a", "b"),
    bandwidth_up_bps: float | None = None,
) -> tuple[EmulatedLink, EmulatedLink]:
    """Two connected ends. ``bandwidth_bps`` is in bits/s (``None``: unlimited) for ``a -> b``, and
    also for ``b -> a`` unless ``bandwidth_up_bps`` is given; ``latency_s`` is one-way."""
    for label, bw in (("bandwidth", bandwidth_bps), ("up bandwidth", bandwidth_up_bps)):
        if bw is not None and bw <= 0:
            raise ConfigError(f"{label} must be positive bits/s or None (unlimited), got {bw}")
    if latency_s < 0:
        raise ConfigError(f"latency must be >= 0 seconds, got {latency_s}")
    if burst_bytes < 1:
        raise ConfigError(f"burst must be >= 1 byte, got {burst_bytes}")
    a, b = EmulatedLink(names[0]), EmulatedLink(names[1])
    a._peer, b._peer = names[1], names[0]
    a._other, b._other = b, a
    down = None if bandwidth_bps is None else bandwidth_bps / 8.0
    up_bps = bandwidth_up_bps if bandwidth_up_bps is not None else bandwidth_bps
    up = None if up_bps is None else up_bps / 8.0
    a._out = _Direction(a, b, down, burst_bytes, latency_s)
    b._out = _Direction(b, a, up, burst_bytes, latency_s)
    return a, b
