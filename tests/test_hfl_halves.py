"""The HFL halves: bytes in, bytes out, driven by a runtime that is not the simulator; state as bytes."""

from __future__ import annotations

import hashlib
import math
import subprocess
import sys

import numpy as np
import pytest

from sluice.config import load_config
from sluice.errors import DataError, WireError
from sluice.hfl import Client, HFLEngine, Server
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.tasks import client_datasets, load_task
from sluice.wire.state import pack, unpack

BASE = ["data.num_clients=6", "model.hidden=[16]", "train.local_epochs=1"]
CONFIGS = {
    "per-client randk": [],
    "anchor topk zstd momentum": ["compression.downlink=anchor", "compression.anchor_every=3",
                                  "compression.up=topk", "compression.lossless=zstd", "compression.momentum=0.9"],
    "per-client momentum replayed": ["compression.momentum=0.9", "compression.momentum_replay=0.4"],
    "initial sketch": ["compression.downlink=initial", "compression.up=sketch"],
}


class Runtime:
    """A runtime of its own (not the simulator): a fixed schedule, only the halves' public methods."""

    def __init__(self, cfg: HFLConfig) -> None:
        self.cfg = cfg
        task = load_task(cfg.task, seed=cfg.seed, data=cfg.data, hidden=cfg.model.hidden)
        self.learner = Learner(task, cfg.seed)
        self.data = client_datasets(task, cfg.data, seed=cfg.seed)
        self.server = Server(cfg, self.learner.theta0, len(self.data), output_layer=self.learner.output_layer)
        self.clients = [Client(cfg, c, self.learner) for c in range(len(self.data))]

    def round(self) -> dict:
        t = self.server.round + 1
        n = len(self.clients)
        sampled = sorted({(t * 5 + j * 2) % n for j in range(3)})
        ups, downs, losses = [], [], []
        for c in sampled:
            msg = self.server.message(c)
            downs.append(len(msg))
            if (t + c) % 4 == 0:  # fails after its download
                self.clients[c].sync(msg)
                continue
            up = self.clients[c].train(msg, self.data[c], t)
            ups.append(len(up))
            losses.append(self.clients[c].train_loss)
            self.server.receive(c, up, float(len(self.data[c])))
        broadcast = self.server.close_round()
        if broadcast is not None:
            for client in self.clients:
                client.receive_anchor(broadcast)
            downs.append(len(broadcast))
        return {"round": t, "up": ups, "down": downs, "loss": losses,
                "params": hashlib.sha256(self.server.params.tobytes()).hexdigest()}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_halves_resume_from_state_bytes_exactly(name: str) -> None:
    cfg = load_config(None, BASE + CONFIGS[name], HFLConfig)
    straight = Runtime(cfg)
    want = [straight.round() for _ in range(8)]
    first = Runtime(cfg)
    got = [first.round() for _ in range(4)]
    server_bytes = first.server.state_bytes()
    client_bytes = [c.state_bytes() for c in first.clients]
    del first.server, first.clients
    second = Runtime(cfg)  # fresh objects, then the saved states
    second.server = Server.from_state_bytes(cfg, server_bytes)
    second.clients = [Client.from_state_bytes(cfg, b, second.learner) for b in client_bytes]
    got += [second.round() for _ in range(4)]
    assert got == want
    assert len({r["params"] for r in want}) > 4  # the model moved: the comparison means something
    for client in second.clients:  # restored clients are the same clients
        assert client.state_bytes() == straight.clients[client.client_id].state_bytes()


def test_server_state_keeps_the_uploads_of_an_open_round() -> None:
    cfg = load_config(None, BASE, HFLConfig)
    rt = Runtime(cfg)
    rt.round()
    rt.server.receive(1, rt.clients[1].train(rt.server.message(1), rt.data[1], 2), float(len(rt.data[1])))
    copy = Server.from_state_bytes(cfg, rt.server.state_bytes())
    assert copy.received == 1
    rt.server.close_round()
    copy.close_round()
    assert copy.params.tobytes() == rt.server.params.tobytes()
    assert copy.state_bytes() == rt.server.state_bytes()


def test_simulator_checkpoint_restore_continues_exactly() -> None:
    cfg = load_config(None, [*BASE, "train.dropout=0.3", "train.participation=0.5"], HFLConfig)
    straight = HFLEngine(cfg)
    straight.set_trainable_layers(1)
    want = [straight.iterate() for _ in range(8)]
    first = HFLEngine(cfg)
    first.set_trainable_layers(1)
    got = [first.iterate() for _ in range(4)]
    blob = first.checkpoint()
    resumed = HFLEngine(cfg)
    resumed.restore(blob)
    got += [resumed.iterate() for _ in range(4)]
    key = [(e.iteration, e.metrics, e.bytes_up, e.bytes_down) for e in want]
    assert [(e.iteration, e.metrics, e.bytes_up, e.bytes_down) for e in got] == key
    assert sum(e.metrics["dropped"] for e in want) > 0  # the sampling RNG mattered
    assert resumed.params.tobytes() == straight.params.tobytes()
    assert resumed.checkpoint() == straight.checkpoint()


def test_server_refuses_bad_uploads_and_ids() -> None:
    cfg = load_config(None, BASE, HFLConfig)
    rt = Runtime(cfg)
    up = rt.clients[0].train(rt.server.message(0), rt.data[0], 1)
    with pytest.raises(DataError, match=r"client id must be an integer in \[0, 6\)"):
        rt.server.message(6)
    with pytest.raises(WireError, match="upload of client 0"):
        rt.server.receive(0, up[:-1], 1.0)
    with pytest.raises(DataError, match="finite number >= 0"):
        rt.server.receive(0, up, -1.0)
    rt.server.receive(0, up, 1.0)
    with pytest.raises(DataError, match="already uploaded"):
        rt.server.receive(0, up, 1.0)


def test_state_bytes_round_trip_and_refuse_garbage() -> None:
    tree = {"kind": "x", "a": np.arange(5, dtype=np.float16), "m": np.eye(2, dtype=np.int32),
            "t": (1, None, 2**100), "f": [math.inf, -0.0, 0.1], "nan": math.nan, "s": "ok", "b": True}
    buf = pack(tree)
    back = unpack(buf)
    assert pack(back) == buf
    assert back["a"].dtype == np.float16 and back["a"].tolist() == tree["a"].tolist()
    assert back["t"] == (1, None, 2**100) and math.isnan(back["nan"]) and str(back["f"][1]) == "-0.0"
    with pytest.raises(WireError, match="checksum"):
        unpack(buf[:-5] + bytes([buf[-5] ^ 1]) + buf[-4:])
    with pytest.raises(WireError, match="not a Sluice state"):
        unpack(b"PK\x03\x04" + buf[4:])
    cfg = load_config(None, BASE, HFLConfig)
    client = Client(cfg, 0, Runtime(cfg).learner)
    with pytest.raises(WireError, match="expected the state of server, got the state of client"):
        Server.from_state_bytes(cfg, client.state_bytes())


def test_hfl_imports_no_control_module() -> None:
    code = ("import sys, sluice.hfl, sluice.hfl.engine, sluice.hfl.server, sluice.hfl.client; "
            "bad = sorted(m for m in sys.modules if m.startswith('sluice.control')); "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
