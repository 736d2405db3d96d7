"""Two Linux network namespaces joined by a veth pair, both ends shaped with ``tc tbf``.

Needs root and ``ip``/``tc`` (iproute2); netem is not required (latency is not added). Used by the split
benchmark to run leader and follower as separate processes over a real TCP path at a fixed rate::

    with NetnsPair(rate_mbit=100) as net:
        subprocess.Popen(net.exec_in(net.ns_b) + ["python", "-m", "sluice", ...])

Everything created is removed on exit, also when creation fails half-way.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from sluice.errors import TransportError


def _run(cmd: list[str]) -> None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TransportError(f"{' '.join(cmd)} failed: {exc}") from exc
    if p.returncode != 0:
        raise TransportError(f"{' '.join(cmd)} failed: {p.stderr.strip() or p.stdout.strip()}")


class NetnsPair:
    """Namespaces ``ns_a`` (address ``addr_a``) and ``ns_b`` (``addr_b``), a ``rate_mbit`` tbf each way."""

    _count = 0

    def __init__(self, rate_mbit: float = 100.0, burst: str = "16kb", queue_latency_ms: int = 50,
                 subnet: str = "10.231.77") -> None:
        NetnsPair._count += 1
        tag = f"{os.getpid() % 100000}x{NetnsPair._count % 100}"
        self.ns_a, self.ns_b = f"sla{tag}", f"slb{tag}"
        self.veth_a, self.veth_b = f"vsla{tag}", f"vslb{tag}"
        self.addr_a, self.addr_b = f"{subnet}.1", f"{subnet}.2"
        self.rate_mbit, self.burst, self.queue_latency_ms = rate_mbit, burst, queue_latency_ms
        self._created: list[str] = []

    def exec_in(self, ns: str) -> list[str]:
        """Command prefix that runs a program inside namespace ``ns``."""
        return ["ip", "netns", "exec", ns]

    def up(self) -> NetnsPair:
        if os.geteuid() != 0:
            raise TransportError("network namespaces need root")
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise TransportError(f"{tool} (iproute2) is not installed")
        try:
            for ns in (self.ns_a, self.ns_b):
                _run(["ip", "netns", "add", ns])
                self._created.append(ns)
            _run(["ip", "link", "add", self.veth_a, "type", "veth", "peer", "name", self.veth_b])
            ends = ((self.ns_a, self.veth_a, self.addr_a), (self.ns_b, self.veth_b, self.addr_b))
            for ns, dev, addr in ends:
                _run(["ip", "link", "set", dev, "netns", ns])
                _run(["ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev])
                _run(["ip", "-n", ns, "link", "set", dev, "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
                _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf",
                      "rate", f"{self.rate_mbit}mbit", "burst", self.burst,
                      "latency", f"{self.queue_latency_ms}ms"])
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Delete the namespaces (their veth ends go with them)."""
        while self._created:
            ns = self._created.pop()
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)

    def __enter__(self) -> NetnsPair:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


def netns_available() -> tuple[bool, str]:
    """Whether :class:`NetnsPair` works here, and why not."""
    try:
        with NetnsPair(subnet="10.231.78"):
            pass
    except TransportError as exc:
        return False, str(exc)
    return True, ""
