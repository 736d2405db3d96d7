"""Horizontal FL: server step invariants, exact downlink reconstruction, engine behaviour."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.compress.stages import topk
from sluice.config import load_config
from sluice.errors import ConfigError
from sluice.hfl import HFLEngine
from sluice.hfl.config import HFLConfig
from sluice.hfl.downlink import Downlink, apply_message
from sluice.hfl.server import Server, aggregate, init_server, server_step
from sluice.wire.vector import DensePayload, decode, encode, float_values, payload_kind

_NUMPY = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8, "sign": np.int8}
"""The numpy type of each value type's payload values (signs are int8 +-1)."""


def _small(**over: object):
    sets = [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in over.items()]
    sets = [s.replace("'", '"') for s in sets]
    base = ["train.rounds=6", "data.num_clients=8", "model.hidden=[16]", "train.local_epochs=1"]
    return load_config(None, base + sets, HFLConfig)


@pytest.mark.parametrize("rho", [0.0, 0.9])
@pytest.mark.parametrize("values", ["fp32", "fp16", "int8", "sign"])
def test_error_feedback_invariant(rho: float, values: str) -> None:
    """Σ (applied − carried velocity) + residual = Σ aggregated, coordinate-wise: the residual holds the
    aggregate's mass that was not applied yet (never momentum), so nothing is lost or invented."""
    rng = np.random.default_rng(0)
    d = 500
    state = init_server(np.zeros(d, dtype=np.float32))
    total_in, carried = np.zeros(d), np.zeros(d)
    for _ in range(40):
        g = rng.normal(size=d)
        before = state.params.astype(np.float64).copy()
        velocity = rho * state.momentum
        state, idx, step = server_step(state, g, ratio=0.02, rho=rho, lr=1.0, values=values)
        assert step.values.dtype == _NUMPY[values] and (step.vscale is not None) == (values in ("int8", "sign"))
        assert np.array_equal(step.indices, idx)
        applied = state.params.astype(np.float64) - before
        assert np.count_nonzero(applied) <= 10
        assert set(np.flatnonzero(applied)) <= set(idx.tolist())
        carried[idx] += velocity[idx]
        total_in += g
    # params started at 0 and lr = 1: Σ applied = params (float32 sums, checked to float32 precision)
    np.testing.assert_allclose(state.params.astype(np.float64) - carried + state.residual, total_in, atol=1e-4)
    assert rho == 0 or np.abs(carried).max() > 0


def test_error_feedback_is_exact_per_step() -> None:
    rng = np.random.default_rng(1)
    d = 300
    state = init_server(np.zeros(d, dtype=np.float32))
    g = rng.normal(size=d)
    new, idx, step = server_step(state, g, ratio=0.05, rho=0.0, values="fp16")
    applied = np.zeros(d)
    applied[idx] = new.params[idx].astype(np.float64)
    np.testing.assert_array_equal(applied[idx], step.values.astype(np.float64))
    np.testing.assert_array_equal(applied + new.residual, g)  # exact: residual absorbs fp16 rounding
    assert np.abs(new.residual[idx]).max() > 0
    assert len(idx) == 15
    # the applied coordinates are the 15 largest |g|
    assert set(idx.tolist()) == set(np.argsort(-np.abs(g))[:15].tolist())
    with pytest.raises(ConfigError, match="fp32, fp16, int8, sign"):
        server_step(state, g, ratio=0.05, values="bf16")  # type: ignore[arg-type]



