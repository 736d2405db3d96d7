"""The leader's measurements behind the choice of G (SPEC P1): its own operations, each follower's compute
profile and each link's round-trip time and bandwidth each way, fed to the step-time model of
:mod:`sluice.split.grouping`. Functions of the leader (:class:`sluice.split.leader.Leader`, which calls them)
between the proposal and the start of training.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from sluice.wire.tensor import encode_raw

from .grouping import PipeStageModel, StepModel, choose_groups, linear_fit, profile_sizes, seed_formula
from .models import group_loss


def _time(fn: Any, repeats: int = 3) -> float:
    """Seconds of ``fn()``: the CPU time of this thread (torch computes in it alone), best of ``repeats``.
    Not the wall time: on a loaded machine that counts the waits for a core (and, for a party in a thread,
    for the interpreter lock), which are no cost of the operation."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best

def profile_leader(leader: Any, batch: int) -> dict[str, list[float]]:
    """Linear fits ``a0 + a1 n`` of the leader's operations (seconds for a group of ``n``)."""
    sizes = profile_sizes(batch)
    kept = [(m, {k: v.clone() for k, v in m.state_dict().items()}) for m in (leader.top, leader.bottom) if m]
    meas: dict[str, list[float]] = {"head": [], "bottom.fwd": [], "bottom.bwd": []}
    gen = torch.Generator().manual_seed(0)
    for n in sizes:
        y = leader.y[torch.arange(n) % len(leader.y)]
        z_in = torch.randn((n, *leader.top_in), dtype=leader.dtype, generator=gen).to(leader.device)

        def head(z_in: torch.Tensor = z_in, y: torch.Tensor = y, n: int = n) -> None:
            zi = z_in.clone().requires_grad_(True)
            group_loss(leader.party_task, leader.top(zi), y, n).backward()

        meas["head"].append(_time(head))
        if leader.bottom is not None:
            x = leader.X[torch.arange(n) % len(leader.X)]
            meas["bottom.fwd"].append(_time(lambda x=x: leader.bottom(x)))
            h = leader.bottom(x)
            g = torch.ones_like(h)
            meas["bottom.bwd"].append(_time(lambda h=h, g=g: h.backward(g, retain_graph=True)))
    for m, state in kept:  # running statistics (BatchNorm) as they were
        m.zero_grad(set_to_none=True)
        m.load_state_dict(state)
    return {k: linear_fit(sizes, v) for k, v in meas.items() if v}

def _wait_raw(leader: Any, peer: str) -> float:
    while not leader.raws[peer]:
        leader.pump(True, f"a link probe from {peer}")
    _, arrived = leader.raws[peer].popleft()
    return arrived

def probe_link(leader: Any, peer: str, nbytes: int) -> dict[str, float]:
    """Round-trip time and bandwidth each way (bytes/s) of the link to ``peer``."""
    rtts = []
    for i in range(3):
        t0 = time.perf_counter()
        leader.send_control(peer, "ping", {"i": i})
        msg = leader.wait_control(peer, "pong", "a pong")
        rtts.append(time.perf_counter() - t0)
        del msg
    rtt = min(rtts)
    t0 = time.perf_counter()
    leader.send_raw(peer, bytes(nbytes))
    leader.wait_control(peer, "probe_ack", "a probe acknowledgement")
    down_s = time.perf_counter() - t0 - rtt
    frame = len(encode_raw(bytes(nbytes)))
    t0 = time.perf_counter()
    leader.send_control(peer, "probe_req", {"bytes": nbytes})
    up_s = _wait_raw(leader, peer) - t0 - rtt
    floor = frame / 1e11  # an unlimited link: treat as 100 GB/s
    return {
        "rtt_s": rtt,
        "down_Bps": frame / max(down_s, floor),
        "up_Bps": frame / max(up_s, floor),
    }

def choose_g(leader: Any) -> int:
    """Measure, predict the step time for every G and pick the best (see :mod:`sluice.split.grouping`)."""
    B = leader.cfg.train.batch_size
    mine = profile_leader(leader, B)
    emb_bytes = B * max(int(np.prod(r["out_shape"])) for r in leader.ready.values()) * leader.dtype.itemsize
    nbytes = int(min(2 << 20, max(64 << 10, emb_bytes)))
    prof: dict[str, dict[str, Any]] = {}
    for name in leader.followers:
        leader.send_control(name, "profile_req", {"batch": B})
        prof[name] = leader.wait_control(name, "profile", "a compute profile", setup=True).body
    links = {name: probe_link(leader, name, nbytes) for name in leader.followers}
    o = leader.cfg.pipeline.op_overhead_ms / 1000.0

    def cpu(name: str, who: str, fit: list[float]) -> PipeStageModel:
        return PipeStageModel(name, f"cpu:{who}", fit[0] + o, fit[1])

    chains, extra, lat = [], [], 0.0
    seed_vals = []
    for name in leader.followers:
        p, lk = prof[name], links[name]
        fw, bw = cpu("follower.fwd", name, p["fwd"]), cpu("follower.bwd", name, p["bwd"])
        up = PipeStageModel("up", f"up:{name}", *p["bytes"], bandwidth=lk["up_Bps"])
        down = PipeStageModel("down", f"down:{name}", *p["bytes"], bandwidth=lk["down_Bps"])
        head = cpu("head", "leader", mine["head"])
        send_bytes = p["bytes"][0] + p["bytes"][1] * B
        if leader.topo.u_shape:
            a1f = cpu("leader.fwd", "leader", mine["bottom.fwd"])
            a1b = cpu("leader.bwd", "leader", mine["bottom.bwd"])
            down2 = PipeStageModel("down", f"down:{name}", *p["bytes"], bandwidth=lk["down_Bps"])
            up2 = PipeStageModel("up", f"up:{name}", *p["bytes"], bandwidth=lk["up_Bps"])
            chains.append([a1f, down, fw, up, head, down2, bw, up2, a1b])
            lat = max(lat, 2 * lk["rtt_s"])
            compute = a1f.seconds(B) + a1b.seconds(B)
        else:
            chains.append([fw, up, head, down, bw])
            lat = max(lat, lk["rtt_s"])
            compute = fw.seconds(B) + bw.seconds(B)
        seed_vals.append(seed_formula(send_bytes, lk["up_Bps"], compute))
    if leader.topo.leader_bottom and not leader.topo.u_shape:
        extra = [
            cpu("leader.fwd", "leader", mine["bottom.fwd"]),
            cpu("leader.bwd", "leader", mine["bottom.bwd"]),
        ]
    model = StepModel(chains, lat, extra)
    choice = choose_groups(model, B, leader.cfg.pipeline.max_groups, max(seed_vals))
    leader.choice = choice
    leader.calibration = {"leader": mine, "followers": prof, "links": links, "probe_bytes": nbytes}
    return choice.groups

