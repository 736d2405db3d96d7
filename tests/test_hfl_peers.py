"""The published peers (sluice.hfl.baselines) on Sluice's engine: they learn, every byte they exchange is counted,
clients hold the server model exactly, state round-trips, STC's cache serves clients that missed rounds,
corrupted messages are refused."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np
import pytest

from sluice.compress.stages import count_sketch
from sluice.config import load_config
from sluice.errors import WireError
from sluice.hfl import HFLEngine
from sluice.hfl.baselines import PEERS, DGCClient, FetchSGDServer, STCClient, STCParams, STCServer
from sluice.hfl.baselines.fetchsgd import _sketch_seed
from sluice.hfl.baselines.qsgd import _qsgd_dequantise, _qsgd_quantise
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.tasks import client_datasets, load_task
from sluice.wire.frame import KIND_RAW, check_header
from sluice.wire.updates import unpack_updates
from sluice.wire.vector import DensePayload, SparsePayload, decode, encode

BASE = ["data.num_clients=8", "train.participation=0.5", "train.dropout=0.1", "model.hidden=[32]",
        "data.alpha=1.0", "compression.up_ratio=0.05", "compression.down_ratio=0.02"]


def config(name: str, *more: str) -> HFLConfig:
    return load_config(None, [*PEERS[name][2], *BASE, *more], HFLConfig)


def engine(name: str, *more: str) -> HFLEngine:
    server_cls, client_cls, _ = PEERS[name]
    return HFLEngine(config(name, *more), server_cls=server_cls, client_cls=client_cls)


def flip(buf: bytes, at: int) -> bytes:
    out = bytearray(buf)
    out[at] ^= 0x5A
    return bytes(out)


@pytest.mark.parametrize("name", list(PEERS))
def test_peer_learns_counts_every_byte_and_clients_hold_the_server_model(name: str) -> None:
    eng = engine(name)
    eng.start()
    server = eng.server
    seen: dict[str, list[int]] = {"up": [], "down": []}
    expected: dict[int, bytes] = {}
    mismatched: list[tuple[int, int]] = []
    message, close_round = server.message, server.close_round

    def recorded_message(client_id: int) -> bytes:
        out = message(client_id)
        check_header(out)  # every message is a Sluice frame
        seen["down"].append(len(out))
        expected[client_id] = server.params.tobytes()
        return out

    def recorded_close() -> bytes | None:
        out = close_round()
        if out is not None:
            seen["down"].append(len(eng.clients) * len(out))
        return out

    server.message, server.close_round = recorded_message, recorded_close
    for client in eng.clients:
        def recorded_sync(msg: bytes, _client: Any = client, _sync: Any = client.sync) -> np.ndarray:
            held = _sync(msg)
            if held.tobytes() != expected[_client.client_id]:
                mismatched.append((server.round + 1, _client.client_id))
            return held

        def recorded_train(*args: Any, _train: Any = client.train) -> bytes:
            out = _train(*args)
            seen["up"].append(len(out))
            return out

        client.sync, client.train = recorded_sync, recorded_train
    accuracy, synced = 0.0, 0
    for _ in range(15):
        seen["up"].clear()
        seen["down"].clear()
        ev = eng.iterate()
        assert ev.bytes_up == sum(seen["up"]) > 0
        assert ev.bytes_down == sum(seen["down"]) > 0
        synced += len(seen["down"])
        accuracy = ev.metrics["test_accuracy"]
    assert mismatched == []
    assert synced >= 15 * 4
    assert accuracy > 0.4, f"{name}: {accuracy:.3f} after 15 rounds (chance is 0.1)"


def trace(eng: HFLEngine, rounds: int) -> list[tuple]:
    out = []
    for _ in range(rounds):
        ev = eng.iterate()
        out.append((ev.iteration, ev.bytes_up, ev.bytes_down, sorted(ev.metrics.items()),
                    hashlib.sha256(eng.params.tobytes()).hexdigest()))
    return out


@pytest.mark.parametrize("name", list(PEERS))
def test_state_bytes_continue_identically(name: str) -> None:
    want = trace(engine(name), 10)
    first = engine(name)
    got = trace(first, 5)
    saved = first.checkpoint()
    second = engine(name)
    second.restore(saved)
    assert second.server is not first.server
    got += trace(second, 5)
    assert got == want

    # a server saved with uploads of an open round closes it exactly as the original does
    server_cls = PEERS[name][0]
    server, clients, data = second.server, second.clients, second.data
    for c in (0, 3):
        server.receive(c, clients[c].train(server.message(c), data.clients[c], 11), float(len(data.clients[c])))
    copy = server_cls.from_state_bytes(second.cfg, server.state_bytes())
    assert copy.received == server.received == 2
    server.close_round()
    copy.close_round()
    assert copy.round == server.round == 11
    assert copy.params.tobytes() == server.params.tobytes()
    assert copy.message(5) == server.message(5)


def halves(cfg: HFLConfig) -> tuple[Learner, list[Any]]:
    """The task's learner and its clients' datasets."""
    task = load_task(cfg.task, seed=cfg.seed, data=cfg.data, hidden=cfg.model.hidden)
    return Learner(task, cfg.seed), client_datasets(task, cfg.data, seed=cfg.seed)


def stc_halves(cfg: HFLConfig, server_cls: type = STCServer) -> tuple[Any, list[STCClient], Any]:
    learner, data = halves(cfg)
    clients = [STCClient(cfg, c, learner) for c in range(3)]
    return server_cls(cfg, learner.theta0, 3), clients, data


def test_stc_cache_sends_missed_updates_and_falls_back_when_stale() -> None:
    class ShortCache(STCServer):
        hparams = STCParams(cache_rounds=3)

    cfg = config("STC")
    server, clients, data = stc_halves(cfg, ShortCache)
    # client 0 every round; client 1 in rounds 1 and 4: it holds θ_0 and needs the server updates of
    # rounds 1..3, all cached; client 2 in rounds 1 and 6: it needs those of rounds 1..5, more than the 3
    # cached, so it gets a patch of the changed coordinates or the model
    schedule = {1: [0, 1, 2], 2: [0], 3: [0], 4: [0, 1], 5: [0], 6: [0, 2]}
    kinds = {}
    for rnd, who in schedule.items():
        for c in who:
            msg = server.message(c)
            up = clients[c].train(msg, data[c], rnd)
            assert clients[c].params.tobytes() == server.params.tobytes(), (rnd, c)
            kinds[rnd, c] = (check_header(msg), msg)
            server.receive(c, up, float(len(data[c])))
        server.close_round()
    kind, msg = kinds[4, 1]
    assert kind == KIND_RAW
    assert len(unpack_updates(msg, b"T", server.d)) == 3  # the updates of rounds 1, 2 and 3
    assert len(msg) < 4 * server.d / 10  # far below the dense model
    kind, msg = kinds[2, 0]
    assert kind == KIND_RAW and len(unpack_updates(msg, b"T", server.d)) == 1
    assert kinds[6, 2][0] != KIND_RAW  # stale past the cache: Sluice's dense or sparse-patch message
    assert server.round == 6


def test_stc_messages_are_ternary_with_error_feedback() -> None:
    cfg = config("STC")
    server, clients, data = stc_halves(cfg)
    up = clients[0].train(server.message(0), data[0], 1)
    est = server._decode_upload(up)
    nz = est[est != 0]
    k = round(0.05 * server.d)
    assert nz.size == k and np.unique(np.abs(nz)).size == 1  # k values, all ±μ
    # error feedback: the residual keeps A − STC(A); the sent coordinates are the k largest |A|
    sent = est != 0
    a = clients[0].residual + est
    assert np.abs(a[~sent]).max() <= np.abs(a[sent]).min()
    assert np.abs(nz[0]) == pytest.approx(np.abs(a[sent]).mean(), rel=1e-6)  # μ = mean kept magnitude
    # a ternary upload costs about 1 sign bit + Rice-coded gaps per value, far below fp16 values alone
    assert len(up) < 2 * k


def test_fetchsgd_recovers_heavy_hitters_from_summed_sketches() -> None:
    cfg = config("FetchSGD")
    d = 5000
    server = FetchSGDServer(cfg, np.zeros(d, dtype=np.float32), 2)
    stage = count_sketch(server.rows, server.cols, seed=_sketch_seed(cfg))
    hot = np.array([7, 1234, 4321])
    vecs = []
    for c, vals in enumerate(([1.0, -2.0, 0.5], [3.0, 2.0, -0.5])):
        v = np.zeros(d)
        v[hot] = vals
        vecs.append(v)
        payload, _ = stage.update(v, server.cols, np.random.default_rng(c))
        server.receive(c, encode(payload), [1.0, 3.0][c])
    server.close_round()
    avg = 0.25 * vecs[0] + 0.75 * vecs[1]
    np.testing.assert_allclose(server.params[hot], avg[hot], rtol=1e-6)
    assert np.count_nonzero(server.params) == 3
    # error and momentum sketches are zeroed where the applied coordinates hash
    buckets, _ = server._hash_tables()
    for j in range(server.rows):
        assert not server.error[j, buckets[j, hot]].any() and not server.momentum[j, buckets[j, hot]].any()
    # a sketch made with other hash functions is refused
    other, _ = count_sketch(server.rows, server.cols, seed=1).update(vecs[0], server.cols, np.random.default_rng(0))
    with pytest.raises(WireError, match="seed"):
        server.receive(0, encode(other), 1.0)


def test_dgc_warm_up_momentum_correction_and_factor_masking() -> None:
    cfg = config("DGC")
    learner, data = halves(cfg)
    client = DGCClient(cfg, 0, learner)
    assert [client.density(t) for t in (1, 2, 3, 4, 5, 50)] == [0.25, 0.0625, 0.05, 0.05, 0.05, 0.05]
    for rnd in (1, 2, 6):
        up = decode(client.train(encode(DensePayload(client.params)), data[0], rnd))
        assert isinstance(up, SparsePayload) and up.values.dtype == np.float32
        assert up.k == max(1, round(client.density(rnd) * client.d))
        assert not client.accumulated[up.indices].any() and not client.velocity[up.indices].any()
        assert client.velocity.any()  # what was not sent keeps its momentum


def test_qsgd_quantiser_is_unbiased_and_uses_s_levels() -> None:
    rng = np.random.default_rng(0)
    v = rng.normal(size=1000) * np.where(rng.random(1000) < 0.1, 10.0, 0.1)
    draws = []
    for _ in range(400):
        norms, q = _qsgd_quantise(v, 127, 512, rng)
        assert q.dtype == np.int8 and np.abs(q.astype(int)).max() <= 127
        draws.append(_qsgd_dequantise(norms, q, 127, 512).astype(np.float64))
    # one draw deviates by at most norm/s (variance <= (norm/s)²/4): the mean of N draws lies within five
    # standard errors, norm/(2s√N) each; rounding to the nearest level instead would miss by up to norm/2s
    norms = np.repeat(norms.astype(np.float64), 512)[:1000]
    bound = 5 * norms / (2 * 127 * np.sqrt(len(draws)))
    assert np.all(np.abs(np.mean(draws, axis=0) - v) <= bound)


@pytest.mark.parametrize("name", [n for n in PEERS if n != "FedAvg"])
def test_corrupted_or_foreign_messages_raise_wire_error(name: str) -> None:
    eng = engine(name)
    eng.iterate()
    server, clients = eng.server, eng.clients
    data = eng.data.clients[2]
    msg = server.message(2)
    for bad in (flip(msg, len(msg) // 2), flip(msg, 2), msg[:-3], b""):
        with pytest.raises(WireError):
            clients[2].sync(bad)
    up = clients[2].train(msg, data, 2)
    for bad in (flip(up, len(up) // 2), up[:-1], up + b"\x00"):
        with pytest.raises(WireError):
            server.receive(2, bad, float(len(data)))
    foreign = encode(SparsePayload(d=server.d, values=np.ones(3, np.float32), indices=np.array([1, 2, 3])))
    if name != "DGC":  # a sparse vector is a DGC upload
        with pytest.raises(WireError):
            server.receive(2, foreign, float(len(data)))
    server.receive(2, up, float(len(data)))  # the intact upload is taken
    assert server.received == 1


def test_registry_names_and_overrides() -> None:
    assert list(PEERS) == ["FedAvg", "STC", "FetchSGD", "DGC", "QSGD 8-bit"]
    for name, (server_cls, client_cls, overrides) in PEERS.items():
        assert isinstance(load_config(None, overrides, HFLConfig), HFLConfig), name
        assert server_cls.__doc__ and client_cls.__doc__
    assert config("FetchSGD").compression.momentum == 0.9  # FetchSGD's ρ
    assert config("DGC").compression.downlink == "dense"  # DGC does not compress the downlink
    assert dataclasses.is_dataclass(STCParams)
