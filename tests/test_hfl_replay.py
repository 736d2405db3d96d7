"""Server momentum replayed by the clients on the output layer: the wire, the server step, the downlink and the
clients holding the server's model and velocity bit for bit."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from sluice.config import load_config
from sluice.errors import WireError
from sluice.hfl import HFLEngine, Server
from sluice.hfl.config import HFLConfig
from sluice.hfl.downlink import Downlink, apply_downlink, apply_message
from sluice.hfl.server import REPLAY_FALL, init_server, server_round, server_step
from sluice.models import mlp, output_layer
from sluice.wire.vector import (
    DensePayload,
    PatchChain,
    ReplayChain,
    SparsePayload,
    decode,
    encode,
    float_values,
    replay_block,
)

RHO = 0.9


def _innovations(rng: np.random.Generator, n: int, count: int, k: int = 5) -> tuple[SparsePayload, ...]:
    return tuple(SparsePayload(d=n, values=rng.normal(size=k).astype(np.float32),
                               indices=np.sort(rng.choice(n, size=k, replace=False))) for _ in range(count))


def test_replay_chain_round_trips_and_replays_the_heavy_ball() -> None:
    rng = np.random.default_rng(0)
    d, lo = 300, 250
    innovations = _innovations(rng, d - lo, 4)
    innovations += (SparsePayload(d=d - lo, values=np.zeros(0, np.float32), indices=np.zeros(0, np.int64)),)
    steps = PatchChain(tuple(SparsePayload(d=lo, values=np.array([1, -1], np.int8), indices=np.array([3, 7 + i]),
                                           vscale=0.25) for i in range(5)))
    decays = (RHO, 0.5, 0.0, RHO, 0.3)  # each round's decay travels with its innovation
    base = (rng.normal(size=d - lo).astype(np.float32), rng.normal(size=d - lo).astype(np.float32))
    replacement = SparsePayload(d=lo, values=np.ones(2, np.float32), indices=np.array([0, 9]))
    for chain in (ReplayChain(d, lo, steps, innovations, decays), ReplayChain(d, lo, replacement, base=base),
                  ReplayChain(d, lo, DensePayload(np.ones(lo, np.float32)), innovations, decays, base=base)):
        assert decode(encode(chain)) == chain
    model, velocity = rng.normal(size=d).astype(np.float32), np.ones(d - lo, np.float32)
    x, v = model.copy(), velocity.copy()
    for step in steps.parts:
        x[step.indices] += float_values(step)
    for c, r in zip(innovations, decays, strict=True):  # the heavy ball, spelled out; an empty innovation still
        v = np.float32(r) * v                            # replays the velocity
        v[c.indices] += float_values(c)
        x[lo:] += v
    got = apply_downlink(model, velocity, encode(ReplayChain(d, lo, steps, innovations, decays)))
    assert got[0].tobytes() == x.tobytes() and got[1].tobytes() == v.tobytes()
    block, vel = replay_block(model[lo:], velocity, innovations, decays)
    assert block.tobytes() == x[lo:].tobytes() and vel.tobytes() == v.tobytes()
    started = apply_downlink(model, velocity, encode(ReplayChain(d, lo, replacement, base=base)))
    assert started[0][lo:].tobytes() == base[0].tobytes() and started[1].tobytes() == base[1].tobytes()
    assert started[0][[0, 9]].tolist() == [1, 1] and started[0][1] == model[1]


def test_replay_chain_refuses_what_it_cannot_replay() -> None:
    rng = np.random.default_rng(1)
    d, lo = 300, 250
    innovations = _innovations(rng, d - lo, 2)
    decays = (RHO, RHO)
    rest = DensePayload(np.zeros(lo, np.float32))
    with pytest.raises(WireError, match="innovations are sparse payloads over d - lo = 50"):
        ReplayChain(d, lo, rest, _innovations(rng, d, 1), (RHO,))
    with pytest.raises(WireError, match="rest is a dense, sparse or chain payload over lo=250"):
        ReplayChain(d, lo, DensePayload(np.zeros(d, np.float32)))
    with pytest.raises(WireError, match="lo < d"):
        ReplayChain(d, d, DensePayload(np.zeros(d, np.float32)))
    for wrong in ((RHO,), (RHO, 1.0), (RHO, -0.1)):
        with pytest.raises(WireError, match="one decay in"):
            ReplayChain(d, lo, rest, innovations, wrong)
    chain = encode(ReplayChain(d, lo, rest, innovations, decays))
    with pytest.raises(WireError, match="cannot apply"):
        apply_downlink(np.zeros(d - 1, np.float32), None, chain)
    with pytest.raises(WireError, match="cannot replay"):
        replay_block(np.zeros(d - lo + 1, np.float32), np.zeros(d - lo + 1, np.float32), innovations, decays)
    with pytest.raises(WireError, match="cannot replay"):
        replay_block(np.zeros(d - lo, np.float32), np.zeros(d - lo, np.float32), innovations, (RHO,))
    buf = bytearray(chain)
    buf[3] |= 0x08  # a reserved flag bit
    with pytest.raises(WireError, match="reserved flag bits"):
        decode(bytes(buf))
    with pytest.raises(WireError, match="velocity"):
        apply_message(np.zeros(d, np.float32), chain)


def test_output_layer_is_the_last_linear_layer() -> None:
    assert output_layer(mlp(64, [128, 128], 10)) == 128 * 10 + 10
    assert output_layer(mlp(5, [], 3)) == 18


def _replayed(rounds: int, share: float = 0.05, seed: int = 2, d: int = 600, head: int = 100):
    """(states, steps, (innovation, decay) pairs) of ``rounds`` server rounds with the last ``head`` coordinates
    replayed."""
    rng = np.random.default_rng(seed)
    state = init_server(np.zeros(d, dtype=np.float32))
    states, steps, innovations = [state], [], []
    for _ in range(rounds):
        g = rng.normal(size=d) + 0.5  # a steady drift and noise
        state, step, innov = server_round(state, g, ratio=0.01, rho=RHO, values="sign", adapt=1.0,
                                          replay=(d - head, share))
        states.append(state)
        steps.append(step)
        innovations.append(innov)
    return states, steps, innovations


def test_replayed_block_moves_every_round_and_its_error_feedback_loses_nothing() -> None:
    """Every coordinate of the block with a velocity moves every round, though the innovation names 5 % of
    them; the block's residual plus what the innovations carried (their scale less max(f, 1 − ρ)) is the
    aggregate; the decay is ρ·min(1, f/(1 − ρ))."""
    d, head = 600, 100
    states, steps, replayed = _replayed(30, d=d, head=head)
    lo = d - head
    for before, after, step, (innov, decay) in zip(states[:-1], states[1:], steps, replayed, strict=True):
        assert innov.k == 5 and innov.d == head and np.all(step.indices < lo)
        assert np.array_equal(after.params[lo:] != before.params[lo:], after.momentum[lo:] != 0)
        rest = np.setdiff1d(np.arange(lo), step.indices)
        assert np.array_equal(after.params[rest], before.params[rest])  # the step is still sparse elsewhere
        f = after.replay_gain
        assert 0 < f <= 1.0 and decay == np.float32(RHO * min(1.0, f / (1 - RHO)))
    rng = np.random.default_rng(2)
    total = sum(rng.normal(size=d) + 0.5 for _ in range(30))
    sent = np.zeros(head)
    for after, (innov, _) in zip(states[1:], replayed, strict=True):
        sent[innov.indices] += float_values(innov) / max(after.replay_gain, 1 - RHO)
    np.testing.assert_allclose(sent + states[-1].residual[lo:], total[lo:], atol=1e-9)
    assert (states[-1].momentum[lo:] != 0).sum() > 10 * replayed[-1][0].k  # many more move than are sent


def test_replay_leaves_the_rest_to_the_landed_step_and_is_off_without_momentum() -> None:
    rng = np.random.default_rng(3)
    d, lo = 400, 350
    state = replace(init_server(rng.normal(size=d).astype(np.float32)), residual=rng.normal(size=d))
    g = rng.normal(size=d)
    new, step, (innov, decay) = server_round(state, g, ratio=0.02, rho=RHO, values="sign", replay=(lo, 0.1))
    masked = [a.copy() for a in (state.residual, state.momentum, g)]
    for a in masked:
        a[lo:] = 0.0
    alone, _, alone_step = server_step(replace(state, residual=masked[0], momentum=masked[1]), masked[2],
                                       ratio=0.02, rho=RHO, values="sign")
    assert step == alone_step and new.params[:lo].tobytes() == alone.params[:lo].tobytes()
    assert np.array_equal(new.residual[:lo], alone.residual[:lo]) and innov.k == 5 and decay == np.float32(RHO)
    plain, plain_step, none = server_round(state, g, ratio=0.02, rho=0.0, values="sign", replay=(lo, 0.1))
    _, _, want = server_step(state, g, ratio=0.02, values="sign")
    assert none is None and plain_step == want


def test_momentum_decays_faster_when_the_aggregate_turns_against_the_velocity() -> None:
    """f stays at 1 (FedAvgM) while the aggregates follow the velocity, falls REPLAY_FALL times faster than it rises
    once they turn against it, scaling the innovation down to 1 − ρ and then the momentum's decay towards 0, and
    rises again when they follow it."""
    d, lo = 200, 100
    state = init_server(np.zeros(d, dtype=np.float32))
    g = np.ones(d)

    def rounds(n: int, sign: float, adapt: float = 1.0) -> list[float]:
        nonlocal state
        out = []
        for _ in range(n):
            state, _, (_, decay) = server_round(state, sign * g, ratio=0.05, rho=RHO, values="sign", adapt=adapt,
                                                replay=(lo, 0.1))
            assert decay == np.float32(RHO * min(1.0, state.replay_gain / (1 - RHO)))
            out.append(state.replay_gain)
        return out

    assert rounds(5, 1.0) == [1.0] * 5
    f = rounds(40, -1.0)
    assert f[:2] == pytest.approx([math.exp(-REPLAY_FALL / 2), math.exp(-REPLAY_FALL)])
    low = int(np.argmin(f))
    assert f[low] < 1e-3 and f[-1] > 100 * f[low]  # back up once the velocity follows the aggregates
    rises = np.array(f[low + 1:]) / np.array(f[low:-1])
    assert np.all(rises <= math.exp(0.5) + 1e-9)  # rising at most e^(β/2) a round
    assert rounds(1, 1.0, adapt=0.0) == [f[-1]]  # no adaptive step: f stays


def test_replay_does_not_follow_a_diverging_heavy_ball() -> None:
    """Aggregates of a stiff quadratic (g = −θ plus noise) make FedAvgM's heavy ball (f held at 1) diverge on the
    replayed block. The rule fades the momentum and the block settles near the optimum; with the innovation's scale
    as its only lever (f ≥ 1 − ρ, before the fade) the block still grew to about 10⁴."""
    d, lo = 200, 100

    def block_norm(adapt: float) -> float:
        rng = np.random.default_rng(0)
        state = init_server(rng.normal(size=d).astype(np.float32))
        start = float(np.linalg.norm(state.params[lo:]))
        for _ in range(200):
            g = -state.params.astype(np.float64) + 0.1 * rng.normal(size=d)
            state, _, _ = server_round(state, g, ratio=0.05, rho=RHO, values="sign", adapt=adapt, replay=(lo, 0.4))
        return float(np.linalg.norm(state.params[lo:])) / start

    with np.errstate(over="ignore", invalid="ignore"):
        assert block_norm(0.0) > 1e6  # FedAvgM's heavy ball on this block diverges
    assert block_norm(1.0) < 0.1


@pytest.mark.parametrize("mode", ["per-client", "anchor", "initial", "dense"])
def test_stale_clients_replay_to_the_server_model_and_velocity_bit_for_bit(mode: str) -> None:
    d, head = 600, 100
    lo = d - head
    states, steps, innovations = _replayed(18, d=d, head=head)
    down = Downlink(d, mode, anchor_every=4, num_clients=3, replay=lo)
    held = {t: (states[0].params.copy(), None) for t in range(3)}
    anchor = (states[0].params.copy(), None)  # what the initial and anchor modes patch: θ_0, then the anchors
    schedule = {1: [0, 1, 2], 2: [0], 3: [0], 5: [1], 9: [0, 2], 10: [1], 17: [2], 18: [0, 1, 2]}
    kinds = set()
    for rnd in range(1, 19):
        state = states[rnd - 1]
        velocity = state.momentum[lo:].astype(np.float32)
        for t in schedule.get(rnd, []):
            msg = down.message(t, state.params, velocity)
            held[t] = apply_downlink(*(anchor if mode in ("initial", "anchor") else held[t]), msg)
            assert held[t][0].tobytes() == state.params.tobytes(), f"client {t} at round {rnd}"
            assert held[t][1].tobytes() == velocity.tobytes()
            kinds.add(decode(msg).base is None)
        down.record(steps[rnd - 1], innovations[rnd - 1])
        after = states[rnd]
        broadcast = down.anchor_broadcast(after.params, after.momentum[lo:].astype(np.float32))
        assert (broadcast is not None) == (mode == "anchor" and rnd % 4 == 0)
        if broadcast is not None:
            anchor = apply_downlink(*anchor, broadcast)
            assert anchor[0].tobytes() == after.params.tobytes()
            assert anchor[1].tobytes() == after.momentum[lo:].astype(np.float32).tobytes()
    # innovations since the client's round or the anchor; the model and velocity where the log is not kept (the
    # initial mode's first round has no innovation to send)
    assert kinds == {"per-client": {True}, "anchor": {True}, "initial": {True, False}, "dense": {False}}[mode]
    full = decode(down.full_message(states[18].params, states[18].momentum[lo:].astype(np.float32)))
    assert full.base is not None and not full.innovations and isinstance(full.rest, DensePayload)
    copy = Downlink.from_tree(down.to_tree())
    assert copy.replay == down.replay and len(copy.log) == len(down.log)
    assert all(a[2] == b[2] for a, b in zip(copy.log, down.log, strict=True))


def test_replay_is_on_with_momentum_a_share_and_a_top_k_step_only() -> None:
    def replay(*sets: str) -> int | None:
        return Server(load_config(None, list(sets), HFLConfig), np.zeros(50, np.float32), 4, output_layer=10).replay

    on = ("compression.momentum=0.9", "compression.momentum_replay=0.4")
    assert replay(*on) == 40
    assert replay(*on, 'compression.downlink="anchor"') == 40
    assert replay("compression.momentum=0.9") == 40  # on by default with momentum
    assert replay("compression.momentum=0.9", "compression.momentum_replay=0") is None
    assert replay("compression.momentum_replay=0.4") is None  # no momentum
    assert replay(*on, 'compression.down="dense"') is None  # FedAvgM moves everything
    cfg = load_config(None, list(on), HFLConfig)
    assert Server(cfg, np.zeros(50, np.float32), 4).replay is None  # no output layer named


def test_engine_clients_hold_the_model_and_velocity_and_the_output_layer_learns_with_momentum() -> None:
    sets = ["train.rounds=12", "data.num_clients=8", "model.hidden=[16]", "train.local_epochs=1",
            "compression.momentum=0.9", "compression.momentum_replay=0.4"]
    eng = HFLEngine(load_config(None, sets, HFLConfig))
    for _ in range(11):
        eng.iterate()
    server = eng.server
    before = server.params.copy()
    eng.iterate()
    lo, hi = server.replay, server.d
    assert hi - lo == output_layer(eng.learner.model)
    for client in eng.clients:  # one more message each: every client reaches the server's model and velocity
        held = client.sync(server.message(client.client_id))
        assert held.tobytes() == server.params.tobytes()
        assert client.state_bytes()  # the velocity is part of the saved state
        assert np.array_equal(client._velocity, server.state.momentum[lo:hi].astype(np.float32))
    sent = round(eng.cfg.compression.replay_share(2, 8) * (hi - lo))  # 2 uploads of 8 clients a round: 10 %
    moved = int((server.params[lo:hi] != before[lo:hi]).sum())  # in the last round, far more than were sent
    assert sent == 17 and moved > 3 * sent, moved
    resent = decode(server.resync_message())
    assert isinstance(resent, ReplayChain) and resent.base is not None
    plain = HFLEngine(load_config(None, sets[:-2], HFLConfig))
    plain.start()
    assert plain.server.replay is None
    assert isinstance(decode(plain.server.resync_message()), DensePayload)