def test_sign_steps_keep_their_rounding_in_the_server_residual() -> None:
    """A sign step moves the model by s·sign(a) at the top-k of a (s = mean |a| there); the residual keeps
    a − s·sign(a) there and a elsewhere, exactly."""
    rng = np.random.default_rng(5)
    d = 400
    state = init_server(np.zeros(d, dtype=np.float32))
    state.residual = rng.normal(size=d)
    g = rng.normal(size=d)
    acc = g + state.residual
    new, idx, step = server_step(state, g, ratio=0.05, values="sign")
    assert set(np.unique(step.values).tolist()) <= {-1, 1} and encode(step)[3] & 3 == 2
    assert step.vscale == float(np.float32(np.abs(acc[idx]).mean()))
    moved = np.float32(step.vscale) * np.sign(acc[idx]).astype(np.float32)
    np.testing.assert_array_equal(new.params[idx], moved)
    expected = acc.copy()
    expected[idx] -= moved.astype(np.float64)
    np.testing.assert_array_equal(new.residual, expected)


def test_aggregate_weighted_average() -> None:
    a, b = np.array([1.0, 0.0]), np.array([0.0, 2.0])
    np.testing.assert_allclose(aggregate([a, b], [1.0, 3.0], 2), [0.25, 1.5])
    np.testing.assert_array_equal(aggregate([], [], 3), np.zeros(3))


def test_dense_ratio_is_fedavg() -> None:
    g = np.linspace(-1, 1, 50)
    state, idx, _ = server_step(init_server(np.ones(50, dtype=np.float32)), g, ratio=1.0)
    np.testing.assert_allclose(state.params, 1 + g.astype(np.float32), rtol=0, atol=1e-7)
    assert np.all(state.residual == g - g.astype(np.float32).astype(np.float64))


@pytest.mark.parametrize(
    ("down", "down_values", "expected"),
    [("topk", "auto", "sign"), ("dense", "auto", np.float32), ("topk", "fp32", np.float32),
     ("dense", "fp16", np.float16), ("topk", "fp16", np.float16), ("topk", "sign", "sign"),
     ("topk", "int8", np.int8)],
)
def test_server_steps_take_the_downlink_value_type(down: str, down_values: str, expected: type | str) -> None:
    """``down_values = "auto"`` is signs (one bit a value, with a per-step scale) with a top-k downlink, fp32
    with a dense one."""
    cfg = _small(**{"compression.down": down, "compression.down_values": down_values,
                    "compression.down_ratio": 0.02})
    d = 200
    server = Server(cfg, np.zeros(d, dtype=np.float32), num_clients=1)
    server.message(0)
    g = np.random.default_rng(3).normal(size=d).astype(np.float32)
    server.receive(0, encode(DensePayload(g)), weight=1.0)
    server.close_round()
    (_, step, _), = server.downlink.log
    idx = step.indices
    signs = expected == "sign"
    assert step.values.dtype == (np.int8 if signs else expected) and len(idx) == (d if down == "dense" else 4)
    assert signs == (step.vscale is not None and bool(np.all(np.abs(step.values) == 1)))
    np.testing.assert_array_equal(server.params[idx], float_values(step))


@pytest.mark.parametrize("mode", ["per-client", "anchor", "initial", "dense"])
@pytest.mark.parametrize("values", ["fp16", "fp32", "int8", "sign"])
def test_stale_client_reconstructs_bit_exactly(mode: str, values: str) -> None:
    """A client that skipped s rounds rebuilds the server model bit for bit from one message."""
    rng = np.random.default_rng(2)
    d = 2000
    state = init_server(rng.normal(size=d).astype(np.float32))
    theta0 = state.params.copy()
    reference = theta0  # what clients patch in the initial and anchor modes
    down = Downlink(d, mode, anchor_every=4, num_clients=3)
    kinds = set()
    held = {t: theta0.copy() for t in range(3)}
    schedule = {1: [0, 1, 2], 2: [0], 3: [0], 5: [1], 9: [0, 2], 10: [1], 17: [2], 18: [0, 1, 2]}
    sizes = []
    for rnd in range(1, 19):
        for t in schedule.get(rnd, []):
            msg = down.message(t, state.params)
            base = reference if mode in ("initial", "anchor") else held[t]
            held[t] = apply_message(base, msg)
            assert np.array_equal(held[t], state.params), f"client {t} at round {rnd}"
            assert held[t].tobytes() == state.params.tobytes()
            sizes.append(len(msg))
            kinds.add(payload_kind(decode(msg)))
        state, idx, step = server_step(state, rng.normal(size=d), ratio=0.01, values=values)
        down.record(step)
        broadcast = down.anchor_broadcast(state.params)
        assert (broadcast is not None) == (mode == "anchor" and rnd % 4 == 0)
        if broadcast is not None:  # every client patches its copy of the previous anchor
            reference = apply_message(reference, broadcast)
            assert reference.tobytes() == state.params.tobytes()
            sizes.append(len(broadcast))
    dense_len = max(sizes)
    if mode != "dense":
        assert min(sizes) < dense_len / 5  # sparse patches are much smaller than the dense model
    if mode in ("per-client", "anchor") and values != "fp32":
        assert "chain" in kinds  # compact steps make the patch chain the smallest message at least once
    if mode == "dense":
        assert kinds == {"dense"}


