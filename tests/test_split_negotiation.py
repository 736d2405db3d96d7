"""Task negotiation (P7) and failures of a party, in process (threads + emulated links)."""

from __future__ import annotations

import time

import pytest

from sluice.engine import Engine
from sluice.errors import NegotiationError, TrainingError, TransportError
from sluice.split import SplitConfig, SplitEngine, run_inprocess
from sluice.split.config import PartyPolicy
from sluice.split.engine import follower_for, task_loader
from sluice.split.follower import judge
from sluice.split.plan import make_plan, proposal_for


def _cfg(**kw) -> SplitConfig:
    base = {
        "train": {"steps": 6, "eval_every": 3},
        "pipeline": {"groups": 2},
        "transport": {"kind": "inproc", "timeout_s": 5},
    }
    for k, v in kw.items():
        base.setdefault(k, {}).update(v) if isinstance(v, dict) else base.__setitem__(k, v)
    return SplitConfig.model_validate(base)


@pytest.mark.parametrize(
    "party,match",
    [
        ({"require_tls": True}, "requires TLS"),
        ({"max_params": 10}, "at most 10"),
        ({"max_steps": 3}, "6 steps proposed"),
    ],
)
def test_follower_refuses_with_a_reason(party, match):
    t0 = time.perf_counter()
    with pytest.raises(NegotiationError, match=match):
        run_inprocess(_cfg(party=party, transport={"timeout_s": 120}))
    assert time.perf_counter() - t0 < 60  # answered, not left to the stall timeout


def test_judge_accepts_a_matching_proposal_and_checks_protocol_and_tls():
    plan = make_plan(_cfg(), ["a", "b"], ["c"])
    p = proposal_for(plan, 0, 2, tls=False, allow_batch_coupled=False)
    assert p["train_ids"] == ["a", "b"] and p["part"] == "follower-1.bottom"
    assert not {"dataset", "columns", "model", "task"} & set(p)  # a follower's task is its own
    assert judge(PartyPolicy(), p, secure=False) is None
    assert "protocol" in judge(PartyPolicy(), {**p, "protocol": 99}, secure=False)
    assert "encrypted" in judge(PartyPolicy(), {**p, "tls": True}, secure=False)


def _hook_fail_at(step: int, action):
    def hook(i, follower):
        orig = follower.step

        def step_fn(s):
            if s == step:
                action(follower)
            return orig(s)

        follower.step = step_fn

    return hook


def test_dead_follower_is_reported_not_hung():
    def boom(f):
        raise RuntimeError("disk on fire")

    t0 = time.perf_counter()
    with pytest.raises(TrainingError, match="follower-1 failed: RuntimeError: disk on fire"):
        run_inprocess(_cfg(), follower_hook=_hook_fail_at(3, boom))
    assert time.perf_counter() - t0 < 5


def test_stalled_follower_times_out():
    t0 = time.perf_counter()
    with pytest.raises(TransportError, match="stalled or died"):
        hook = _hook_fail_at(2, lambda f: time.sleep(2))
        run_inprocess(_cfg(transport={"timeout_s": 0.5}), follower_hook=hook)
    assert time.perf_counter() - t0 < 8


def test_cut_link_is_reported_on_the_leader():
    with pytest.raises(TransportError, match="cable"):
        run_inprocess(_cfg(), follower_hook=_hook_fail_at(2, lambda f: f.link.break_("cable cut")))


def test_engine_protocol_one_step_per_iterate(tmp_path):
    eng = SplitEngine(_cfg(train={"eval_every": 2}, transport={"timeout_s": 0.5}))
    assert isinstance(eng, Engine)
    events = [eng.iterate() for _ in range(3)]
    assert [e.iteration for e in events] == [0, 1, 2]
    assert all(e.bytes_up > 0 and e.bytes_down > 0 and e.seconds > 0 for e in events)
    assert "test_accuracy" in events[1].metrics and "test_accuracy" not in events[0].metrics
    eng.suspend()
    time.sleep(0.8)  # longer than the stall timeout: a suspended task must not fail
    eng.resume()
    assert eng.iterate().iteration == 3
    path = eng.save(str(tmp_path / "split.pt"))
    import torch

    states = torch.load(path)
    assert {"leader.top", "leader.bottom", "follower-1.bottom"} <= set(states)
    eng.stop()
    with pytest.raises(TrainingError):
        eng.iterate()


@pytest.mark.parametrize("mode", ["auto", "seed"])
def test_groups_chosen_from_measured_link_and_compute(mode):
    cfg = _cfg(pipeline={"groups": mode, "max_groups": 16}, train={"steps": 3}, model={"embedding": 64},
               transport={"emulate": {"bandwidth_mbps": 1.0, "burst_bytes": 1500}})
    res = run_inprocess(cfg)
    choice = res.summary["group_choice"]
    cal = res.summary["calibration"]
    # the probes measured the emulated 1 Mbit/s (125 kB/s) each way
    for way in ("down_Bps", "up_Bps"):
        assert 0.65 * 1.25e5 < cal["links"]["follower-1"][way] < 1.35 * 1.25e5
    # sending a batch (64 x 64 float32) takes ~131 ms, computing it about a millisecond: the parties time their
    # operations in the CPU time of the thread computing them, which a load that fills every core leaves alone
    assert choice["seed_formula"] > 2
    if mode == "seed":
        assert res.summary["groups"] == min(16, round(choice["seed_formula"]))
    else:
        assert res.summary["groups"] > 1 and choice["predicted_step_s"] < choice["predicted_serial_step_s"]
    assert all(r["groups"] == res.summary["groups"] for r in res.records)


def test_malformed_proposal_is_refused_not_crashed():
    from sluice.split.follower import Follower
    from sluice.transport.emulated import emulated_pair
    from sluice.wire.tensor import ControlMsg, decode, encode_control

    a, b = emulated_pair()
    f = Follower(b, PartyPolicy(), timeout_s=2, load=task_loader(_cfg()))
    a.send(encode_control("hello", {"protocol": 3, "follower": "follower-1", "followers": "x", "topology": "6"}))
    with pytest.raises(NegotiationError, match="malformed message|refused"):
        f.negotiate()
    msg = decode(a.recv(2))
    assert isinstance(msg, ControlMsg) and msg.type == "refuse" and msg.body["reason"]


def test_a_setup_wait_allows_setup_timeout_s_and_names_it():
    """Before training a peer may be silent longer (loading its task, intersecting ids with another party) than
    during it: the follower's wait for the proposal runs out after ``transport.setup_timeout_s``, not
    ``timeout_s``, and the error names the setting to raise."""
    from sluice.split.follower import Follower
    from sluice.split.links import emulated_links

    cfg = _cfg(transport={"timeout_s": 0.2, "setup_timeout_s": 1.0})
    _, ends = emulated_links(cfg, ["follower-1"])
    f = follower_for(ends[0], cfg)
    assert f.setup_timeout_s == 1.0
    t0 = time.perf_counter()
    with pytest.raises(TransportError, match=r"for 1 s while waiting for the task proposal from leader.*raise "
                                             r"transport\.setup_timeout_s"):
        f.wait_control("leader", "propose", "the task proposal", setup=True)
    assert time.perf_counter() - t0 >= 1.0
    with pytest.raises(TransportError, match=r"for 0\.2 s .*raise transport\.timeout_s "):
        f.pump(True, "a step")
    assert Follower(ends[0], cfg.party, 5.0, load=task_loader(cfg), setup_timeout_s=1.0).setup_timeout_s == 5.0
