"""Exactness (P5): pipelined training ends with the full-batch weights, for every topology (P6)."""

from __future__ import annotations

import numpy as np
import pytest

from sluice.config import load_config
from sluice.data.datasets import raw_dataset
from sluice.errors import ConfigError
from sluice.split import SplitConfig, reference_train, run_inprocess
from sluice.tasks.split_builtin import builtin_split, mlp


def _cfg(**kw) -> SplitConfig:
    base = {
        "model": {"dtype": "float64", "bottom_hidden": [12], "embedding": 6, "top_hidden": [8],
                  "middle_hidden": [10]},
        "train": {"steps": 5, "batch_size": 50, "eval_every": 0, "optimizer": "adam", "lr": 0.01},
        "transport": {"kind": "inproc", "timeout_s": 20},
        "pipeline": {"groups": 1},
    }
    for k, v in kw.items():
        if isinstance(v, dict):
            base.setdefault(k, {}).update(v)
        else:
            base[k] = v
    return SplitConfig.model_validate(base)


def _maxdiff(a, b) -> float:
    assert set(a) == set(b)
    return max(float((a[p][k] - b[p][k]).abs().max()) for p in a for k in a[p])


CASES = [
    ("6", 1, "breast_cancer", 4),
    ("6", 2, "digits", 7),  # 50 = 8+7*6: unequal groups
    ("4A", 2, "breast_cancer", 3),
    ("5", 1, "digits", 6),
]


@pytest.mark.parametrize("topology,followers,dataset,groups", CASES)
def test_pipelined_equals_full_batch(topology, followers, dataset, groups):
    cfg = _cfg(topology=topology, followers=followers, data={"dataset": dataset})
    ref, ref_loss = reference_train(cfg, 5)
    piped = run_inprocess(_cfg(topology=topology, followers=followers, data={"dataset": dataset},
                               pipeline={"groups": groups}))
    assert piped.summary["groups"] == groups
    assert all(r["groups"] == groups for r in piped.records)
    assert _maxdiff(piped.states, ref) <= 1e-6
    assert max(abs(r["loss"] - x) for r, x in zip(piped.records, ref_loss, strict=True)) <= 1e-9
    # the weights did move: the comparison is not trivially true
    first = reference_train(cfg, 1)[0]
    assert _maxdiff(first, ref) > 1e-3


ENERGY = {"dataset": "energy", "scenario": {"cells": 6, "sites": 3, "days": 2}}  # 144 train rows, 2 targets


@pytest.mark.parametrize("topology,followers,groups", [("6", 1, 3), ("4A", 2, 4), ("5", 1, 6)])
def test_pipelined_regression_equals_full_batch(topology, followers, groups, tmp_path, monkeypatch):
    """A regression task (squared error over the targets): the groups add up to the full-batch update too."""
    monkeypatch.setenv("SLUICE_CACHE", str(tmp_path))
    cfg = _cfg(topology=topology, followers=followers, data=ENERGY)
    ref, ref_loss = reference_train(cfg, 5)
    piped = run_inprocess(_cfg(topology=topology, followers=followers, data=ENERGY, pipeline={"groups": groups}))
    assert all(r["groups"] == groups for r in piped.records)
    assert [*piped.states["leader.top"].values()][-1].shape == (2,)  # the last bias: one output per target
    assert "accuracy" not in piped.records[0]
    assert _maxdiff(piped.states, ref) <= 1e-6
    assert max(abs(r["loss"] - x) for r, x in zip(piped.records, ref_loss, strict=True)) <= 1e-9
    assert _maxdiff(reference_train(cfg, 1)[0], ref) > 1e-3


