"""Cheap resource sampling of the training process tree (psutil).

One sample reads, for the process and its (cached) descendants: CPU times, resident memory and bytes
written to storage. The list of descendants is refreshed at most every ``tree_refresh_s`` seconds and a
new sample is taken at most every ``min_interval_s`` seconds (in between, the last sample is returned),
so monitoring stays a small fraction of an iteration.

* ``cpu_percent`` = Δ(user + system CPU seconds of the tree) / (Δwall · cores) · 100, over the interval
  since the previous sample (0–100 of the whole machine);
* ``memory_bytes`` = Σ RSS of the tree; ``memory_percent`` = memory_bytes / total memory · 100;
* ``storage_bytes`` = Σ write_bytes of the tree since the sampler started (absent where the OS does not
  count it).
"""

from __future__ import annotations

import os
import time

import psutil


class ResourceSampler:
    """Samples the resources of process ``pid`` (default: this process) and its descendants."""

    def __init__(
        self, pid: int | None = None, min_interval_s: float = 0.05, tree_refresh_s: float = 5.0
    ) -> None:
        self.root = psutil.Process(pid or os.getpid())
        self.min_interval_s = min_interval_s
        self.tree_refresh_s = tree_refresh_s
        self.cores = psutil.cpu_count() or 1
        self.total_memory = psutil.virtual_memory().total
        self._tree: list[psutil.Process] = [self.root]
        self._tree_at = -1e18
        self._last: dict[str, float] = {}
        self._last_at = -1e18
        self._cpu_prev: dict[int, float] = {}
        self._wall_prev = time.monotonic()
        self._write_base: dict[int, int] = {}
        self._write_done = 0  # bytes written by descendants that have exited
        self._write_last: dict[int, int] = {}
        self.io_supported = self._io_supported()
        self.sample(force=True)

    def _io_supported(self) -> bool:
        try:
            self.root.io_counters()
            return True
        except (AttributeError, psutil.AccessDenied, NotImplementedError):
            return False

    def _refresh_tree(self, now: float) -> None:
        if now - self._tree_at < self.tree_refresh_s:
            return
        self._tree_at = now
        try:
            kids = self.root.children(recursive=True)
        except psutil.Error:
            kids = []
        self._tree = [self.root, *kids]

    def sample(self, force: bool = False) -> dict[str, float]:
        """Current resource values (``cpu_percent``, ``memory_bytes``, ``memory_percent``,
        ``storage_bytes``); the cached ones when the last sample is younger than ``min_interval_s``."""
        now = time.monotonic()
        if not force and now - self._last_at < self.min_interval_s:
            return self._last
        self._refresh_tree(now)
        cpu = 0.0
        rss = 0
        written = 0
        alive = []
        for p in self._tree:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    rss += p.memory_info().rss
                    if self.io_supported:
                        wb = p.io_counters().write_bytes
                        base = self._write_base.setdefault(p.pid, wb)
                        self._write_last[p.pid] = wb - base
                        written += wb - base
            except psutil.Error:
                gone = self._write_last.pop(p.pid, 0)
                self._write_done += gone
                continue
            alive.append(p)
            total = t.user + t.system
            prev = self._cpu_prev.get(p.pid, total)
            cpu += max(0.0, total - prev)
            self._cpu_prev[p.pid] = total
        self._tree = alive or [self.root]
        dt = max(now - self._wall_prev, 1e-9)
        self._wall_prev = now
        out = {
            "cpu_percent": min(100.0, 100.0 * cpu / (dt * self.cores)),
            "memory_bytes": float(rss),
            "memory_percent": 100.0 * rss / self.total_memory,
        }
        if self.io_supported:
            out["storage_bytes"] = float(written + self._write_done)
        self._last, self._last_at = out, now
        return out
