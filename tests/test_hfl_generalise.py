"""The causes behind the compressed federation's losses on rare participation and momentum, and their fixes.

* Rare participation (100 clients, q = 0.1): a top-k client sends the mass it has and keeps the rest in a
  residual that only its next participation can deliver; over a run a client takes part a dozen times, so
  what the server receives stays biased however many clients there are. The sampled upload
  (:func:`sluice.compress.stages.sample`) is unbiased with variance far below rand-k's: its error falls as
  more clients are averaged. Its values below the cap are ±λ and travel as signs; with
  ``compression.up_sure_fp16`` the coordinates kept for sure travel apart in fp16, since rounded to ±λ they
  hold back most of a large upload's energy.
* More uploads per round: a fixed server top-k lets the server residual, and the lag of the clients'
  model behind the aggregate, grow with the uploads a round aggregates; the default budget is per upload.
* Momentum: the heavy ball lives on the applied coordinates only, never in the residual, so a selected
  coordinate moves as under FedAvgM and no momentum-amplified mass is released in bursts.
* A fixed server step: a sparse step moves a coordinate once in many rounds; the adaptive step sizes that
  move from whether the next aggregate keeps the step's sign, and converges several times closer.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sluice.compress.codecs import make_uplink
from sluice.compress.estimate import to_dense
from sluice.compress.stages import (
    cast,
    error_feedback,
    keep_probabilities,
    randk,
    sample,
    sample_signs,
    topk,
)
from sluice.config import load_config
from sluice.errors import ConfigError, WireError
from sluice.hfl.config import CompressionConfig, HFLConfig
from sluice.hfl.server import (
    GAIN_BOUNDS,
    GAIN_EVIDENCE,
    GAIN_UPLOADS,
    Server,
    adapt_gain,
    init_server,
    server_step,
)
from sluice.wire.vector import DensePayload, PatchChain, decode, encode, float_values


def _encode_dense(x: np.ndarray) -> bytes:
    return encode(DensePayload(x.astype(np.float32)))


def _heavy_tailed(rng: np.random.Generator, d: int) -> np.ndarray:
    return rng.normal(size=d) * rng.pareto(2.0, size=d)


def test_keep_probabilities_sum_to_k_cap_at_one_and_follow_magnitude() -> None:
    rng = np.random.default_rng(0)
    x = _heavy_tailed(rng, 5000)
    p = keep_probabilities(x, 100)
    assert p.sum() == pytest.approx(100, abs=1e-9) and p.max() == 1.0 and p.min() >= 0
    capped = np.flatnonzero(p == 1)
    assert 0 < len(capped) < 100
    assert np.abs(x[capped]).min() >= np.abs(x[p < 1]).max()  # the largest are the capped ones
    free = p < 1
    lam = np.abs(x[free]) / p[free]
    np.testing.assert_allclose(lam, lam[0], rtol=1e-9)  # below the cap p ∝ |x|
    sparse = np.zeros(50)
    sparse[[3, 9]] = [1.0, -2.0]
    np.testing.assert_array_equal(keep_probabilities(sparse, 5), (sparse != 0).astype(float))
    diverged = x.copy()
    diverged[[7, 11]] = [np.nan, np.inf]
    p = keep_probabilities(diverged, 100)
    assert p[7] == p[11] == 1 and p.sum() == pytest.approx(100, abs=1e-9)  # sent for sure
    assert not keep_probabilities(x, 0).any()


def test_sample_is_unbiased_with_far_less_variance_than_randk() -> None:
    rng = np.random.default_rng(1)
    d = 4000
    x = _heavy_tailed(rng, d)
    draws = 400
    est_sample = np.array([to_dense(sample(0.02).update(x, None, rng)[0]) for _ in range(draws)])
    est_randk = np.array([to_dense(randk(0.02).update(x, None, rng)[0]) for _ in range(draws)])
    var_sample = ((est_sample - x) ** 2).sum(axis=1).mean()
    var_randk = ((est_randk - x) ** 2).sum(axis=1).mean()
    assert var_sample < var_randk / 10
    # unbiased: the mean of the draws approaches x as 1/sqrt(draws)
    assert np.linalg.norm(est_sample.mean(axis=0) - x) < 3 * np.sqrt(var_sample / draws)
    # about k kept, and every value below the cap is ±λ
    out = sample(0.02).update(x, None, rng)[0]
    assert abs(out.k - 80) < 30
    mags = np.abs(out.values.astype(np.float64))
    assert np.isclose(mags, mags.min(), rtol=1e-6).sum() > out.k // 2


def test_clients_taking_part_once_reach_the_server_unbiased_only_when_sampled() -> None:
    """n clients each take part once (the residual of a top-k client is never delivered): the server's
    estimate of their mean update stalls at top-k's bias but converges with sampled uploads."""
    rng = np.random.default_rng(2)
    d = 5000
    shared = _heavy_tailed(rng, d)

    def error(stage, n: int) -> float:
        updates = shared + rng.normal(size=(n, d)) * np.abs(shared)
        est = np.mean([to_dense(stage.update(u, None, rng)[0]) for u in updates], axis=0)
        mean = updates.mean(axis=0)
        return float(np.linalg.norm(est - mean) / np.linalg.norm(mean))

    top, sampled = error(topk(0.02), 1280), error(sample(0.02), 1280)
    assert top > 0.15  # the bias does not average out
    assert sampled < top / 2
    assert error(sample(0.02), 40) > 3 * sampled  # the sample's error falls as 1/sqrt(clients averaged)


