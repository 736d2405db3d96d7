"""Any module under HFL: convolutions with BatchNorm, embeddings with an LSTM, fp16 and bf16 parameters.

Every uplink and downlink mode keeps the clients' copy of the model exactly the server's, checkpoints resume
bit for bit, BatchNorm buffers are averaged like FedAvg (and travel dense beside the compressed step), and the
``layers`` requirement freezes whole layers of any module."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import sluice
from sluice.config import load_config
from sluice.errors import ConfigError, TaskError
from sluice.hfl import HFLEngine
from sluice.hfl.baselines import PEERS
from sluice.hfl.config import HFLConfig
from sluice.models import get_buffers, get_flat, layers, set_flat
from sluice.wire.buffers import KIND_BUFFERS
from sluice.wire.frame import check_header


class ToDtype(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.dtype)


class Recurrent(nn.Module):
    """Token ids → embedding → LSTM → last state → classes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 6)
        self.lstm = nn.LSTM(6, 8, batch_first=True)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(x))
        return self.out(h[:, -1])


def _images(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 1, 6, 6, generator=g)
    return TensorDataset(X, (X.mean((1, 2, 3)) > 0).long() + (X[:, 0, 0, 0] > 0).long())


def _tokens(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    X = torch.randint(0, 12, (n, 5), generator=g)
    return TensorDataset(X, X[:, -1] % 3)


def _vectors(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 6, generator=g)
    return TensorDataset(X, (X[:, 0] > 0).long() + (X[:, 1] > 0).long())


def _low(dtype: torch.dtype) -> nn.Module:
    return nn.Sequential(ToDtype(dtype), nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3), ToDtype(torch.float32)).to(dtype)


MODELS = {
    "conv-batchnorm": (lambda: nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                                             nn.Linear(64, 3)), _images),
    "embedding-lstm": (Recurrent, _tokens),
    "fp16": (lambda: _low(torch.float16), _vectors),
    "bf16": (lambda: _low(torch.bfloat16), _vectors),
}


def task(name: str) -> sluice.Task:
    model, data = MODELS[name]
    return sluice.Task(model=model, train=[data(24, c) for c in range(4)], test=data(32, 99), name=name)


def engine(name: str, *sets: str) -> HFLEngine:
    cfg = load_config(None, ["train.participation=0.5", "train.local_epochs=1", "train.batch_size=8",
                             "compression.up_ratio=0.1", "compression.down_ratio=0.1", *sets], HFLConfig)
    return HFLEngine(cfg, task(name))


def _clients_hold_the_server_model(eng: HFLEngine) -> None:
    for c, client in enumerate(eng.clients):
        msg = eng.server.message(c)
        assert client.sync(msg).tobytes() == eng.server.params.tobytes()
        if eng.server.buffers is not None:
            assert client.buffers.tobytes() == eng.server.buffers.tobytes()


UPLINKS = ["dense", "randk", "topk", "sample", "sketch"]
DOWNLINKS = ["dense", "initial", "per-client", "anchor"]


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("up", UPLINKS)
def test_every_uplink_trains_any_module_and_resumes_exactly(name: str, up: str) -> None:
    sets = [f"compression.up={up}"]
    straight = engine(name, *sets)
    want = [straight.iterate() for _ in range(4)]
    first = engine(name, *sets)
    got = [first.iterate() for _ in range(2)]
    resumed = engine(name, *sets)
    resumed.restore(first.checkpoint())
    got += [resumed.iterate() for _ in range(2)]
    key = [(e.metrics, e.bytes_up, e.bytes_down) for e in want]
    assert [(e.metrics, e.bytes_up, e.bytes_down) for e in got] == key
    assert resumed.params.tobytes() == straight.params.tobytes()
    assert not np.array_equal(straight.params, straight.theta0)  # the model moved
    _clients_hold_the_server_model(resumed)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("downlink", DOWNLINKS)
