"""HFL engine capabilities behind requirements and the data loop: samples, layers, minimum data, checks."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.config import load_config
from sluice.data import FederatedData
from sluice.errors import ConfigError, DataError
from sluice.hfl import HFLEngine
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.local.trainer import LocalTrainer
from sluice.models import mlp
from sluice.tasks.builtin import from_federated


def arrays(ds) -> tuple[np.ndarray, np.ndarray]:
    """A dataset of tensors as numpy arrays."""
    return tuple(t.numpy() for t in ds.tensors)


def _engine(*over: str) -> HFLEngine:
    cfg = load_config(None, ["data.num_clients=6", "model.hidden=[16]", "train.local_epochs=1", *over], HFLConfig)
    eng = HFLEngine(cfg)
    eng.start()
    return eng


def test_limit_samples_keeps_exactly_n_in_every_clients_share() -> None:
    eng = _engine()
    full = [tuple(a.copy() for a in arrays(ds)) for ds in eng.data.clients]
    sizes = np.array([len(y) for _, y in full])
    total = int(sizes.sum())
    n = total // 3 + 1
    eng.limit_samples(n)
    kept = np.array(eng.data.sizes)
    assert eng.num_samples == kept.sum() == n
    assert np.all(np.abs(kept - n * sizes / total) < 1)  # each client keeps its share, rounded
    for (X, y), (X0, y0), k in zip(map(arrays, eng.data.clients), full, kept, strict=True):  # its first samples
        assert np.array_equal(X, X0[:k]) and np.array_equal(y, y0[:k])
    X, y = full[0]
    eng.add_data((2, X[:7], y[:7]))  # data added later is used in full
    assert eng.num_samples == n + 7
    eng.limit_samples(10 * total)  # a limit above what is held changes nothing
    assert eng.num_samples == n + 7
    with pytest.raises(ConfigError, match="sample limit"):
        eng.limit_samples(0)
    eng.iterate()


def test_local_train_freezes_all_but_the_last_layers() -> None:
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 5)).astype(np.float32), rng.integers(0, 3, 40)
    fed = FederatedData("random", [(X, y)], X, y, 5, 3)
    learner = Learner(from_federated(fed, lambda: mlp(5, [16, 8], 3)), seed=0)
    data = learner.check([fed_ds := learner.task.train[0]])[0]
    assert data is fed_ds
    theta = learner.theta0
    first = 5 * 16 + 16 + 16 * 8 + 8  # the first two linear layers' coordinates
    delta, _, _ = learner.fit(theta, None, data, epochs=2, batch_size=8, lr=0.1, seed=1, trainable=1)
    assert np.all(delta[:first] == 0) and np.count_nonzero(delta[first:]) > 0
    delta, _, _ = learner.fit(theta, None, data, epochs=2, batch_size=8, lr=0.1, seed=1, trainable=None)
    assert np.count_nonzero(delta[:first]) > 0


def test_trainable_layers_leave_earlier_layers_of_the_server_model_untouched() -> None:
    eng = _engine("model.hidden=[16, 8]", "compression.down_ratio=0.05")
    assert eng.num_layers == 3
    with pytest.raises(ConfigError, match=r"layers to train must be in 1\.\.3"):
        eng.set_trainable_layers(4)
    eng.set_trainable_layers(1)
    for _ in range(4):
        eng.iterate()
    first = 64 * 16 + 16 + 16 * 8 + 8
    assert eng.params[:first].tobytes() == eng.theta0[:first].tobytes()
    assert np.count_nonzero(eng.params[first:] != eng.theta0[first:]) > 0


def test_too_few_samples_report_inadequate_data_until_data_arrives() -> None:
    eng = _engine()
    have = eng.num_samples
    eng.set_min_samples(have + 50)
    before = eng.params.copy()
    ev = eng.iterate()
    assert ev.anomaly == "INADEQUATE_TRAINING_DATA" and ev.iteration == 0 and not ev.metrics
    assert f"{have} training samples" in ev.detail and f"at least {have + 50}" in ev.detail
    assert eng.params.tobytes() == before.tobytes()
    X, y = (a[:50] for a in arrays(eng.data.task.test))
    eng.add_data([(0, X[:25], y[:25]), (3, X[25:], y[25:])])
    ev = eng.iterate()
    assert ev.anomaly is None and ev.iteration == 1 and "test_accuracy" in ev.metrics
    with pytest.raises(ConfigError):
        eng.set_min_samples(-1)


def test_local_trainer_min_samples() -> None:
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 4)).astype(np.float32), rng.integers(0, 2, 20)
    trainer = LocalTrainer.from_arrays(X, y, X, y, num_classes=2, hidden=(4,))
    trainer.set_min_samples(21)
    assert trainer.iterate().anomaly == "INADEQUATE_TRAINING_DATA"
    trainer.set_min_samples(20)
    assert trainer.iterate().anomaly is None


@pytest.mark.parametrize(("bad", "message"), [
    (lambda X, y: (6, X, y), r"client must be an integer in \[0, 6\)"),
    (lambda X, y: (-1, X, y), r"client must be"),
    (lambda X, y: (0, X[:, :-1], y), r"shape \(samples, 64\)"),
    (lambda X, y: (0, X, y + 10), r"labels must be integers in \[0, 10\)"),
    (lambda X, y: (0, X, y.astype(float) + 0.5), r"labels must be integers"),
    (lambda X, y: (0, X, np.where(np.arange(len(y)) == 1, np.nan, y)), "y holds non-finite"),
    (lambda X, y: (0, np.where(X == X[0, 0], np.inf, X), y), "X holds non-finite"),
    (lambda X, y: (0, X, y[:-1]), "X has 4 rows but y has 3 labels"),
    (lambda X, y: (0, X, y.reshape(2, 2)), "y must be 1-D"),
    (lambda X, y: [(0, X, y), (0, X)], r"\(client, X, y\) triple"),
])
def test_check_data_refuses_wrong_data_and_add_data_adds_nothing(bad, message: str) -> None:
    eng = _engine()
    X, y = (a[:4] for a in arrays(eng.data.task.test))
    sizes = eng.data.sizes
    with pytest.raises(DataError, match=message):
        eng.check_data(bad(X, y))
    with pytest.raises(DataError, match=message):
        eng.add_data(bad(X, y))
    assert eng.data.sizes == sizes
    eng.add_data((0, X[0], y[:1]))  # one sample as a 1-D row is fine
    assert eng.data.sizes[0] == sizes[0] + 1


def test_engine_does_not_stop_or_change_at_train_rounds() -> None:
    eng = _engine("train.rounds=2")
    assert eng.default_iterations == 2
    events = [eng.iterate() for _ in range(4)]
    assert [e.iteration for e in events] == [1, 2, 3, 4]
    assert all(set(e.metrics) == set(events[0].metrics) for e in events)
