"""Running a split-training task: in one process (threads + emulated links) or across processes (gRPC).

Both paths run the same :class:`~sluice.vfl.leader.Leader` and :class:`~sluice.vfl.follower.Follower`;
only the links differ.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sluice.errors import SluiceError, TransportError
from sluice.transport.emulated import emulated_pair
from sluice.transport.grpc_link import GrpcListener, TlsFiles, connect
from sluice.transport.link import Link

from .config import SplitConfig, TlsConfig
from .follower import Follower
from .leader import Leader
from .party import fail_peers, switch_interval
from .task import Task, build_task

Record = dict[str, Any]
OnRecord = Callable[[Record], None]


@dataclass
class SplitResult:
    """Step records, the run summary, and the trained parts this process can see (name -> state dict)."""

    records: list[Record]
    summary: dict[str, Any]
    states: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    traces: dict[str, list] = field(default_factory=dict)


def _make_leader(cfg: SplitConfig, links: dict[str, Link], task: Task) -> Leader:
    """The leader over ``links``; the links are closed if it cannot be built."""
    try:
        return Leader(cfg, links, task)
    except BaseException:
        for link in links.values():
            link.close()
        raise


def drive(leader: Leader, on_record: OnRecord | None = None) -> list[Record]:
    """Start, run every step, finish. Step records are passed to ``on_record`` as they complete."""
    records: list[Record] = []

    def emit(recs: list[Record]) -> None:
        for r in recs:
            records.append(r)
            if on_record is not None:
                on_record(r)

    leader.start()
    assert leader.steps is not None
    for _ in range(leader.steps):
        leader.run_step()
        emit(leader.records(wait=False))
    emit(leader.finish())
    return records


def summarize(leader: Leader, records: list[Record], wall_s: float) -> dict[str, Any]:
    """What ``summary.json`` holds."""
    steady = records[1:] if len(records) > 2 else records
    evals = [r for r in records if "test_accuracy" in r]
    last = evals[-1] if evals else {}
    parties = ["leader", *leader.followers]

    def mean(xs: list[float]) -> float:
        return float(np.mean(xs)) if xs else 0.0

    op_means: dict[str, dict[str, float]] = {}
    for p in parties:
        names = sorted({k for r in steady for k in r["op_s"].get(p, {})})
        op_means[p] = {k: mean([r["op_s"][p].get(k, [0.0])[0] for r in steady]) for k in names}
    out: dict[str, Any] = {
        "topology": leader.task.topology,
        "dataset": leader.cfg.data.dataset,
        "followers": leader.followers,
        "steps": len(records),
        "groups": leader.groups,
        "final_loss": records[-1]["loss"] if records else None,
        "final_test_loss": last.get("test_loss"),
        "final_test_accuracy": last.get("test_accuracy"),
        "final_test_auc": last.get("test_auc"),
        "mean_step_time_s": mean([r["step_time_s"] for r in steady]),
        "mean_idle_s": {p: mean([r["idle_s"][p] for r in steady]) for p in parties},
        "mean_op_s": op_means,
        "total_bytes_up": int(sum(r["bytes_up"] for r in records)),
        "total_bytes_down": int(sum(r["bytes_down"] for r in records)),
        "setup_bytes_up": int(getattr(leader, "setup_bytes_up", 0)),
        "setup_bytes_down": int(getattr(leader, "setup_bytes_down", 0)),
        "link_bytes": {n: leader.links[n].stats.as_dict() for n in leader.followers},
        "accepted": leader.accepted,
        "wall_s": round(wall_s, 3),
    }
    if leader.choice is not None:
        c = leader.choice
        out["group_choice"] = {
            "groups": c.groups,
            "seed_formula": c.seed_formula,
            "predicted_step_s": c.predicted_s,
            "predicted_serial_step_s": c.predicted_serial_s,
        }
        out["calibration"] = leader.calibration
    return out


def run_inprocess(
    cfg: SplitConfig, on_record: OnRecord | None = None, trace: bool = False, follower_hook: Any = None
) -> SplitResult:
    """Leader in this thread, each follower in a thread, joined by emulated links (``transport.emulate``).

    ``trace`` keeps every scheduling decision of every party (``SplitResult.traces``); ``follower_hook(i,
    follower)`` runs in follower ``i``'s thread before it serves (tests use it to inject failures)."""
    torch.set_num_threads(1)
    em = cfg.transport.emulate
    bw = None if em.bandwidth_mbps is None else em.bandwidth_mbps * 1e6
    task = build_task(cfg)
    links: dict[str, Link] = {}
    followers: list[Follower] = []
    for name in task.follower_names:
        a, b = emulated_pair(bw, em.latency_ms / 1000.0, em.burst_bytes, names=("leader", name))
        links[name] = a
        f = Follower(b, cfg.party, cfg.transport.timeout_s, cfg.pipeline.queue_threshold_bytes)
        followers.append(f)
    leader = _make_leader(cfg, links, task)
    errors: dict[int, BaseException] = {}

    def serve(i: int, f: Follower) -> None:
        try:
            if follower_hook is not None:
                follower_hook(i, f)
            f.serve()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            errors[i] = exc

    if trace:
        leader.trace = []
        for f in followers:
            f.trace = []
    threads = [threading.Thread(target=serve, args=(i, f), daemon=True) for i, f in enumerate(followers)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    try:
        with switch_interval(cfg.pipeline.switch_interval_ms):
            records = drive(leader, on_record)
    except BaseException as exc:
        fail_peers(leader, exc)
        for t in threads:
            t.join(timeout=5.0)
        raise
    for t in threads:
        t.join(timeout=cfg.transport.timeout_s + 5.0)
    if errors:
        raise next(iter(errors.values()))
    summary = summarize(leader, records, time.perf_counter() - t0)
    states = leader.state()
    for f in followers:
        assert f.model is not None
        states[f.proposal["part"]] = {k: v.detach().clone() for k, v in f.model.state_dict().items()}
    traces = {}
    if trace:
        traces["leader"] = leader.trace or []
        for f in followers:
            traces[f.name] = f.trace or []
    return SplitResult(records, summary, states, traces)


# -- processes and gRPC --------------------------------------------------------------------------


def tls_files(t: TlsConfig) -> TlsFiles | None:
    if not t.enabled:
        return None
    assert t.cert is not None and t.key is not None
    return TlsFiles(t.cert, t.key, t.ca, t.server_name)


def _die_with_parent(parent_pid: int | None) -> None:
    """Linux: ask for SIGTERM when the parent dies (a spawned follower never outlives ``split run``)."""
    if parent_pid is None:
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:  # pragma: no cover - not Linux
        pass
    if os.getppid() != parent_pid:
        sys.exit(3)


def serve_follower(
    cfg: SplitConfig,
    listen: str,
    name: str | None = None,
    ready_file: str | None = None,
    accept_timeout: float = 600.0,
    parent_pid: int | None = None,
    on_event: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Listen on ``listen``, serve one leader's task, return this follower's summary."""
    _die_with_parent(parent_pid)
    torch.set_num_threads(1)
    listener = GrpcListener(listen, tls_files(cfg.transport.tls), name or cfg.party.name)
    try:
        if on_event:
            on_event(f"listening on {listener.address}")
        if ready_file:
            tmp = Path(ready_file + ".tmp")
            tmp.write_text(listener.address)
            os.replace(tmp, ready_file)
        link = listener.accept(accept_timeout)
        if on_event:
            on_event("leader connected")
        f = Follower(link, cfg.party, cfg.transport.timeout_s, cfg.pipeline.queue_threshold_bytes)
        with switch_interval(cfg.pipeline.switch_interval_ms):
            return f.serve()
    finally:
        listener.close()


def connect_followers(cfg: SplitConfig, addresses: list[str]) -> dict[str, Link]:
    names = [f"follower-{i + 1}" for i in range(len(addresses))]
    links: dict[str, Link] = {}
    try:
        for name, addr in zip(names, addresses, strict=True):
            tls = tls_files(cfg.transport.tls)
            links[name] = connect(addr, cfg.transport.connect_timeout_s, tls, "leader")
    except BaseException:
        for link in links.values():
            link.close()
        raise
    return links


def run_leader(
    cfg: SplitConfig, addresses: list[str], on_record: OnRecord | None = None
) -> SplitResult:
    """The leader of a multi-process / multi-host task: connect to the followers and drive it."""
    torch.set_num_threads(1)
    if len(addresses) != cfg.followers:
        raise SluiceError(
            f"config says followers = {cfg.followers} but {len(addresses)} addresses were given"
        )
    task = build_task(cfg)
    links = connect_followers(cfg, addresses)
    t0 = time.perf_counter()
    leader = _make_leader(cfg, links, task)
    try:
        with switch_interval(cfg.pipeline.switch_interval_ms):
            records = drive(leader, on_record)
    except BaseException as exc:
        fail_peers(leader, exc)
        raise
    return SplitResult(records, summarize(leader, records, time.perf_counter() - t0), leader.state())


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + 3.0
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5.0)


def run_processes(cfg: SplitConfig, workdir: Path, on_record: OnRecord | None = None) -> SplitResult:
    """``sluice split run``: spawn one follower process per follower (loopback gRPC), lead from here.

    Followers get the resolved config as ``party.toml`` in ``workdir`` and log to ``follower-N.log``.
    They are always terminated when this returns or raises (and die with this process on Linux)."""
    import tomli_w

    from sluice.runs import _toml_ready

    workdir.mkdir(parents=True, exist_ok=True)
    cfg_path = workdir / "party.toml"
    cfg_path.write_text(tomli_w.dumps(_toml_ready(cfg.model_dump())))
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        ready = []
        for i in range(cfg.followers):
            name = f"follower-{i + 1}"
            rf = workdir / f"{name}.addr"
            rf.unlink(missing_ok=True)
            log = open(workdir / f"{name}.log", "w")  # noqa: SIM115 - closed in finally
            logs.append(log)
            cmd = [
                sys.executable, "-m", "sluice", "split", "party", "--role", "follower",
                "--listen", cfg.transport.listen, "--name", name, "--ready-file", str(rf),
                "--parent-pid", str(os.getpid()),
                "--accept-timeout", str(cfg.transport.connect_timeout_s + 30.0),
                str(cfg_path),
            ]  # fmt: skip
            env = dict(os.environ)
            env.setdefault("OMP_NUM_THREADS", "1")
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
            ready.append(rf)
        addresses = []
        deadline = time.monotonic() + cfg.transport.connect_timeout_s + 30.0
        for p, rf, i in zip(procs, ready, range(cfg.followers), strict=True):
            while not rf.exists():
                if p.poll() is not None:
                    tail = (workdir / f"follower-{i + 1}.log").read_text()[-2000:]
                    raise TransportError(f"follower-{i + 1} exited with status {p.returncode} before "
                                         f"listening:\n{tail}")
                if time.monotonic() > deadline:
                    raise TransportError(f"follower-{i + 1} did not start listening in time")
                time.sleep(0.05)
            addresses.append(rf.read_text().strip())
        result = run_leader(cfg, addresses, on_record)
        for p in procs:
            try:
                p.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                pass
        return result
    finally:
        _kill(procs)
        for log in logs:
            log.close()