@pytest.mark.parametrize("sure_apart", [False, True])
def test_sample_upload_keeps_only_its_rounding_in_the_residual(sure_apart: bool) -> None:
    """The default upload (sample, sign values, and with ``up_sure_fp16`` the values above the cap in fp16): the
    new residual is what the rounding left out of the unbiased estimate, so what a message delivers plus that
    residual is the estimate before rounding."""
    comp = make_uplink(CompressionConfig(up_sure_fp16=sure_apart))
    assert comp.name == "sample(0.02)+sign" + ("+fp16 above the cap" if sure_apart else "") + "+ef"
    rng = np.random.default_rng(3)
    d = 3000
    stage = error_feedback(sample(0.02), sample_signs() if sure_apart else cast("sign"), biased=False)
    state = stage.init(d)
    chains = 0
    for _ in range(10):
        x = _heavy_tailed(rng, d)
        inp = x + state[0]
        draw = np.random.default_rng(7)
        picked = sample(0.02).update(inp, None, np.random.default_rng(7))[0]
        out, state = stage.update(x, state, draw)
        buf = encode(out)
        chains += isinstance(decode(buf), PatchChain)  # signs and fp16 values, where some are above the cap
        np.testing.assert_allclose(to_dense(decode(buf)) + state[0], to_dense(picked), atol=1e-9)
    assert (chains > 0) == sure_apart