def test_every_downlink_mode_brings_clients_to_the_server_model(name: str, downlink: str) -> None:
    eng = engine(name, f"compression.downlink={downlink}", "compression.anchor_every=2")
    for _ in range(3):
        eng.iterate()
    if downlink in ("per-client", "dense"):
        _clients_hold_the_server_model(eng)
    else:  # the patch applies to the client's anchor: a fresh sync still lands on the server model
        for c, client in enumerate(eng.clients):
            assert client.sync(eng.server.message(c)).tobytes() == eng.server.params.tobytes()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flat_view_of_a_low_precision_model_is_exact(dtype: torch.dtype) -> None:
    model = _low(dtype)
    flat = get_flat(model)
    assert flat.dtype == np.float32
    assert torch.equal(torch.from_numpy(flat[:48]).to(dtype).reshape(8, 6), model[1].weight.detach())
    set_flat(model, flat)
    assert get_flat(model).tobytes() == flat.tobytes()
    assert all(p.dtype == dtype for p in model.parameters())


def test_batchnorm_buffers_are_averaged_by_weight_and_travel_dense() -> None:
    eng = engine("conv-batchnorm", "train.participation=1.0")
    eng.start()
    b0 = eng.server.buffers.copy()
    assert b0.shape == (8,)  # running mean and variance of 4 channels (the batch counter stays local)
    ups = {}
    receive = eng.server.receive

    def record(c: int, upload: bytes, weight: float) -> None:
        ups[c] = (upload, weight)
        receive(c, upload, weight)

    eng.server.receive = record
    eng.iterate()
    assert all(check_header(u) == KIND_BUFFERS for u, _ in ups.values())
    trained = {c: eng.clients[c]._trained_buffers for c in ups}
    w = np.array([ups[c][1] for c in sorted(ups)])
    want = (w @ np.stack([trained[c].astype(np.float64) for c in sorted(ups)]) / w.sum()).astype(np.float32)
    assert eng.server.buffers.tobytes() == want.tobytes() and not np.array_equal(want, b0)
    # the model saved and evaluated is the server's parameters with the averaged buffers
    eng.learner.load(eng.server.params, eng.server.buffers)
    assert get_buffers(eng.learner.model).tobytes() == want.tobytes()


def test_a_model_without_buffers_sends_no_buffer_frame() -> None:
    eng = engine("embedding-lstm")
    eng.start()
    assert eng.server.buffers is None and check_header(eng.server.message(0)) != KIND_BUFFERS


def test_peers_refuse_models_with_buffers() -> None:
    server_cls, client_cls, _ = PEERS["STC"]
    eng = HFLEngine(load_config(None, [], HFLConfig), task("conv-batchnorm"), server_cls=server_cls,
                    client_cls=client_cls)
    with pytest.raises(TaskError, match="buffers"):
        eng.start()


def test_layers_of_any_module_and_training_only_the_last() -> None:
    model = MODELS["conv-batchnorm"][0]()
    assert [len(g) for g in layers(model)] == [2, 2, 2]  # conv, BatchNorm, linear: weight and bias each
    assert [len(g) for g in layers(Recurrent())] == [1, 4, 2]  # embedding, LSTM (4 tensors), linear
    eng = engine("conv-batchnorm", "train.participation=1.0")
    assert eng.num_layers == 3
    with pytest.raises(ConfigError, match=r"layers to train must be in 1\.\.3"):
        eng.set_trainable_layers(4)
    eng.set_trainable_layers(1)
    for _ in range(3):
        eng.iterate()
    head = 64 * 3 + 3
    assert eng.params[:-head].tobytes() == eng.theta0[:-head].tobytes()
    assert not np.array_equal(eng.params[-head:], eng.theta0[-head:])


class Tied(nn.Module):
    """An output layer that shares the embedding's weights."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 6)
        self.mix = nn.Linear(6, 6)
        self.out = nn.Linear(6, 12, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.mix(self.embed(x).mean(1))))


def test_layers_requirement_refuses_tied_weights_it_cannot_freeze() -> None:
    tied = sluice.Task(model=Tied, train=[_tokens(24, c) for c in range(2)], test=_tokens(16, 9), name="tied")
    eng = HFLEngine(load_config(None, [], HFLConfig), tied)
    assert eng.num_layers == 3  # embedding, mix, and the output layer that shares the embedding's weights
    for last in (1, 2):  # the output layer's weights are the first layer's: it cannot train while that is frozen
        with pytest.raises(ConfigError, match="tied weights"):
            eng.set_trainable_layers(last)
    eng.set_trainable_layers(3)
    eng.iterate()
