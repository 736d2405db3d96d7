"""Clients of a simulated round trained together (``train.batched_clients``): the same updates, bytes and
accuracy as one by one on the CPU, and one by one (said once) where a task cannot train together."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from sluice.hfl import HFLEngine, batched
from sluice.hfl.baselines.qsgd import QSGDClient, QSGDServer
from sluice.hfl.batched import BatchedFit, Job, optimizer_rule, pays, unbatchable
from sluice.hfl.client import Client
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.hfl.server import Server
from sluice.tasks import Task, load_task

LOSS_TOL = 1e-6
"""Relative tolerance of the mean training loss: the loss's reduction under vmap may round differently in the
last bit; the updates, bytes and accuracy are compared exactly."""

OPTIMIZERS = {
    "sgd": None,
    "sgd_momentum": lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9),
    "sgd_nesterov_decay": lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.8, nesterov=True, weight_decay=1e-3),
    "adam": lambda p, lr: torch.optim.Adam(p, lr=1e-3, weight_decay=1e-4),
    "adamw": lambda p, lr: torch.optim.AdamW(p, lr=2e-3, betas=(0.8, 0.99)),
}


def _cfg(mode, compression=None, **train) -> HFLConfig:
    return HFLConfig.model_validate({"data": {"num_clients": 12}, "train": {"batched_clients": mode, **train},
                                     "compression": compression or {}})


def _engine(mode, optimizer=None, *, engine_kw=None, compression=None, **train) -> HFLEngine:
    cfg = _cfg(mode, compression, **train)
    task = load_task(cfg.task, seed=cfg.seed, data=cfg.data, hidden=cfg.model.hidden)
    task.optimizer = optimizer
    return HFLEngine(cfg, task, **(engine_kw or {}))


def _rounds(engine: HFLEngine, n: int = 3) -> list:
    return [engine.iterate() for _ in range(n)]


def _same_rounds(a: list, b: list) -> None:
    for x, y in zip(a, b, strict=True):
        assert (x.bytes_up, x.bytes_down) == (y.bytes_up, y.bytes_down), f"round {x.iteration}: bytes differ"
        assert x.metrics["test_accuracy"] == y.metrics["test_accuracy"], f"round {x.iteration}"
        assert x.metrics["test_loss"] == y.metrics["test_loss"], f"round {x.iteration}"
        assert x.metrics["train_loss"] == pytest.approx(y.metrics["train_loss"], rel=LOSS_TOL)
        assert [p.client for p in x.clients] == [p.client for p in y.clients]
        assert [p.dropped for p in x.clients] == [p.dropped for p in y.clients]


@pytest.fixture(scope="module")
def federation():
    engine = _engine(False)
    engine.start()
    return engine


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_batched_updates_are_the_one_by_one_updates(federation, name):
    learner, data = federation.learner, federation.data.clients
    sizes = [len(d) for d in data]
    assert len(set(sizes)) > 3 and any(n % 16 for n in sizes), "the clients should hold different data sizes"
    before = learner.task.optimizer
    learner.task.optimizer = OPTIMIZERS[name]
    try:
        rng = np.random.default_rng(1)
        jobs = [Job((learner.theta0 + rng.normal(0, 0.01, learner.d)).astype(np.float32), ds, 77 + c)
                for c, ds in enumerate(data)]
        ref = [learner.fit(j.params, None, j.data, epochs=2, batch_size=16, lr=0.05, seed=j.seed) for j in jobs]
        got = BatchedFit(learner).fit(jobs, epochs=2, batch_size=16, lr=0.05)
    finally:
        learner.task.optimizer = before
    assert len(got) == len(ref)
    for (d_ref, loss_ref, _), (d_got, loss_got) in zip(ref, got, strict=True):
        assert np.any(d_ref != 0)
        np.testing.assert_array_equal(d_got.numpy(), d_ref)
        assert loss_got == pytest.approx(loss_ref, rel=LOSS_TOL)


def test_trainable_layers_and_a_client_without_full_batches(federation):
    learner = federation.learner
    data = federation.data.clients
    x, y = data[0].tensors
    small = TensorDataset(x[:5], y[:5])  # one batch an epoch, smaller than the batch size
    jobs = [Job(learner.theta0, ds, 5 + c) for c, ds in enumerate([small, data[0], data[1]])]
    ref = [learner.fit(j.params, None, j.data, epochs=3, batch_size=16, lr=0.05, seed=j.seed, trainable=1)
           for j in jobs]
    got = BatchedFit(learner).fit(jobs, epochs=3, batch_size=16, lr=0.05, trainable=1)
    frozen = learner.d - learner.output_layer
    for (d_ref, _, _), (d_got, _) in zip(ref, got, strict=True):
        np.testing.assert_array_equal(d_got.numpy(), d_ref)
        assert not np.any(d_ref[:frozen]) and np.any(d_ref[frozen:])


@pytest.mark.parametrize("name", ["sgd", "sgd_momentum", "adam", "adamw"])
def test_rounds_together_give_the_same_bytes_and_accuracy(name):
    one, together = _engine(False, OPTIMIZERS[name]), _engine(True, OPTIMIZERS[name])
    _same_rounds(_rounds(one), _rounds(together))
    assert together.notes() == one.notes()


def test_dropout_weighted_budgets_and_auto():
    kw = dict(participation=0.5, dropout=0.3)
    one, auto = _engine(False, **kw), _engine("auto", **kw)
    a, b = _rounds(one, 4), _rounds(auto, 4)
    assert any(p.dropped for e in a for p in e.clients), "some client should fail"
    _same_rounds(a, b)
    assert all(p.seconds > 0 for e in b for p in e.clients if not p.dropped)


def test_auto_trains_small_rounds_one_by_one(monkeypatch):
    calls = []
    real = BatchedFit.fit
    monkeypatch.setattr(BatchedFit, "fit", lambda self, jobs, **kw: calls.append(len(jobs)) or real(self, jobs, **kw))
    _rounds(_engine("auto", participation=0.25), 2)  # 3 clients a round: fewer than auto's minimum
    assert calls == []
    _rounds(_engine(True, participation=0.25), 2)
    assert calls == [3, 3]


def test_checkpoint_restored_engine_continues_the_same(federation):
    a, b = _engine(True), _engine(False)
    _rounds(a, 2)
    b.restore(a.checkpoint())
    _same_rounds(_rounds(a, 2), _rounds(b, 2))


def test_an_optimizer_of_its_own_trains_one_by_one_said_once(caplog):
    rms = lambda p, lr: torch.optim.RMSprop(p, lr=1e-3)  # noqa: E731
    together, one = _engine(True, rms), _engine(False, rms)
    with caplog.at_level(logging.WARNING, logger="sluice.hfl.batched"):
        _same_rounds(_rounds(together), _rounds(one))
    notes = [n for n in together.notes() if "batched_clients" in n]
    assert len(notes) == 1 and "RMSprop" in notes[0]
    assert sum("batched_clients" in r.getMessage() for r in caplog.records) == 1


def test_a_client_class_of_its_own_trains_one_by_one():
    kw = {"server_cls": QSGDServer, "client_cls": QSGDClient}
    flat = {"up_by_weight": 0.0}  # the published methods' uploads are not sized by weight
    together, one = _engine(True, engine_kw=kw, compression=flat), _engine(False, engine_kw=kw, compression=flat)
    _same_rounds(_rounds(together, 2), _rounds(one, 2))
    assert any("QSGDClient" in n for n in together.notes())


def test_a_loss_vmap_cannot_batch_falls_back_in_the_round():
    def loss(out, y):
        if float(out.detach().sum()) != float(out.detach().sum()):  # reads a value: no vmap
            raise ValueError("not finite")
        return torch.nn.functional.cross_entropy(out, y)

    together, one = _engine(True), _engine(False)
    together.task.loss = one.task.loss = loss
    _same_rounds(_rounds(together), _rounds(one))
    notes = [n for n in together.notes() if "batched_clients" in n]
    assert len(notes) == 1 and "does not run batched" in notes[0]


def test_unsupported_optimizer_options_have_no_rule(federation):
    learner = federation.learner
    before = learner.task.optimizer
    try:
        for opt, word in ((lambda p, lr: torch.optim.Adam(p, lr=lr, amsgrad=True), "amsgrad"),
                          (lambda p, lr: torch.optim.SGD(p, lr=lr, maximize=True), "maximize")):
            learner.task.optimizer = opt
            assert word in optimizer_rule(learner, 0.05)
        learner.task.optimizer = None
        assert optimizer_rule(learner, 0.05).kind == "sgd"
    finally:
        learner.task.optimizer = before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_together_on_the_gpu_within_tolerance():
    one, together = _engine(False, device="cuda"), _engine(True, device="cuda")
    a, b = _rounds(one, 3), _rounds(together, 3)
    for x, y in zip(a, b, strict=True):
        assert abs(x.metrics["test_accuracy"] - y.metrics["test_accuracy"]) <= 0.05
        assert x.metrics["train_loss"] == pytest.approx(y.metrics["train_loss"], rel=1e-2)


def test_chunks_of_clients_give_the_same_updates(federation, monkeypatch):
    learner, data = federation.learner, federation.data.clients[:4]
    jobs = [Job(learner.theta0, ds, 3 + c) for c, ds in enumerate(data)]
    whole = BatchedFit(learner).fit(jobs, epochs=1, batch_size=16, lr=0.05)
    monkeypatch.setattr(batched, "CHUNK_BYTES", 1)  # one client a chunk
    chunked = BatchedFit(learner).fit(jobs, epochs=1, batch_size=16, lr=0.05)
    assert len(chunked.chunks) == 4 and len(whole.chunks) == 1
    for (a, la), (b, lb) in zip(whole, chunked, strict=True):
        assert torch.equal(a, b) and la == pytest.approx(lb, rel=LOSS_TOL)


def test_a_model_with_batchnorm_trains_one_by_one():
    cfg = HFLConfig.model_validate({"task": {"name": "digits_cnn"}})
    learner = Learner(load_task(cfg.task, seed=0, data=cfg.data), 0)
    assert "BatchNorm" in unbatchable(learner, 0.05)
    mlp = _cfg(True)
    assert unbatchable(Learner(load_task(mlp.task, seed=0, data=mlp.data), 0), 0.05) is None


def test_auto_leaves_convolutions_on_the_cpu_one_by_one(federation):
    data = TensorDataset(torch.randn(4, 1, 8), torch.tensor([0, 1, 0, 1]))
    conv = Task(model=lambda: nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(12, 2)), train=data,
                test=data, name="conv")
    assert not pays(Learner(conv, 0), 100)
    assert pays(federation.learner, batched.AUTO_MIN_CLIENTS)
    assert not pays(federation.learner, batched.AUTO_MIN_CLIENTS - 1)


@pytest.mark.parametrize("downlink", ["per-client", "anchor"])
def test_every_message_and_upload_is_the_one_by_ones(monkeypatch, downlink):
    """Byte for byte: each downlink message (encoded once per base round when trained together) and each upload,
    in order, with clients of different base rounds (participation 0.6) and weighted upload budgets."""
    seen: dict[bool, list] = {False: [], True: []}
    now = {"mode": False}
    sync, receive = Client.sync, Server.receive
    monkeypatch.setattr(Client, "sync", lambda self, msg: seen[now["mode"]].append(("down", self.client_id, msg))
                        or sync(self, msg))
    monkeypatch.setattr(Server, "receive", lambda self, c, up, w: seen[now["mode"]].append(("up", c, up))
                        or receive(self, c, up, w))
    engines = {}
    for mode in (False, True):
        now["mode"] = mode
        engines[mode] = _engine(mode, participation=0.6, compression={"downlink": downlink, "anchor_every": 2})
        _rounds(engines[mode], 6)
    assert sum(kind == "up" for kind, _, _ in seen[True]) == 6 * 7
    if downlink == "per-client":  # clients of different base rounds in a round: different messages
        assert len({msg for kind, _, msg in seen[True] if kind == "down"}) > 6
    for kind in ("down", "up"):  # one by one interleaves them; together, all messages first
        assert [x for x in seen[True] if x[0] == kind] == [x for x in seen[False] if x[0] == kind], kind
    for a, b in zip(engines[False].clients, engines[True].clients, strict=True):
        np.testing.assert_array_equal(a.params, b.params)