def test_downlink_log_is_pruned_once_every_client_synced() -> None:
    d = 1000
    rng = np.random.default_rng(4)
    state = init_server(np.zeros(d, dtype=np.float32))
    down = Downlink(d, "per-client", num_clients=2)
    for _ in range(5):
        state, idx, step = server_step(state, rng.normal(size=d), ratio=0.01, values="fp16")
        down.record(step)
    assert len(down.log) == 5  # nobody synced yet: everything is needed
    down.message(0, state.params)
    down.message(1, state.params)
    state, idx, step = server_step(state, rng.normal(size=d), ratio=0.01, values="fp16")
    down.record(step)
    assert [r for r, *_ in down.log] == [6]


def test_per_client_message_grows_with_staleness() -> None:
    d = 5000
    rng = np.random.default_rng(3)
    state = init_server(np.zeros(d, dtype=np.float32))
    down = Downlink(d, "per-client")
    down.message(0, state.params)
    down.message(1, state.params)
    lengths = {}
    for rnd in range(1, 11):
        state, idx, step = server_step(state, rng.normal(size=d), ratio=0.005)
        down.record(step)
        if rnd == 1:
            lengths["fresh"] = len(down.message(0, state.params))
    lengths["stale"] = len(down.message(1, state.params))
    assert lengths["stale"] > 3 * lengths["fresh"]


def test_engine_runs_counts_bytes_and_is_deterministic() -> None:
    cfg = _small()
    runs = []
    for _ in range(2):
        eng = HFLEngine(cfg)
        events = [eng.iterate() for _ in range(cfg.train.rounds)]
        runs.append(events)
    a, b = runs
    assert [e.bytes_up for e in a] == [e.bytes_up for e in b]
    assert [e.metrics["test_accuracy"] for e in a] == [e.metrics["test_accuracy"] for e in b]
    assert all(e.bytes_up > 0 and e.bytes_down > 0 for e in a)
    assert [e.iteration for e in a] == list(range(1, 7))


def test_clients_hold_the_server_model_after_their_downlink() -> None:
    eng = HFLEngine(_small(**{"compression.downlink": "per-client", "train.rounds": 8}))
    eng.start()
    served: list[int] = []
    message = eng.server.message

    def recorded(client_id: int) -> bytes:
        served.append(client_id)
        return message(client_id)

    eng.server.message = recorded
    for _ in range(8):
        before = eng.params.copy()
        served.clear()
        eng.iterate()
        assert served
        for c in served:
            assert eng.clients[c].params.tobytes() == before.tobytes()


def test_dropout_skips_failed_clients_and_round_completes() -> None:
    eng = HFLEngine(_small(**{"train.dropout": 0.6, "train.rounds": 10}))
    events = [eng.iterate() for _ in range(10)]
    dropped = sum(e.metrics["dropped"] for e in events)
    assert dropped > 0
    assert all(e.metrics["participants"] + e.metrics["dropped"] == 2 for e in events)
    assert all("test_accuracy" in e.metrics for e in events)


