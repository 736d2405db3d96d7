"""Split training behind the engine protocol of :mod:`sluice.engine` (one ``iterate`` = one step).

The followers run in threads over emulated links (``transport.emulate``); the number of steps is open,
so the control plane decides when to stop. ``suspend`` tells the followers to wait without their stall
timeout until ``resume``. Between ``start`` and ``stop`` the interpreter's thread switch interval is
``pipeline.switch_interval_ms``.
"""

from __future__ import annotations

import math
import sys
import threading
from pathlib import Path
from typing import Any

import torch

from sluice.engine import IterationEvent
from sluice.errors import ConfigError, TrainingError
from sluice.transport.emulated import emulated_pair
from sluice.transport.link import Link

from .config import SplitConfig
from .follower import Follower
from .leader import Leader
from .party import fail_peers
from .task import build_task


class SplitEngine:
    """In-process pipelined split training as an :class:`~sluice.engine.Engine`."""

    def __init__(self, cfg: SplitConfig) -> None:
        self.cfg = cfg
        self.leader: Leader | None = None
        self.followers: list[Follower] = []
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._suspended = False
        self._stopped = False
        self._old_switch: float | None = None

    def start(self) -> None:
        if self.leader is not None:
            return
        torch.set_num_threads(1)
        cfg = self.cfg
        if cfg.pipeline.switch_interval_ms is not None:  # restored by stop()
            self._old_switch = sys.getswitchinterval()
            sys.setswitchinterval(cfg.pipeline.switch_interval_ms / 1000.0)
        em = cfg.transport.emulate
        bw = None if em.bandwidth_mbps is None else em.bandwidth_mbps * 1e6
        task = build_task(cfg, unbounded=True)
        links: dict[str, Link] = {}
        for name in task.follower_names:
            a, b = emulated_pair(bw, em.latency_ms / 1000.0, em.burst_bytes, names=("leader", name))
            links[name] = a
            threshold = cfg.pipeline.queue_threshold_bytes
            self.followers.append(Follower(b, cfg.party, cfg.transport.timeout_s, threshold))
        self.leader = Leader(cfg, links, task)

        def serve(f: Follower) -> None:
            try:
                f.serve()
            except BaseException as exc:  # noqa: BLE001 - surfaced by iterate/stop
                self._errors.append(exc)

        self._threads = [threading.Thread(target=serve, args=(f,), daemon=True) for f in self.followers]
        for t in self._threads:
            t.start()
        try:
            self.leader.start()
        except BaseException as exc:
            fail_peers(self.leader, exc)
            raise

    def iterate(self) -> IterationEvent:
        if self.leader is None:
            self.start()
        assert self.leader is not None
        if self._stopped:
            raise TrainingError("the split-training engine was stopped; start a new one")
        if self._suspended:
            self.resume()
        try:
            s = self.leader.run_step()
            (rec,) = [r for r in self.leader.records(wait=True) if r["step"] == s]
        except BaseException as exc:
            fail_peers(self.leader, exc)
            raise
        metrics = {"train_loss": rec["loss"], "train_accuracy": rec["accuracy"]}
        anomaly, detail = None, ""
        if not math.isfinite(rec["loss"]):
            anomaly, detail = "DIVERGED", f"the training loss of step {s} is {rec['loss']}"
        for k in ("test_loss", "test_accuracy", "test_auc"):
            if k in rec:
                metrics[k] = rec[k]
        metrics["idle_leader_s"] = rec["idle_s"]["leader"]
        return IterationEvent(
            iteration=s, metrics=metrics, bytes_up=rec["bytes_up"], bytes_down=rec["bytes_down"],
            seconds=rec["step_time_s"], anomaly=anomaly, detail=detail,
        )

    def stop(self) -> None:
        if self.leader is None or self._stopped:
            return
        self._stopped = True
        try:
            self.leader.finish()
        finally:
            for t in self._threads:
                t.join(timeout=self.cfg.transport.timeout_s + 5.0)
            if self._old_switch is not None:
                sys.setswitchinterval(self._old_switch)
        if self._errors:
            raise self._errors[0]

    def suspend(self) -> None:
        if self.leader is not None and not self._suspended:
            self.leader.pause()
            self._suspended = True

    def resume(self) -> None:
        if self.leader is not None and self._suspended:
            self.leader.resume()
            self._suspended = False

    def add_data(self, data: Any) -> None:
        raise ConfigError(
            "split training fixes its samples when the parties negotiate the task; start a new task "
            "with the added samples instead"
        )

    def save(self, path: str) -> str:
        """Save every part's weights (leader and in-process followers) with ``torch.save``."""
        if self.leader is None:
            raise TrainingError("nothing to save: the engine has not started")
        states = self.leader.state()
        for f in self.followers:
            if f.model is not None:
                states[f.proposal["part"]] = f.model.state_dict()
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        torch.save(states, p)
        return str(p)