def test_sample_upload_can_send_the_coordinates_kept_for_sure_beside_the_signs() -> None:
    """Below the cap a sample estimate is ±λ, which signs times λ carry exactly; with ``up_sure_fp16`` the
    coordinates kept for sure travel in fp16 as a second part of the message. Rounded to the signs' scale with
    the rest, they hold back most of the update, and the more of d an upload keeps the more of it is rounded
    away: a larger upload delivers barely more than a small one."""
    rng = np.random.default_rng(4)
    d = 4000
    x = _heavy_tailed(rng, d)
    draw = np.random.default_rng(5)
    picked = sample(0.02).update(x, None, draw)[0]
    comp = make_uplink(CompressionConfig(up_feedback=False, up_sure_fp16=True))
    msg = decode(comp.encode(x, comp.init(d), np.random.default_rng(5))[0])
    assert isinstance(msg, PatchChain) and len(msg.parts) == 2
    signs, sure = msg.parts
    p = keep_probabilities(x, 80)
    assert np.array_equal(sure.indices, np.flatnonzero(p >= 1)) and sure.values.dtype == np.float16
    np.testing.assert_allclose(sure.values, x[sure.indices], rtol=1e-3)
    assert set(np.abs(signs.values)) == {1} and signs.vscale == pytest.approx(np.abs(x[p < 1]).sum() / (80 - len(
        sure.indices)), rel=1e-6)
    np.testing.assert_array_equal(np.union1d(signs.indices, sure.indices), picked.indices)

    few = np.zeros(d)
    few[[3, 50, 900]] = [0.5, -2.0, 7.0]  # fewer non-zeros than k: all kept for sure, and all arrive exactly
    np.testing.assert_array_equal(to_dense(decode(comp.encode(few, comp.init(d), draw)[0]), d), few)
    assert decode(comp.encode(np.zeros(d), comp.init(d), draw)[0]).k == 0
    with pytest.raises(WireError, match="explicit indices"):
        sample_signs().update(randk(0.1).update(x, None, draw)[0], None, draw)

    def error(ratio: float, rounding) -> float:
        errs = []
        for seed in range(20):
            est = rounding.update(sample(ratio).update(x, None, np.random.default_rng(seed))[0], None, rng)[0]
            errs.append(np.linalg.norm(to_dense(decode(encode(est)), d) - x))
        return float(np.mean(errs) / np.linalg.norm(x))

    kept = [error(ratio, sample_signs()) for ratio in (0.02, 0.08, 0.32)]
    assert kept[0] > kept[1] > kept[2] and kept[2] < 0.2  # a larger upload delivers more of the update
    assert error(0.32, cast("sign")) > 4 * kept[2]  # every value at the signs' scale: most of it rounded away
    with pytest.raises(ConfigError, match="up_sure_fp16 needs sample uploads with sign values"):
        make_uplink(CompressionConfig(up="topk", up_sure_fp16=True))


def test_server_budget_grows_with_the_uploads_aggregated_and_shrinks_with_the_clients() -> None:
    """k = down_budget·(M/N)·d: 0.5 % of d for the default's 5 uploads of 20 clients, twice the coordinates
    for twice the uploads, and a fifth of the share for the same uploads among five times the clients (every
    step reaches all N clients, so the downlink's cost per round grows with N·k)."""
    d = 20_000
    cfg = load_config(None, ["compression.downlink=\"dense\""], HFLConfig)
    assert cfg.compression.down_ratio is None and cfg.compression.down_share(5, 20) == pytest.approx(0.005)
    for clients, uploads, share in ((20, 1, 0.001), (20, 5, 0.005), (20, 10, 0.01), (100, 10, 0.002),
                                    (100, 50, 0.01)):
        server = Server(cfg, np.zeros(d, dtype=np.float32), num_clients=clients)
        rng = np.random.default_rng(uploads)
        for c in range(uploads):
            server.receive(c, _encode_dense(rng.normal(size=d)), 1.0)
        server.close_round()
        assert np.count_nonzero(server.params) == round(share * d)
    fixed = load_config(None, ["compression.down_ratio=0.005", "compression.downlink=\"dense\""], HFLConfig)
    server = Server(fixed, np.zeros(d, dtype=np.float32), num_clients=20)
    for c in range(10):
        server.receive(c, _encode_dense(np.random.default_rng(c).normal(size=d)), 1.0)
    server.close_round()
    assert np.count_nonzero(server.params) == 100  # an explicit down_ratio is per round


def test_dense_step_with_momentum_is_fedavgm() -> None:
    rng = np.random.default_rng(4)
    d = 200
    state = init_server(np.zeros(d, dtype=np.float32))
    x, m = np.zeros(d), np.zeros(d)
    for _ in range(30):
        g = rng.normal(size=d)
        state, idx, _ = server_step(state, g, ratio=1.0, rho=0.9, lr=0.5, values="fp32")
        m = 0.9 * m + g
        x += 0.5 * m
        assert len(idx) == d
    np.testing.assert_allclose(state.params, x, rtol=1e-4, atol=1e-4)