def test_dense_baseline_is_much_bigger_than_compressed() -> None:
    dense = HFLEngine(_small(**{"compression.up": "dense", "compression.down": "dense"}))
    comp = HFLEngine(_small())
    db = sum(e.bytes_up + e.bytes_down for e in (dense.iterate() for _ in range(6)))
    cb = sum(e.bytes_up + e.bytes_down for e in (comp.iterate() for _ in range(6)))
    assert db > 10 * cb


def test_add_data_grows_a_client() -> None:
    eng = HFLEngine(_small())
    eng.start()
    n0 = len(eng.data.clients[0])
    X, y = (t[:5].numpy() for t in eng.data.task.test.tensors)
    eng.add_data((0, X, y))
    assert len(eng.data.clients[0]) == n0 + 5
    assert eng.data.clients[0].tensors[0][-5:].numpy().tobytes() == X.tobytes()


def test_bad_config_names_field_and_allowed_values() -> None:
    from sluice.errors import ConfigError

    with pytest.raises(ConfigError, match=r"compression\.downlink: must be one of .*per-client"):
        load_config(None, ["compression.downlink=sideways"], HFLConfig)
    with pytest.raises(ConfigError, match=r"train\.participation"):
        load_config(None, ["train.participation=0"], HFLConfig)
    with pytest.raises(ConfigError, match=r"data\.colour: unknown key"):
        load_config(None, ["data.colour=1"], HFLConfig)


@pytest.mark.parametrize("up", ["randk", "topk", "sketch", "dense"])
@pytest.mark.parametrize("lossless", ["none", "zstd"])
def test_every_uplink_trains_and_learns(up: str, lossless: str) -> None:
    eng = HFLEngine(_small(**{"compression.up": up, "compression.lossless": lossless, "train.rounds": 12,
                              "compression.down_ratio": 0.2, "compression.up_ratio": 0.25, "data.num_clients": 4,
                              "train.participation": 1.0}))
    events = [eng.iterate() for _ in range(12)]
    assert events[-1].metrics["test_accuracy"] > 0.3  # chance is 0.1 on digits
    assert all(e.bytes_up > 0 for e in events)


def test_requirements_refuse_or_wait_for_too_little_data_and_refuse_too_slow_rounds() -> None:
    from sluice.control import Cause, Requirements, Termination, train

    cfg = _small()
    report = train(HFLEngine(cfg), Termination(iterations=3), Requirements(min_data_amount=10**6))
    assert report.cause == Cause.INSUFFICIENT_TRAINING_SAMPLES and report.iterations == 0
    # a run that may wait for data: the engine reports INADEQUATE_TRAINING_DATA; no data comes, the run ends so
    report = train(HFLEngine(cfg), Termination(iterations=3, data_wait_s=0.1), Requirements(min_data_amount=10**6))
    assert report.cause == Cause.INADEQUATE_TRAINING_DATA and report.iterations == 0
    report = train(HFLEngine(cfg), Termination(iterations=3), Requirements(max_training_time_s=1e-6))
    assert report.cause == Cause.INSUFFICIENT_COMPUTE and report.iterations == 0
    report = train(HFLEngine(cfg), Termination(iterations=3), Requirements(min_data_amount=10))
    assert report.iterations == 3


@pytest.mark.parametrize("values", ["sign", "int8", "fp32"])
def test_coordinates_with_nothing_to_move_are_left_out(values: str) -> None:
    """Fewer nonzero coordinates than k (frozen layers): the step leaves the zeros out, which a sign value
    could not carry (it would move them by the scale)."""
    g = np.zeros(1000)
    g[[4, 50, 700]] = [0.5, -0.25, 1.0]
    state, idx, step = server_step(init_server(np.zeros(1000, dtype=np.float32)), g, ratio=0.01, values=values)
    assert idx.tolist() == [4, 50, 700] and step.k == 3
    assert np.count_nonzero(state.params) == 3
    out = topk(0.01).update(g, None, np.random.default_rng(0))[0]
    assert out.indices.tolist() == [4, 50, 700]
