"""Split training under the control plane: requirements (data amount, layers), early stop, extension."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sluice.control.params import Cause
from sluice.control.process import TrainingProcess, train
from sluice.errors import ConfigError, NegotiationError, TrainingError
from sluice.split import SplitConfig, SplitEngine, reference_train
from sluice.split.models import linear_layers
from sluice.split.plan import agree_rows


def _cfg(**kw) -> SplitConfig:
    base = {
        "model": {"top_hidden": [8, 8]},
        "train": {"steps": 6, "eval_every": 3},
        "pipeline": {"groups": 2},
        "transport": {"kind": "inproc", "timeout_s": 10},
    }
    for k, v in kw.items():
        base.setdefault(k, {}).update(v) if isinstance(v, dict) else base.__setitem__(k, v)
    return SplitConfig.model_validate(base)


def _follower_ids(engine: SplitEngine) -> list[str]:
    (f,) = engine.followers
    return f.proposal["train_ids"]


def test_engine_declares_what_it_reports_and_plans():
    engine = SplitEngine(_cfg(train={"steps": None, "epochs": 2, "batch_size": 50}))
    total = engine.num_samples
    assert total == 455  # 80 % of breast cancer's 569 rows
    assert engine.default_iterations == 2 * 10  # ceil(455 / 50) batches per epoch
    assert {"test_auc", "test_f1", "train_loss", "idle_leader_s"} <= set(engine.metrics)
    assert engine.metrics["test_auc"].higher_is_better and engine.counts_bytes
    assert engine.num_layers == 3  # top model 32 -> 8 -> 8 -> 2
    assert SplitEngine(_cfg(), steps=9).default_iterations == 9


@pytest.mark.parametrize("req,rows", [({"data_amount": 100}, 100), ({"max_data_amount": 120}, 120)])
def test_data_amount_limits_the_rows_all_parties_train_on(req, rows):
    engine = SplitEngine(_cfg())
    report = train(engine, {"iterations": 4}, req)
    assert report.cause == Cause.CRITERION_MET and report.iterations == 4
    assert engine.num_samples == rows
    leader = engine.leader
    assert leader is not None and len(leader.plan.train_ids) == len(leader.y) == rows
    # the follower got exactly these ids in the proposal: the first rows in the agreed order
    every = agree_rows(_cfg(), engine.task.table, np.arange(len(engine.task.table.ids)))[0]
    assert _follower_ids(engine) == leader.plan.train_ids == every[:rows]
    assert all(int(r["batch"]) <= 64 for r in engine.records)
    # batches only ever index the rows in use
    assert max(int(leader.batches.batch(s).max()) for s in range(4)) < rows


def test_too_little_data_is_refused_before_training_and_the_followers_end():
    engine = SplitEngine(_cfg())
    report = train(engine, {"iterations": 4}, {"min_data_amount": 10_000})
    assert report.cause == Cause.INSUFFICIENT_TRAINING_SAMPLES and report.iterations == 0
    assert "455 training samples" in report.detail
    (f,) = engine.followers
    assert f.proposal == {} and f.steps_done == 0  # stopped before any proposal
    assert not any(t.is_alive() for t in engine._threads)
    assert engine._errors == []
    with pytest.raises(ConfigError, match="fixes its samples"):
        engine.add_data({"X": [], "y": []})


def test_layers_requirement_trains_only_the_last_layers_of_the_top_model():
    init = SplitEngine(_cfg())
    init.start()
    assert init.leader is not None
    before = [lin.weight.detach().clone() for lin in linear_layers(init.leader.top)]
    bottom_before = linear_layers(init.leader.bottom)[0].weight.detach().clone()
    init.stop()

    engine = SplitEngine(_cfg())
    report = train(engine, {"iterations": 3}, {"layers": 1})
    assert report.cause == Cause.CRITERION_MET
    assert engine.leader is not None
    after = [lin.weight for lin in linear_layers(engine.leader.top)]
    assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
    assert not torch.allclose(after[2], before[2])
    # the leader's bottom model still trains (through the frozen layers)
    assert not torch.allclose(linear_layers(engine.leader.bottom)[0].weight, bottom_before)


def test_more_layers_than_the_top_model_has_are_refused():
    engine = SplitEngine(_cfg())
    with pytest.raises(NegotiationError, match="1..3"):
        train(engine, {"iterations": 2}, {"layers": 4})
    with pytest.raises(ConfigError, match=r"1\.\.3"):
        SplitEngine(_cfg()).set_trainable_layers(4)


def test_samples_are_fixed_once_proposed():
    engine = SplitEngine(_cfg())
    try:
        engine.iterate()
        with pytest.raises(TrainingError, match="fixed when the task was proposed"):
            engine.limit_samples(10)
    finally:
        engine.stop()


def test_an_f1_target_can_stop_split_training():
    engine = SplitEngine(_cfg(train={"steps": 200, "eval_every": 2}))
    proc = TrainingProcess(engine, {"performance": {"f1": 0.7}, "iterations": 200})
    report = proc.run()
    assert report.cause == Cause.CRITERION_MET and report.criterion.rule == "performance.test_f1"
    assert report.performance["test_f1"] >= 0.7 and report.iterations < 200
    (f,) = engine.followers
    assert f.steps_done == report.iterations  # the follower stopped with the leader


def test_steps_beyond_the_plan_extend_the_task_exactly():
    """Proposed for 2 steps, trained for 5: the leader extends the task and the result is still the
    full-batch training of 5 steps."""
    kw = {"model": {"dtype": "float64", "top_hidden": [8]}, "train": {"steps": 2, "eval_every": 0,
                                                                     "batch_size": 200}}
    engine = SplitEngine(_cfg(**kw))
    try:
        events = [engine.iterate() for _ in range(5)]
    finally:
        engine.stop()
    assert [e.iteration for e in events] == list(range(5))
    assert "test_accuracy" in events[1].metrics  # the planned last step is evaluated
    (f,) = engine.followers
    assert f.steps_done == f.steps == 5  # extended once, by an epoch (3 batches of 200 rows)
    ref, losses = reference_train(_cfg(**kw), 5)
    states = engine.states()
    assert max(float((states[p][k] - ref[p][k]).abs().max()) for p in ref for k in ref[p]) <= 1e-9
    assert [e.metrics["train_loss"] for e in events] == pytest.approx(losses, abs=1e-9)


def test_extension_beyond_the_followers_limit_is_refused():
    engine = SplitEngine(_cfg(train={"steps": 2}, party={"max_steps": 3}))
    try:
        engine.iterate()
        engine.iterate()
        with pytest.raises(TrainingError, match="allows at most 3"):
            engine.iterate()
    finally:
        engine.stop()
