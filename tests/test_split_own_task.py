"""Split training of a user's own task: every party's parts from its own factory, activations of any shape,
exactly the full-batch update on every topology (P5, P6)."""

from __future__ import annotations

import pytest

from sluice.split import SplitConfig, reference_train, run_inprocess


def _cfg(task: dict, **kw) -> SplitConfig:
    base = {"task": task, "train": {"steps": 4, "batch_size": 40, "eval_every": 2, "lr": 0.05},
            "transport": {"kind": "inproc", "timeout_s": 60}, "pipeline": {"groups": 1}}
    base.update(kw)
    return SplitConfig.model_validate(base)


def _maxdiff(a, b) -> float:
    assert set(a) == set(b)
    return max(float((a[p][k].double() - b[p][k].double()).abs().max()) for p in a for k in a[p])


CASES = [
    ("6", 2, {"factory": "split_user_tasks:conv"}, 3),  # convolutional bottoms, 4-D activations
    ("6", 3, {"factory": "split_user_tasks:conv"}, 4),
    ("4A", 2, {"factory": "split_user_tasks:conv"}, 3),
    ("5", 1, {"factory": "split_user_tasks:recurrent"}, 3),  # a GRU in the middle, 3-D activations both ways
]


@pytest.mark.parametrize("topology,followers,task,groups", CASES, ids=lambda c: str(c))
def test_own_parts_pipelined_equal_the_full_batch_update(topology, followers, task, groups):
    cfg = _cfg(task, topology=topology, followers=followers)
    ref, ref_loss = reference_train(cfg, 4)
    piped = run_inprocess(cfg.model_copy(update={"pipeline": cfg.pipeline.model_copy(update={"groups": groups})}))
    assert piped.summary["groups"] == groups and piped.summary["task"] in ("conv", "recurrent")
    assert _maxdiff(piped.states, ref) <= 1e-9
    assert max(abs(r["loss"] - x) for r, x in zip(piped.records, ref_loss, strict=True)) <= 1e-9
    assert _maxdiff(reference_train(cfg, 1)[0], ref) > 1e-4  # the weights moved: the comparison means something
    assert "test_accuracy" in piped.records[-1]


def test_the_leader_never_names_a_followers_task():
    """Each follower loads its own [follower_tasks.<name>] (here: of the same function); the proposal that
    reaches it carries ids and a schedule, no task, factory or column."""
    seen = []

    def hook(i, follower):
        orig = follower._prepare

        def spy(p):
            seen.append(p)
            return orig(p)

        follower._prepare = spy

    cfg = _cfg({"factory": "split_user_tasks:conv"}, topology="6", followers=2,
               follower_tasks={"follower-2": {"factory": "split_user_tasks:conv", "args": {}}})
    run_inprocess(cfg, follower_hook=hook)
    assert len(seen) == 2
    for p in seen:
        assert "split_user_tasks" not in repr(p) and not {"task", "factory", "columns", "dataset", "model"} & set(p)
