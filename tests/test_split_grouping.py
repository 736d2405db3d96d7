"""Grouping (P1): group sizes, the seed's formula, the lower bound and the automatic choice of G."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluice.split.grouping import (
    PipeStage,
    PipeStageModel,
    StepModel,
    chain_bound,
    choose_groups,
    group_sizes,
    linear_fit,
    lower_bound,
    profile_sizes,
    seed_formula,
    split_batch,
)


@given(batch=st.integers(1, 500), groups=st.integers(1, 64))
def test_group_sizes_cover_the_batch(batch, groups):
    sizes = group_sizes(batch, groups)
    assert sum(sizes) == batch
    assert len(sizes) == min(batch, groups)
    assert max(sizes) - min(sizes) <= 1
    idx = np.arange(batch) * 3
    parts = split_batch(idx, groups)
    assert np.array_equal(np.concatenate(parts), idx)


def test_group_sizes_rejects_nonsense():
    with pytest.raises(ValueError):
        group_sizes(0, 2)


def test_profile_sizes_are_a_small_and_a_full_group():
    assert profile_sizes(64) == [4, 64]
    assert profile_sizes(1) == [1, 2]  # two distinct sizes even for a batch of one


def test_linear_fit_passes_through_both_points_and_clamps_at_zero():
    a0, a1 = linear_fit([4, 64], [1.0, 4.0])
    assert a1 == pytest.approx(3.0 / 60) and a0 == pytest.approx(1.0 - 4 * 3.0 / 60)
    assert a0 + a1 * 64 == pytest.approx(4.0)
    assert linear_fit([4, 64], [2.0, 1.0]) == [2.0, 0.0]  # a faster big group: no negative slope
    assert linear_fit([10, 20], [1.0, 5.0]) == [0.0, 0.4]  # negative intercept clamped


def test_seed_formula_is_transfer_time_over_compute_time():
    # 1 MB at 1 MB/s takes 1 s; computing takes 0.25 s -> G = 4
    assert seed_formula(1e6, 1e6, 0.25) == pytest.approx(4.0)
    # more bandwidth -> fewer groups; more compute -> fewer groups; more data -> more groups
    assert seed_formula(1e6, 2e6, 0.25) < 4.0
    assert seed_formula(1e6, 1e6, 0.5) < 4.0
    assert seed_formula(2e6, 1e6, 0.25) > 4.0


def test_lower_bound_serial_is_the_sum_and_grows_with_G():
    f, b, c, u, d, L = 0.01, 0.02, 0.003, 0.04, 0.04, 0.001
    assert lower_bound(1, f, b, c, u, d, L) == pytest.approx(f + b + c + u + d + 2 * L)
    # per-group times shrink with G: T_G with totals split G ways
    F, B, C, U, D = 0.1, 0.2, 0.03, 0.4, 0.4
    t = [lower_bound(G, F / G, B / G, C / G, U / G, D / G, L) for G in (1, 2, 4, 8, 16)]
    assert all(a > b_ for a, b_ in zip(t, t[1:], strict=False))
    assert t[-1] >= max(F + B, U + 2 * L, D + 2 * L)


def test_chain_bound_matches_the_formula_and_can_be_tighter():
    f, b, c, u, d, L = 0.02, 0.01, 0.003, 0.04, 0.03, 0.002
    stages = [PipeStage("f", "A", f), PipeStage("u", "up", u), PipeStage("c", "B", c),
              PipeStage("d", "down", d), PipeStage("b", "A", b)]
    for G in (1, 3, 8):
        assert chain_bound(G, stages, 2 * L) == pytest.approx(lower_bound(G, f, b, c, u, d, L))
    # with a slow backward and a long latency the chain bound adds the f+u+c+d+Gb+2L term
    f, b, c, u, d, L = 0.001, 0.01, 0.001, 0.005, 0.005, 0.01
    stages = [PipeStage("f", "A", f), PipeStage("u", "up", u), PipeStage("c", "B", c),
              PipeStage("d", "down", d), PipeStage("b", "A", b)]
    assert chain_bound(4, stages, 2 * L) == pytest.approx(f + u + c + d + 4 * b + 2 * L)
    assert chain_bound(4, stages, 2 * L) > lower_bound(4, f, b, c, u, d, L)


def _two_party_model(bw: float, per_op: float) -> StepModel:
    # follower forward/backward, 1 KB per sample each way, leader top
    return StepModel(
        chains=[[
            PipeStageModel("f", "cpu:F", per_op, 2e-5),
            PipeStageModel("up", "up", 40, 1024, bandwidth=bw),
            PipeStageModel("c", "cpu:L", per_op, 1e-6),
            PipeStageModel("down", "down", 40, 1024, bandwidth=bw),
            PipeStageModel("b", "cpu:F", per_op, 4e-5),
        ]],
        latency=0.002,
    )


def test_choose_groups_prefers_pipelining_on_balanced_links_and_not_on_fast_ones():
    batch = 1024
    # 1024 samples * 1 KB = 1 MB per direction; at 12.5 MB/s (100 Mbit/s) = 84 ms; compute 61 ms
    slow = choose_groups(_two_party_model(12.5e6, 2e-4), batch, 32, 1.0)
    assert slow.groups > 2
    assert slow.predicted_s < 0.7 * slow.predicted_serial_s
    # an infinitely fast link with a big per-operation overhead: no reason to cut the batch
    fast = choose_groups(_two_party_model(1e12, 5e-3), batch, 32, 1.0)
    assert fast.groups == 1
    # larger per-operation overhead -> fewer groups
    costly = choose_groups(_two_party_model(12.5e6, 2e-3), batch, 32, 1.0)
    assert costly.groups < slow.groups
    assert set(slow.table) == set(range(1, 33))
