"""Checkpoints: an engine restored from one goes on exactly as the engine it was taken from, and a training
process restored from one ends by the same rule at the same iteration with the same model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sluice.config import load_config
from sluice.control import ProcessHooks, TrainingProcess
from sluice.errors import ConfigError, WireError
from sluice.hfl import HFLEngine
from sluice.hfl.config import HFLConfig
from sluice.local.trainer import LocalTrainer


def _local(ds, **kw) -> LocalTrainer:
    args = {"hidden": (16,), "lr": 0.05, "momentum": 0.9, "batch_size": 64, "seed": 3, **kw}
    return LocalTrainer.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test, num_classes=10, **args)


def _key(events) -> list:
    return [(e.iteration, e.metrics, e.bytes_up, e.bytes_down, e.anomaly) for e in events]


def test_local_trainer_resumes_bit_for_bit(digits) -> None:
    extra = {"X": digits.X_test[:40], "y": digits.y_test[:40]}

    def run(eng: LocalTrainer, first: int, then: int, restore: bytes | None = None) -> tuple[list, LocalTrainer]:
        eng.limit_samples(600)
        eng.set_trainable_layers(2)
        if restore is not None:
            eng.restore(restore)
        out = [eng.iterate() for _ in range(first)]
        if first and restore is None:
            eng.add_data(extra)  # data added before the checkpoint travels in it
        out += [eng.iterate() for _ in range(then)]
        return out, eng

    straight, s = run(_local(digits), 3, 6)
    head, a = run(_local(digits), 3, 2)
    blob = a.checkpoint()
    assert a.opt.state_dict()["state"], "momentum buffers exist and must be saved"
    tail, b = run(_local(digits), 0, 4, restore=blob)
    assert _key(head + tail) == _key(straight)
    assert b.params.tobytes() == s.params.tobytes()
    assert b.num_samples == s.num_samples == 640
    assert b.checkpoint() == s.checkpoint()


def test_local_trainer_refuses_a_foreign_checkpoint(digits) -> None:
    other = LocalTrainer.from_arrays(digits.X_train[:, :10], digits.y_train, digits.X_test[:, :10], digits.y_test,
                         num_classes=10, hidden=(16,))
    with pytest.raises((WireError, Exception)):
        _local(digits).restore(other.checkpoint())
    with pytest.raises(WireError):
        _local(digits).restore(b"SLST garbage")


def test_hfl_resumes_bit_for_bit_with_residuals_and_added_data() -> None:
    cfg = load_config(None, ["data.num_clients=5", "model.hidden=[16]", "train.local_epochs=1",
                             "train.participation=0.6", "train.dropout=0.2", "compression.up=topk",
                             "compression.momentum=0.9", "compression.momentum_replay=0.4",
                             "compression.downlink=anchor",
                             "compression.anchor_every=3"], HFLConfig)

    def fresh() -> HFLEngine:
        return HFLEngine(cfg)

    straight = fresh()
    want = [straight.iterate() for _ in range(3)]
    X, y = (t.numpy() for t in straight.data.clients[0].tensors)
    straight.add_data((1, X[:7], y[:7]))
    want += [straight.iterate() for _ in range(5)]
    first = fresh()
    got = [first.iterate() for _ in range(3)]
    first.add_data((1, X[:7], y[:7]))
    got += [first.iterate() for _ in range(2)]
    blob = first.checkpoint()
    assert any(c.uplink_state is not None for c in first.clients), "client residuals exist and must be saved"
    resumed = fresh()
    resumed.restore(blob)
    assert resumed.server.round == 5
    got += [resumed.iterate() for _ in range(3)]
    assert _key(got) == _key(want)
    assert resumed.checkpoint() == straight.checkpoint()


def _process(ds, **kw) -> TrainingProcess:
    term = {"iterations": 60, "plateau": {"test_loss": {"patience": 4, "min_delta": 0.002}}}
    return TrainingProcess(_local(ds), term, hooks=ProcessHooks(**kw))


def test_a_restored_process_ends_as_the_uninterrupted_one(digits) -> None:
    saved: list[tuple[int, bytes, str]] = []

    def keep(p: TrainingProcess) -> None:
        saved.append((p.n, p.engine.checkpoint(), json.dumps(p.checkpoint())))

    straight = _process(digits, checkpoint_every=2, on_checkpoint=keep)
    want = straight.run()
    assert want.criterion is not None and want.criterion.rule == "plateau.test_loss"
    assert saved and all(n % 2 == 0 for n, _, _ in saved) and saved[-1][0] < want.iterations

    def streak(state: str) -> int:
        rules = json.loads(state)["monitor"]["rules"]
        return max(c["streak"] for r in rules for c in r["conditions"] if r["rule"].startswith("plateau"))

    n, engine_bytes, state = next((s for s in reversed(saved) if streak(s[2]) > 0), saved[-1])
    assert streak(state) > 0, "the resumed process must carry a plateau streak to prove its criteria state"
    again = _process(digits)
    again.engine.restore(engine_bytes)
    again.restore(json.loads(state))
    assert again.n == n
    got = again.run()
    assert (got.cause, got.status, got.iterations, got.criterion.rule) == (
        want.cause, want.status, want.iterations, want.criterion.rule)
    assert got.performance == want.performance
    assert again.engine.params.tobytes() == straight.engine.params.tobytes()
    assert [h[:2] for h in again.history] == [h[:2] for h in straight.history]
    assert got.duration_s >= json.loads(state)["elapsed_s"]


def test_process_checkpoint_arguments(digits) -> None:
    with pytest.raises(ConfigError, match="checkpoint_every"):
        _process(digits, checkpoint_every=-1)
    p = _process(digits)
    with pytest.raises(ConfigError, match="not a training process checkpoint"):
        p.restore({"n": 3})
    state = np.asarray([1.0])  # the state must be the dict checkpoint() gives
    with pytest.raises(ConfigError):
        p.restore({"n": state})


@pytest.mark.parametrize(("topology", "transport"), [("4A", "inproc"), ("6", "inproc"), ("6", "grpc")])
def test_split_resumes_bit_for_bit_across_every_party(topology: str, transport: str, tmp_path) -> None:
    """Every party's state travels: in-process followers and followers in their own processes (gRPC)."""
    from sluice.errors import TrainingError
    from sluice.split import SplitConfig
    from sluice.split.engine import SplitEngine

    cfg = SplitConfig.model_validate({
        "topology": topology, "followers": 2, "data": {"dataset": "digits"},
        "model": {"dtype": "float64", "bottom_hidden": [12], "embedding": 6, "top_hidden": [8]},
        "train": {"steps": 4, "batch_size": 50, "eval_every": 3, "optimizer": "adam", "lr": 0.01},
        "transport": {"kind": transport, "timeout_s": 30}, "pipeline": {"groups": 2}})

    def steps(eng: SplitEngine, n: int) -> list:
        return [(e.iteration, e.metrics.get("train_loss"), e.metrics.get("test_accuracy")) for e in
                (eng.iterate() for _ in range(n))]

    def engine(name: str) -> SplitEngine:
        return SplitEngine(cfg, run_dir=tmp_path / name)

    straight = engine("straight")
    try:
        want = steps(straight, 7)  # past the 4 proposed steps: the task is extended
        want_states = straight.states()
    finally:
        straight.stop()
    first = engine("first")
    try:
        got = steps(first, 3)
        blob = first.checkpoint()
        got += steps(first, 1)  # a checkpoint changes nothing: training goes on
    finally:
        first.stop()
    second = engine("second")
    second.restore(blob)
    try:
        resumed = steps(second, 4)
        assert resumed[0] == got[3]  # the step after the checkpoint, run again from it
        got += resumed[1:]
        states = second.states()
        with pytest.raises(TrainingError, match="before the engine starts"):
            second.restore(blob)
    finally:
        second.stop()
    assert got == want
    assert {"leader.top"} <= set(states) and set(states) <= set(want_states)
    for part, sd in states.items():  # the leader's parts (and in-process followers') are identical
        for k, v in sd.items():
            assert want_states[part][k].equal(v), (part, k)