def test_sparse_heavy_ball_accelerates_selected_coordinates_and_keeps_the_residual_free_of_momentum() -> None:
    """A coordinate with a steady gradient is selected every round and moves as under the heavy ball;
    the others carry their gradient in the residual (never momentum), and Σ (step − carried velocity) +
    residual = Σ aggregated, so nothing is lost or invented."""
    d, rho = 1000, 0.9
    rng = np.random.default_rng(5)
    state = init_server(np.zeros(d, dtype=np.float32))
    total, carried_total = np.zeros(d), np.zeros(d)
    for _ in range(40):
        g = 0.01 * rng.normal(size=d)
        g[0] = 1.0  # steady and largest: in every top-k
        carried = np.zeros(d)
        before = state.momentum.copy()
        state, idx, _ = server_step(state, g, ratio=0.005, rho=rho, lr=1.0, values="fp32")
        carried[idx] = rho * before[idx]
        assert 0 in idx and len(idx) == 5
        total += g
        carried_total += carried
    heavy_ball = sum((1 - rho ** (t + 1)) / (1 - rho) for t in range(40))  # Σ_t Σ_{j≤t} ρ^j
    assert state.params[0] == pytest.approx(heavy_ball, rel=1e-4)
    np.testing.assert_allclose(state.params - carried_total + state.residual, total, atol=1e-4)
    never = state.params == 0  # never selected: no velocity, their whole gradient in the residual
    assert never.sum() > d // 2 and not state.momentum[never].any()
    np.testing.assert_allclose(state.residual[never], total[never], atol=1e-12)


def test_the_gain_sizes_the_gradient_part_and_momentum_does_not_multiply_it_again() -> None:
    """A coordinate selected every round under a gain G: its velocity settles at FedAvgM's η·g/(1 − ρ) and
    its step at η·g·(G + ρ/(1 − ρ)), not at the gained step's η·g·G/(1 − ρ)."""
    lr, rho, gain = 0.5, 0.9, 4.0
    state = replace(init_server(np.zeros(4, dtype=np.float32)), gain=gain)
    g = np.array([1.0, 0.0, 0.0, 0.0])
    for _ in range(300):
        state, idx, step = server_step(state, g, ratio=0.25, rho=rho, lr=lr, values="fp32")
        assert idx.tolist() == [0] and state.gain == gain
    assert state.momentum[0] == pytest.approx(lr / (1 - rho), rel=1e-6)
    assert float_values(step)[0] == pytest.approx(lr * (gain + rho / (1 - rho)), rel=1e-6)


def _answer(state, rng: np.random.Generator, sign: int) -> np.ndarray:
    """An aggregate that keeps (sign 1) or turns (sign -1) the last step's signs where it went."""
    g = 0.1 * rng.normal(size=state.params.shape[0])
    g[state.last_idx] = sign * state.last_sign
    return g


def test_adaptive_gain_rises_while_aggregates_keep_the_step_sign_and_falls_when_they_turn() -> None:
    d, beta = 400, 1.0
    rng = np.random.default_rng(7)
    g = rng.normal(size=d)
    state, idx, _ = server_step(init_server(np.zeros(d, dtype=np.float32)), g, ratio=0.05, values="sign",
                                adapt=beta)
    assert state.gain == 1.0 and len(idx) == 20  # nothing to compare with yet
    assert np.array_equal(state.last_idx, idx) and np.array_equal(state.last_sign, np.sign(g[idx]))
    assert adapt_gain(state, g, beta) == pytest.approx(np.exp(beta / 2))  # every sign kept: A = 1
    raised = replace(state, gain=4.0)
    assert adapt_gain(raised, -g, beta) == pytest.approx(4.0 * np.exp(-beta / 2))  # every sign turned: A = 0
    half = g.copy()
    half[idx[::2]] *= -1
    assert adapt_gain(raised, half, beta) == 4.0  # A = 1/2
    silent = g.copy()
    silent[idx] = 0  # nothing arrived where the step went: no evidence, the gain stays
    assert adapt_gain(raised, silent, beta) == 4.0
    assert adapt_gain(raised, -g, 0.0) == 4.0  # beta = 0: the gain stays
    for sign, bound in ((1, GAIN_BOUNDS[1]), (-1, GAIN_BOUNDS[0])):
        s = raised
        for _ in range(12):
            s, _, _ = server_step(s, _answer(s, rng, sign), ratio=0.05, values="sign", adapt=beta)
        assert s.gain == pytest.approx(bound)


