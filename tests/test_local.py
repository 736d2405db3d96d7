"""The plain centralised trainer engine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from sluice.engine import Engine
from sluice.errors import ConfigError, DataError, TrainingError
from sluice.local import LocalTrainer
from sluice.metrics import MetricSpec, classification_metrics


def _eng(ds, **kw) -> LocalTrainer:
    kw.setdefault("hidden", (32,))
    return LocalTrainer.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test, num_classes=10, **kw)


def test_speaks_the_engine_protocol_and_learns(digits) -> None:
    eng = _eng(digits)
    assert isinstance(eng, Engine)
    events = [eng.iterate() for _ in range(8)]
    assert [e.iteration for e in events] == list(range(1, 9))
    assert events[-1].metrics["test_accuracy"] > 0.9
    assert events[-1].metrics["train_loss"] < events[0].metrics["train_loss"]
    assert set(events[0].metrics) == set(eng.metrics)
    assert all(e.bytes_up == e.bytes_down == 0 and e.seconds > 0 and e.anomaly is None for e in events)
    assert eng.num_layers == 2 and eng.num_samples == len(digits.y_train)


def test_same_seed_same_weights(digits) -> None:
    a, b, c = _eng(digits, seed=3), _eng(digits, seed=3), _eng(digits, seed=4)
    for e in (a, b, c):
        for _ in range(2):
            e.iterate()
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.array_equal(a.params, c.params)


def test_probe_leaves_the_model_unchanged(digits) -> None:
    eng = _eng(digits)
    eng.iterate()
    before = eng.params.copy()
    secs = eng.probe(2)
    assert secs > 0 and eng.iteration == 1
    np.testing.assert_array_equal(eng.params, before)
    # and training goes on exactly as without the probe
    ref = _eng(digits)
    ref.iterate()
    ref.iterate()
    eng.iterate()
    np.testing.assert_array_equal(eng.params, ref.params)


def test_trainable_layers_freeze_the_rest(digits) -> None:
    eng = _eng(digits, hidden=(32, 16))
    eng.set_trainable_layers(1)
    eng.start()
    first = [p.detach().clone() for p in eng.model[0].parameters()]
    last = [p.detach().clone() for p in eng.model[-1].parameters()]
    eng.iterate()
    for p0, p in zip(first, eng.model[0].parameters(), strict=True):
        assert torch.equal(p0, p)
    assert any(not torch.equal(p0, p) for p0, p in zip(last, eng.model[-1].parameters(), strict=True))
    with pytest.raises(ConfigError, match="1..3"):
        eng.set_trainable_layers(4)


def test_inadequate_data_then_add_data(digits) -> None:
    X, y = digits.X_train, digits.y_train
    eng = LocalTrainer.from_arrays(X[:20], y[:20], digits.X_test, digits.y_test, num_classes=10, hidden=(8,),
                       min_samples=50)
    w = eng.params.copy()
    ev = eng.iterate()
    assert ev.anomaly == "INADEQUATE_TRAINING_DATA" and "20 training samples" in ev.detail
    np.testing.assert_array_equal(eng.params, w)
    eng.add_data({"X": X[20:80], "y": y[20:80]})
    assert eng.num_samples == 80 and eng.iterate().anomaly is None
    with pytest.raises(DataError, match="features"):
        eng.add_data((np.zeros((3, 5)), np.zeros(3)))
    with pytest.raises(DataError, match="classes are 0..9"):
        eng.add_data((np.zeros((3, 64)), np.array([1, 2, 11])))


def test_limit_samples_and_suspend_and_save(digits, tmp_path: Path) -> None:
    eng = _eng(digits)
    eng.limit_samples(100)
    assert eng.num_samples == 100
    eng.suspend()
    with pytest.raises(TrainingError, match="suspended"):
        eng.iterate()
    eng.resume()
    eng.iterate()
    path = eng.save(tmp_path / "sub" / "m.pt")
    state = torch.load(path, weights_only=True)
    assert state["iteration"] == 1 and state["state_dict"]["0.weight"].shape == (32, 64)


def test_regression_with_extra_metrics() -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4)).astype(np.float32)
    Y = np.stack([X @ [1.0, -1.0, 0.5, 0.0], X[:, 0] * 2], axis=1).astype(np.float32)
    eng = LocalTrainer.from_arrays(X[:240], Y[:240], X[240:], Y[240:], kind="regression", hidden=(16,), lr=0.05,
                       metric_fns={"max_abs_error": lambda p, t: float(np.abs(p - t).max())},
                       metric_specs=[MetricSpec("max_abs_error", False, 0.0)])
    assert eng.metrics["max_abs_error"].mode == "min"
    first = eng.iterate().metrics
    for _ in range(15):
        last = eng.iterate().metrics
    assert last["test_mse"] < 0.2 * first["test_mse"]
    assert last["test_rmse"] == pytest.approx(np.sqrt(last["test_mse"]))
    assert last["max_abs_error"] >= last["test_mae"]


def test_classification_metrics_by_hand() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [2.0, 0.0]])
    y = np.array([0, 1, 1, 0])
    m = classification_metrics(logits, y, 2)
    # predictions 0,1,0,0: class 0 P=2/3 R=1; class 1 P=1 R=1/2
    assert m["test_accuracy"] == 0.75
    assert m["test_precision"] == pytest.approx((2 / 3 + 1) / 2)
    assert m["test_recall"] == pytest.approx((1 + 0.5) / 2)
    assert m["test_f1"] == pytest.approx((0.8 + 2 / 3) / 2)


def test_bad_arguments(digits) -> None:
    with pytest.raises(ConfigError, match="kind"):
        _eng(digits, kind="ranking")
    with pytest.raises(ConfigError, match="lr > 0"):
        _eng(digits, lr=0)
    with pytest.raises(DataError, match="rows"):
        LocalTrainer.from_arrays(np.zeros((5, 3)), np.zeros(4), np.zeros((2, 3)), np.zeros(2))
    with pytest.raises(DataError, match="num_classes"):
        LocalTrainer.from_arrays(np.zeros((5, 3)), np.arange(5), np.zeros((2, 3)), np.zeros(2), num_classes=3)


def test_evaluate_measures_without_training(digits) -> None:
    """The untrained model's test metrics: the reference that divergence is measured against."""
    eng = _eng(digits)
    before = eng.params.copy()
    m = eng.evaluate()
    np.testing.assert_array_equal(eng.params, before)
    assert eng.iteration == 0 and set(m) == set(eng.metrics) - {"train_loss"}
    assert abs(m["test_loss"] - np.log(10)) < 0.5  # close to chance for 10 classes
    assert eng.iterate().metrics["test_loss"] < m["test_loss"]
    ref = _eng(digits)
    ref.iterate()
    np.testing.assert_array_equal(eng.params, ref.params)  # evaluating did not change what training does