def test_backpressure_keeps_the_update_exact():
    """A send queue that is always over the threshold: the follower interleaves backward passes with its
    (slowed-down) forward passes as soon as gradients arrive, and the update is still exact."""
    import time

    kw = {"topology": "6", "followers": 1, "train": {"optimizer": "sgd", "lr": 0.1, "steps": 3}}
    ref, _ = reference_train(_cfg(**kw), 3)

    def hook(i, f):
        f.queued_bytes = lambda: 10**9
        run = f._execute

        def slow(op, step, groups):
            if op.name == "bottom.fwd":
                time.sleep(0.02)
            return run(op, step, groups)

        f._execute = slow

    res = run_inprocess(_cfg(pipeline={"groups": 5}, **kw), trace=True, follower_hook=hook)
    assert _maxdiff(res.states, ref) <= 1e-6
    order = [(d.op.name, d.mode) for d in res.traces["follower-1"] if d.op is not None]
    assert ("bottom.bwd", "backpressure") in order
    # a backward pass ran before the last forward pass of its step
    first_bwd = next(i for i, (n, _) in enumerate(order) if n == "bottom.bwd")
    assert any(n == "bottom.fwd" for n, _ in order[first_bwd:5 * 2])


def test_serial_and_pipelined_loss_curves_match_in_float32():
    kw = {"model": {"dtype": "float32"}, "train": {"steps": 8}}
    a = run_inprocess(_cfg(**kw))
    b = run_inprocess(_cfg(pipeline={"groups": 4}, **kw))
    assert max(abs(x["loss"] - y["loss"]) for x, y in zip(a.records, b.records, strict=True)) < 1e-5


def test_batchnorm_is_refused_unless_allowed():
    with pytest.raises(ConfigError, match="batch_norm"):
        load_config(None, ["model.batch_norm=true"], model=SplitConfig)
    # G = 1 is exact even with BatchNorm
    load_config(None, ["model.batch_norm=true", "pipeline.groups=1"], model=SplitConfig)
    # the user may opt in to approximate updates
    cfg = _cfg(model={"batch_norm": True, "allow_batch_coupled": True}, pipeline={"groups": 3})
    res = run_inprocess(cfg)
    ref, _ = reference_train(cfg, 5)
    assert _maxdiff(res.states, ref) > 1e-9  # per-group statistics: not the full-batch update


def test_check_exact_names_the_layers():
    from sluice.split.models import check_exact

    m = mlp(4, [5], 3, "relu", True, True, "float32")
    with pytest.raises(ConfigError, match="BatchNorm1d|1"):
        check_exact(m, "follower-1.bottom", 4, allow=False)
    check_exact(m, "follower-1.bottom", 1, allow=False)
    check_exact(m, "follower-1.bottom", 4, allow=True)


def _columns(dataset: str = "breast_cancer", topology: str = "6", followers: int = 1) -> list[list[int]]:
    """The columns each party's built-in task holds: the leader's, then each follower's."""
    parties = ["leader", *(f"follower-{i + 1}" for i in range(followers))]
    tables = [builtin_split(dataset, party=p, followers=followers, topology=topology).table for p in parties]
    return [[int(c[1:]) for c in t.columns] for t in tables]


def test_fate_split_of_breast_cancer_and_image_halves_of_digits():
    assert _columns() == [list(range(10)), list(range(10, 30))]
    lead, *fol = _columns("digits", followers=2)
    assert all(c % 8 < 4 for c in lead) and len(lead) == 32
    assert all(c % 8 in (4, 5) for c in fol[0]) and all(c % 8 in (6, 7) for c in fol[1])
    lead, *fol = _columns(topology="4A", followers=3)
    assert lead == [] and sorted(sum(fol, [])) == list(range(30))


@pytest.mark.parametrize("dataset", ["breast_cancer", "digits"])
def test_tables_hold_the_embedded_datasets_raw_rows_in_order(dataset):
    """Split training reads the same raw samples as the other engines, unscaled, with ids in row order: the
    leader's and the follower's tables together hold every column."""
    lead, fol = (builtin_split(dataset, party=p).table for p in ("leader", "follower-1"))
    X, y = raw_dataset(dataset)
    cols = [int(c[1:]) for c in lead.columns + fol.columns]
    assert np.array_equal(np.concatenate([lead.X, fol.X], axis=1), X[:, cols])
    assert sorted(cols) == list(range(X.shape[1]))
    assert np.array_equal(lead.y, y) and fol.y is None
    assert lead.X.dtype == np.float64 and np.array_equal(lead.ids, fol.ids)
    assert lead.ids[0] == f"{dataset}-000000" and len(lead.ids) == len(y)