def test_adaptive_gain_never_falls_below_the_configured_step() -> None:
    """Turn-backs lower a raised gain down to 1 and no further: the server's step is never smaller than
    the configured one, the energy scenario's stall."""
    d, beta = 400, 1.0
    rng = np.random.default_rng(11)
    g = rng.normal(size=d)
    state, _, _ = server_step(init_server(np.zeros(d, dtype=np.float32)), g, ratio=0.05, values="sign", adapt=beta)
    assert GAIN_BOUNDS[0] == 1.0
    assert adapt_gain(state, -g, beta) == 1.0  # A = 0 at gain 1: it stays
    s = replace(state, gain=2.0)
    gains = []
    for _ in range(10):
        s, _, _ = server_step(s, _answer(s, rng, -1), ratio=0.05, values="sign", adapt=beta)
        gains.append(s.gain)
    assert gains[0] == pytest.approx(2.0 * np.exp(-beta / 2)) and min(gains) == gains[-1] == 1.0


def test_adaptive_gain_moves_only_beyond_a_fair_coins_standard_error() -> None:
    """With n heard coordinates the gain stays while |A - 1/2| <= 1/(2 sqrt n) and moves by exp(beta (A - 1/2))
    beyond it: 20 coordinates, one standard error 0.112, so 12 agreeing (A = 0.6) is noise and 13 (0.65) is not."""
    d, beta = 400, 1.0
    rng = np.random.default_rng(12)
    g = rng.normal(size=d)
    state, idx, _ = server_step(init_server(np.zeros(d, dtype=np.float32)), g, ratio=0.05, values="sign", adapt=beta)
    state = replace(state, gain=3.0)
    for agreeing, moves in ((12, False), (13, True), (8, False), (7, True)):
        answer = g.copy()
        answer[idx[agreeing:]] *= -1
        want = 3.0 * np.exp(beta * (agreeing / 20 - 0.5)) if moves else 3.0
        assert adapt_gain(state, answer, beta) == pytest.approx(want), agreeing
    few = g.copy()
    few[idx[9:]] = 0  # 9 heard, all agreeing: A = 1 is beyond 1/(2*sqrt 9)
    assert adapt_gain(state, few, beta) == pytest.approx(3.0 * np.exp(beta / 2))
    few[idx[4:9]] *= -1  # 4 of 9 agreeing: |4/9 - 1/2| is within 1/6
    assert adapt_gain(state, few, beta) == 3.0


def test_adaptive_gain_pools_rounds_that_hear_fewer_than_eight_coordinates() -> None:
    """Two heard coordinates that both keep the step's sign are what a fair coin gives every fourth round: the
    gain does not move on them but pools their counts with the next rounds' until 8 are heard, then moves once
    on the pooled share (and starts pooling afresh)."""
    d, beta = 400, 1.0
    rng = np.random.default_rng(13)
    state, _, _ = server_step(init_server(np.zeros(d, dtype=np.float32)), rng.normal(size=d), ratio=0.05,
                              values="sign", adapt=beta)
    state = replace(state, gain=3.0)
    assert GAIN_EVIDENCE == 8
    gains, pooled = [], []
    for agreeing in (2, 2, 2, 2, 1, 1):  # two heard a round; the last two rounds split 1 to 1
        g = 0.1 * rng.normal(size=d)
        g[state.last_idx] = 0.0
        g[state.last_idx[:2]] = state.last_sign[:2] * np.array([1, 1 if agreeing == 2 else -1])
        state, _, _ = server_step(state, g, ratio=0.05, values="sign", adapt=beta, uploads=5)
        gains.append(state.gain)
        pooled.append(state.evidence)
    assert gains[:3] == [3.0, 3.0, 3.0] and pooled[:3] == [(2, 2, 5), (4, 4, 10), (6, 6, 15)]
    assert gains[3] == pytest.approx(3.0 * np.exp(beta / 2)) and pooled[3] == (0, 0, 0)  # 8 of 8 agreeing
    assert gains[5] == gains[3] and pooled[5] == (2, 4, 10)


