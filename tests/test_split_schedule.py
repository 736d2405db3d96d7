"""Scheduler of pipelined split training: priorities (P3), back-pressure (P4), FIG. 8 and FIG. 9 replays."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.split.schedule import Op, OpGraph, OpType, Scheduler, Subtype
from sluice.split.topology import TOPOLOGIES, In, topology

FIRST, SECOND = OpType.FIRST, OpType.SECOND
SENDS, FEEDS = Subtype.SENDS, Subtype.FEEDS


def test_first_type_before_second_type():
    s = Scheduler(10**9)
    bwd = Op("bwd", 0, SECOND)
    fwd = Op("fwd", 3, FIRST, SENDS)
    assert s.choose([bwd, fwd], 0).op is fwd
    assert s.choose([bwd], 0).op is bwd
    assert s.choose([bwd], 0).mode == "second"
    assert s.choose([], 0).op is None


def test_sending_subtype_outranks_feeding_subtype_then_group_order():
    s = Scheduler(10**9)
    feeds = Op("bottom.fwd", 0, FIRST, FEEDS)
    sends = Op("head", 5, FIRST, SENDS)
    assert s.choose([feeds, sends], 0).op is sends
    early = Op("head", 1, FIRST, SENDS)
    assert s.choose([sends, early, feeds], 0).op is early


def test_backpressure_switches_and_switches_back():
    s = Scheduler(1000)
    fwd = Op("fwd", 2, FIRST, SENDS)
    bwd = Op("bwd", 0, SECOND)
    # below the threshold: first type
    assert s.choose([fwd, bwd], 999).op is fwd
    # the queue reaches the threshold: second type
    d = s.choose([fwd, bwd], 1000)
    assert d.op is bwd and d.mode == "backpressure"
    # second-type input used up: back to first type although the queue is still full
    assert s.choose([fwd], 5000).op is fwd
    # queue drained below the threshold: back to first type
    assert s.choose([fwd, bwd], 10).op is fwd


def test_op_needs_consistent_type_and_subtype():
    with pytest.raises(ValueError):
        Op("x", 0, FIRST, None)
    with pytest.raises(ValueError):
        Op("x", 0, SECOND, SENDS)
    with pytest.raises(ValueError):
        Scheduler(0)


def test_graph_readiness():
    a = Op("a", 0, FIRST, SENDS, ())
    b = Op("b", 0, SECOND, None, ("k1", "k2"))
    g = OpGraph([a, b])
    assert g.ready == {a}
    g.offer("k1")
    assert b not in g.ready
    g.offer("k2")
    assert b in g.ready
    g.done(a)
    g.done(b)
    assert g.finished


# -- FIG. 8: training apparatus 3 (leader of topology 6: C1 bottom, C2 top) ----------------------------


def fig8(q1: deque, q2: set, c1_done: int, groups: int, q3: deque) -> tuple[str, int] | None:
    """Steps 803-810 of the seed's FIG. 8 ([0186]-[0208]). Step 809 dequeues queue 1 *and* queue 2; when
    queue 2 lacks that group's C1 output, C1 forward (805) has to produce it first."""
    if q1:  # 803 -> 809, 810: C2 forward + backward
        g = q1[0]
        if g in q2:
            return ("C2", g)
        return ("C1.fwd", c1_done)
    if c1_done < groups:  # 804 -> 805
        return ("C1.fwd", c1_done)
    if q3:  # 807 -> 808
        return ("C1.bwd", q3[0])
    return None  # wait: back to 803


_FIG8_NAMES = {"head": "C2", "bottom.fwd": "C1.fwd", "bottom.bwd": "C1.bwd"}


@settings(max_examples=60, deadline=None)
@given(groups=st.integers(1, 6), arrivals=st.lists(st.booleans(), min_size=60, max_size=60))
def test_leader_replays_fig8(groups: int, arrivals: list[bool]):
    step = 0
    ops = TOPOLOGIES["6"].ops("leader", step, groups, ["D"])
    graph = OpGraph(ops)
    sched = Scheduler(10**12)  # FIG. 8 has no threshold
    q1: deque[int] = deque()  # follower results waiting (group numbers)
    q2: set[int] = set()  # C1 results waiting
    q3: deque[int] = deque()  # C2 gradients for C1
    arrived = 0
    c1_done = 0
    decisions = 0
    for tick in range(200):
        if graph.finished:
            break
        # the follower's data of the next group may arrive between two decisions
        if arrived < groups and (arrivals[tick % len(arrivals)] or not graph.ready):
            q1.append(arrived)
            graph.offer(("in", step, "emb", "D", arrived))
            arrived += 1
        expected = fig8(q1, q2, c1_done, groups, q3)
        got = sched.choose(graph.ready, 0).op
        if expected is None:
            assert got is None
            continue
        assert got is not None
        assert (_FIG8_NAMES[got.name], got.group) == expected
        decisions += 1
        graph.done(got)
        if got.name == "bottom.fwd":
            c1_done += 1
            q2.add(got.group)
            graph.offer(("loc", step, "h", got.group))
        elif got.name == "head":
            q1.popleft()
            q2.discard(got.group)
            q3.append(got.group)
            graph.offer(("loc", step, "gh", got.group))
        else:
            q3.popleft()
    assert graph.finished
    assert decisions == 3 * groups