def test_adaptive_gain_waits_for_the_answers_of_four_uploads() -> None:
    """What one upload says at many coordinates is one client's answer: a round of two uploads whose aggregate
    keeps the sign of all 20 stepped coordinates does not move the gain; the next such round brings the
    answers to four and the gain moves on the 40 pooled coordinates."""
    d, beta = 400, 1.0
    rng = np.random.default_rng(14)
    state, _, _ = server_step(init_server(np.zeros(d, dtype=np.float32)), rng.normal(size=d), ratio=0.05,
                              values="sign", adapt=beta)
    assert GAIN_UPLOADS == 4 and len(state.last_idx) == 20
    state = replace(state, gain=2.0)
    assert adapt_gain(state, _answer(state, rng, 1), beta, uploads=2) == 2.0
    assert adapt_gain(state, _answer(state, rng, 1), beta, uploads=4) == pytest.approx(2.0 * np.exp(beta / 2))
    state, _, _ = server_step(state, _answer(state, rng, 1), ratio=0.05, values="sign", adapt=beta, uploads=2)
    assert state.gain == 2.0 and state.evidence == (20, 20, 2)
    state, _, _ = server_step(state, _answer(state, rng, 1), ratio=0.05, values="sign", adapt=beta, uploads=2)
    assert state.gain == pytest.approx(2.0 * np.exp(beta / 2)) and state.evidence == (0, 0, 0)


def test_adaptive_gain_scales_the_step_and_the_residual_keeps_the_aggregate_mass() -> None:
    """The gradient part of a step is lr·G·acc; the residual gives up (step − carried velocity)/(lr·G),
    so Σ (applied − carried)/(lr·G_t) + residual = Σ aggregated with the gain and the heavy ball on; the
    gain rises while the aggregates keep their direction, and the steps follow them when they turn."""
    d, rho, lr = 500, 0.9, 0.5
    rng = np.random.default_rng(8)
    state = init_server(np.zeros(d, dtype=np.float32))
    total, spent = np.zeros(d), np.zeros(d)
    gains = []
    for t in range(60):
        g = rng.normal(size=d) + (1.0 if t < 30 else -1.0)  # a steady direction, then a turn
        velocity = rho * state.momentum
        state, idx, step = server_step(state, g, ratio=0.02, rho=rho, lr=lr, values="sign", adapt=1.0)
        spent[idx] += (float_values(step).astype(np.float64) - velocity[idx]) / (lr * state.gain)
        total += g
        gains.append(state.gain)
    np.testing.assert_allclose(spent + state.residual, total, atol=1e-4)
    assert max(gains[:30]) > 2
    assert np.mean(float_values(step) < 0) > 0.9  # the steps followed the turn


@pytest.mark.parametrize("noise", [0.0, 0.01])
def test_adaptive_step_converges_closer_than_a_fixed_step(noise: float) -> None:
    """Sparse sign steps on a quadratic (each round's aggregate is a small step towards the optimum,
    plus noise): the steps fall short, the gain rises, and after 100 rounds the adaptive step is well
    closer than the fixed one; near the optimum the turn-backs bring the gain back to 1."""

    def distance(beta: float) -> tuple[float, list[float]]:
        rng = np.random.default_rng(0)
        target = rng.normal(size=2000)
        state = init_server(np.zeros(2000, dtype=np.float32))
        gains = []
        for _ in range(100):
            g = 0.02 * (target - state.params) + noise * rng.normal(size=2000)
            state, _, _ = server_step(state, g, ratio=0.01, values="sign", adapt=beta)
            gains.append(state.gain)
        return float(np.linalg.norm(state.params - target) / np.linalg.norm(target)), gains

    (fixed, _), (adaptive, gains) = distance(0.0), distance(1.0)
    assert adaptive < 0.75 * fixed, (fixed, adaptive)
    assert max(gains) > 5 and gains[-1] < 2, gains


def test_dense_server_and_saved_state_keep_the_gain() -> None:
    """compression.down = "dense" is FedAvg whatever down_adapt says (the gain stays 1); a saved server
    resumes with its gain and last step."""
    d = 300
    rng = np.random.default_rng(9)
    for down, adapts in (("dense", False), ("topk", True)):
        cfg = load_config(None, [f'compression.down="{down}"', "compression.down_ratio=0.05",
                                 'compression.downlink="dense"'], HFLConfig)
        server = Server(cfg, np.zeros(d, dtype=np.float32), num_clients=4)
        base = rng.normal(size=d)
        for _ in range(6):
            for c in range(4):
                server.receive(c, _encode_dense(base + 0.1 * rng.normal(size=d)), 1.0)
            server.close_round()
        assert (server.state.gain > 1) == adapts and (server.state.gain == 1.0) != adapts
    copy = Server.from_state_bytes(cfg, server.state_bytes())
    assert copy.state.gain == server.state.gain
    assert np.array_equal(copy.state.last_idx, server.state.last_idx)
    assert np.array_equal(copy.state.last_sign, server.state.last_sign)
    from sluice.errors import WireError
    from sluice.wire.state import pack, unpack

    server.state = replace(server.state, evidence=(5, 6, 2))  # pooled counts of rounds that heard few
    assert Server.from_state_bytes(cfg, server.state_bytes()).state.evidence == (5, 6, 2)
    tree = unpack(server.state_bytes())
    tree["last_idx"] = tree["last_idx"] + d  # coordinates the model does not have
    with pytest.raises(WireError, match="last step"):
        Server.from_state_bytes(cfg, pack(tree))
    for evidence in ([7, 6, 1], [-1, 2, 1], [1.5, 2, 1], [3, 4, -1], [3, 4]):
        tree = unpack(server.state_bytes())
        tree["evidence"] = evidence
        with pytest.raises(WireError, match="evidence"):
            Server.from_state_bytes(cfg, pack(tree))
    server.state = replace(server.state, evidence=(0, 0, 0))
    server.close_round()  # a round where nothing arrived keeps the gain and the last step
    assert server.state.gain == copy.state.gain and np.array_equal(server.state.last_idx, copy.state.last_idx)


def test_upload_budget_by_weight_keeps_the_round_budget_and_follows_the_weights() -> None:
    """k_c/d = up_ratio·((1 − a) + a·M·w_c): the round still sends M·up_ratio·d coordinates in expectation,
    the even part is shared alike, the rest follows the aggregation weights; each upload keeps at least a
    coordinate and at most all of them."""
    sizes = [10, 30, 60, 900]
    assert CompressionConfig().up_by_weight == 0.5  # the default: half of the budget by weight
    assert CompressionConfig(up_by_weight=0).up_shares(sizes) == [0.02] * 4
    for a in (0.5, 1.0):
        shares = CompressionConfig(up_by_weight=a).up_shares(sizes)
        assert sum(shares) == pytest.approx(4 * 0.02)
        for n, share in zip(sizes, shares, strict=True):
            assert share == pytest.approx(0.02 * ((1 - a) + a * 4 * n / 1000))
    assert CompressionConfig(up_by_weight=1.0).up_shares([0, 100]) == [pytest.approx(1e-9), 0.04]
    assert CompressionConfig(up_ratio=0.5, up_by_weight=1.0).up_shares([1, 99, 900]) == [
        pytest.approx(0.0015), pytest.approx(0.1485), 1.0]
    for up in ("dense", "sketch"):  # uploads without a share of the coordinates
        cfg = CompressionConfig(up=up, up_by_weight=0.5)
        assert not cfg.weighted_uploads and cfg.up_shares(sizes) == [0.02] * 4