# -- FIG. 9: training apparatus 4 (follower of topology 6: model D) ----------------------------------


def fig9(q4_bytes: int, threshold: int, fwd_done: int, groups: int, q5: deque) -> tuple[str, int] | None:
    """Steps 903-908 of FIG. 9 ([0209]-[0225]); "greater than the first threshold" read as "reaches" (as
    in [0175]); when queue 5 is empty, [0177] switches back to first-type work."""
    if q4_bytes < threshold and fwd_done < groups:  # 903 -> 904
        return ("D.fwd", fwd_done)
    if q5:  # 906
        return ("D.bwd", q5[0])
    if fwd_done < groups:  # [0177]: the second-type input is used up
        return ("D.fwd", fwd_done)
    return None  # 907: not complete, wait for gradients


@settings(max_examples=60, deadline=None)
@given(
    groups=st.integers(1, 6),
    size=st.integers(1, 500),
    threshold=st.integers(1, 2000),
    drains=st.lists(st.integers(0, 600), min_size=40, max_size=40),
    grads=st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_follower_replays_fig9(groups, size, threshold, drains, grads):
    step = 0
    graph = OpGraph(TOPOLOGIES["6"].ops("follower", step, groups, ["C"]))
    sched = Scheduler(threshold)
    q4 = 0  # bytes waiting to be sent
    sent_groups = 0  # groups whose result has been produced
    q5: deque[int] = deque()
    grads_in = 0
    fwd_done = 0
    for tick in range(300):
        if graph.finished:
            break
        i = tick % len(drains)
        q4 = max(0, q4 - drains[i])
        if grads_in < sent_groups and (grads[i] or not graph.ready):
            q5.append(grads_in)
            graph.offer(("in", step, "grad", "C", grads_in))
            grads_in += 1
        expected = fig9(q4, threshold, fwd_done, groups, q5)
        dec = sched.choose(graph.ready, q4)
        if expected is None:
            assert dec.op is None
            continue
        assert dec.op is not None
        name = {"bottom.fwd": "D.fwd", "bottom.bwd": "D.bwd"}[dec.op.name]
        assert (name, dec.op.group) == expected
        if name == "D.bwd" and fwd_done < groups:
            assert dec.mode == "backpressure"
        graph.done(dec.op)
        if name == "D.fwd":
            fwd_done += 1
            sent_groups += 1
            q4 += size
        else:
            q5.popleft()
    assert graph.finished


def test_u_shape_graphs_have_the_seed_types():
    lead = {(o.name, o.type, o.subtype) for o in TOPOLOGIES["5"].ops("leader", 0, 2, ["B"])}
    assert ("bottom.fwd", FIRST, SENDS) in lead  # A1 forward: its result is sent
    assert ("head", FIRST, SENDS) in lead  # A2 forward + backward: gradient sent
    assert ("bottom.bwd", SECOND, None) in lead  # A1 backward: local only
    fol = {(o.name, o.type) for o in TOPOLOGIES["5"].ops("follower", 0, 2, ["A"])}
    assert fol == {("middle.fwd", FIRST), ("middle.bwd", FIRST)}
    lead6 = {(o.name, o.subtype) for o in TOPOLOGIES["6"].ops("leader", 0, 1, ["D"])}
    assert ("bottom.fwd", FEEDS) in lead6 and ("head", SENDS) in lead6
    with pytest.raises(ValueError, match="unknown topology '7'"):
        topology("7")


@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_topology_table_is_consistent(name):
    """Every tag a party waits for is sent by the other party, every local input is handed over by an
    operation of the same party, and each step's graph runs to the end when every peer sends its part."""
    from typing import get_args

    from sluice.split.config import SplitConfig

    assert set(get_args(SplitConfig.model_fields["topology"].annotation)) == set(TOPOLOGIES)
    t = TOPOLOGIES[name]
    for mine, theirs in ((t.leader_ops, t.follower_ops), (t.follower_ops, t.leader_ops)):
        sent = {o.sends for o in theirs}
        handed = {o.hands for o in mine}
        for o in mine:
            assert (o.sends is not None) == (o.subtype == SENDS), o
            for need in o.needs:
                assert need.tag in sent if isinstance(need, In) else need.name in handed
    assert t.tags == {o.sends for o in t.leader_ops + t.follower_ops} - {None}
    followers = ["f1"] if t.u_shape else ["f1", "f2"]
    graph = OpGraph(t.ops("leader", 3, 2, followers))
    for g in range(2):
        for o in t.follower_ops:
            if o.sends is not None:
                for p in followers:
                    graph.offer(("in", 3, o.sends, p, g))
    sched = Scheduler(10**9)
    while not graph.finished:
        op = sched.choose(graph.ready, 0).op
        assert op is not None, "the leader's graph is stuck"
        graph.done(op)
        spec = t.specs("leader")[op.name]
        if spec.hands is not None:
            graph.offer(("loc", 3, spec.hands, op.group))
    assert len(graph.ops) == 2 * len(t.leader_ops)