def test_weighted_upload_budget_cuts_the_aggregate_error_by_meff_over_m() -> None:
    """Sampled uploads of clients whose weights differ: at the same total budget, k_c ∝ w_c brings the error
    of the weighted aggregate Σ w_c·x̂_c down to about M_eff/M of the even split's (here 0.30), and the half
    and half split in between."""
    d, sizes = 4000, [400, 60, 25, 10, 5]
    w = np.asarray(sizes) / sum(sizes)
    meff_over_m = 1 / (w**2).sum() / len(sizes)
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=d) for _ in sizes]
    truth = sum(wc * x for wc, x in zip(w, xs, strict=True))

    def error(a: float) -> float:
        shares = CompressionConfig(up_by_weight=a).up_shares(sizes)
        stages = [sample(share) for share in shares]
        draw = np.random.default_rng(1)
        errs = []
        for _ in range(40):
            est = sum(wc * to_dense(st.update(x, st.init(d), draw)[0])
                      for wc, x, st in zip(w, xs, stages, strict=True))
            errs.append(float(np.sum((est - truth) ** 2)))
        return float(np.mean(errs))

    even, half, full = error(0.0), error(0.5), error(1.0)
    assert full < 1.25 * meff_over_m * even
    assert full < half < even


def test_simulator_gives_each_upload_the_budget_of_its_weight() -> None:
    """With up_by_weight the engine hands each sampled client its k/d from the round's sample counts: the
    coordinates of every upload follow its share (the sample stage keeps k in expectation), the round's total
    stays that of the even split."""
    from sluice.hfl import HFLEngine

    def uploads(a: float) -> list[tuple[float, int, float]]:
        """(weight, coordinates sent, expected coordinates) of each upload of the first round."""
        got: list[tuple[float, int]] = []

        class Recording(Server):
            def receive(self, client: int, upload: bytes, weight: float) -> None:
                got.append((weight, int(np.count_nonzero(to_dense(decode(upload))))))
                super().receive(client, upload, weight)

        cfg = load_config(None, [f"compression.up_by_weight={a}", "train.local_epochs=1"], HFLConfig)
        engine = HFLEngine(cfg, server_cls=Recording)
        engine.iterate()
        shares = cfg.compression.up_shares([wt for wt, _ in got])
        return [(wt, nnz, share * engine.num_params) for (wt, nnz), share in zip(got, shares, strict=True)]

    even, weighted = uploads(0.0), uploads(0.5)
    assert [wt for wt, _, _ in even] == [wt for wt, _, _ in weighted]  # the same clients, the same weights
    assert len({round(k) for _, _, k in even}) == 1 and len({round(k) for _, _, k in weighted}) > 3
    for _, nnz, k in [*even, *weighted]:
        assert abs(nnz - k) < 0.15 * k
    assert sum(n for _, n, _ in weighted) == pytest.approx(sum(n for _, n, _ in even), rel=0.1)


def test_simulator_takes_uploads_with_fp16_above_the_cap() -> None:
    """With ``up_sure_fp16`` a client's upload is a patch chain (signs, fp16 values above the cap), and the
    server aggregates the sum of its parts."""
    from sluice.hfl import HFLEngine

    got: list[tuple[bool, np.ndarray]] = []
    before: list[np.ndarray] = []

    class Recording(Server):
        def receive(self, client: int, upload: bytes, weight: float) -> None:
            before.append(self.params.copy())
            got.append((isinstance(decode(upload), PatchChain), to_dense(decode(upload))))
            super().receive(client, upload, weight)

    cfg = load_config(None, ["compression.up_sure_fp16=true", "train.local_epochs=1",
                             "compression.downlink=\"dense\""], HFLConfig)
    engine = HFLEngine(cfg, server_cls=Recording)
    engine.iterate()
    assert any(chain for chain, _ in got)
    moved = engine.server.params != before[0]
    assert moved.any() and np.all(np.isfinite(engine.server.params))
    heard = np.flatnonzero(np.any([est != 0 for _, est in got], axis=0))
    assert set(np.flatnonzero(moved)) <= set(heard)  # the step moves only coordinates some upload sent
