"""Grouping (SPEC P1): cut a batch into G groups, the seed's formula for G, and the step-time bound.

Groups: a batch of ``B`` samples becomes ``G`` groups of sizes ``n_g`` differing by at most one
(``sum n_g = B``). Each group's loss is weighted by ``n_g / B`` (SPEC P5), so the summed gradients equal
the gradient of the mean loss over the whole batch.

The seed's formula ([0141]): ``G = Batch_size * Seq_length * hidden_size * 32 / BandWidth / train_time``
= (time to send the batch's activations) / (time to compute the batch).

Lower bound of one step with ``G`` groups (two parties, per group: ``f``, ``b`` bottom forward and
backward, ``c`` top forward+backward, ``u``, ``d`` up and down transfer, ``L`` one-way latency)::

    T_G >= max{ G(f+b), Gf+u+c+d+b+2L, f+Gu+c+d+b+2L, f+u+Gc+d+b+2L, f+u+c+Gd+b+2L }

:func:`chain_bound` generalises it to any chain of stages (U-shape, several followers): for each stage
``i`` of the chain, ``G t_i + sum_{j != i} t_j + latency`` (stage ``i`` is done G times, the rest of
the chain once for the last or first group), and for each resource ``r`` (a party's CPU, one direction of
one link) ``G * sum of its per-group work``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def group_sizes(batch: int, groups: int) -> list[int]:
    """Sizes of ``min(groups, batch)`` groups of a batch, differing by at most one, larger ones first."""
    if batch < 1 or groups < 1:
        raise ValueError(f"batch and groups must be >= 1, got batch={batch} groups={groups}")
    g = min(groups, batch)
    q, r = divmod(batch, g)
    return [q + 1] * r + [q] * (g - r)


def split_batch(indices: np.ndarray, groups: int) -> list[np.ndarray]:
    """Cut a batch (array of row positions) into consecutive groups of :func:`group_sizes`."""
    out, start = [], 0
    for n in group_sizes(len(indices), groups):
        out.append(indices[start : start + n])
        start += n
    return out


def profile_sizes(batch: int) -> list[int]:
    """The two group sizes a party times its operations at: ``[max(1, B // 16), max(2, B)]``."""
    return [max(1, batch // 16), max(2, batch)]


def linear_fit(sizes: list[int], values: list[float]) -> list[float]:
    """``[a0, a1]`` of the line ``a0 + a1 n`` through two measurements ``(n0, v0)``, ``(n1, v1)``, clamped
    to be non-negative: ``a1 = max(0, (v1 - v0) / (n1 - n0))``, ``a0 = max(0, v0 - a1 n0)``."""
    (n0, n1), (v0, v1) = sizes, values
    a1 = max(0.0, (v1 - v0) / (n1 - n0))
    return [max(0.0, v0 - a1 * n0), a1]


def seed_formula(bytes_per_batch: float, bandwidth_bytes_s: float, train_time_s: float) -> float:
    """The seed's G: (bits to send for a batch) / (bits/s of the link) / (compute time of the batch)."""
    if bandwidth_bytes_s <= 0 or train_time_s <= 0:
        return 1.0
    return (8.0 * bytes_per_batch) / (8.0 * bandwidth_bytes_s) / train_time_s


def lower_bound(G: int, f: float, b: float, c: float, u: float, d: float, L: float) -> float:
    """The two-party lower bound of the step time with ``G`` groups (per-group times, see module doc)."""
    rest = 2 * L
    return max(
        G * (f + b),
        G * f + u + c + d + b + rest,
        f + G * u + c + d + b + rest,
        f + u + G * c + d + b + rest,
        f + u + c + G * d + b + rest,
    )


@dataclass(frozen=True)
class PipeStage:
    """One stage of a group's chain: ``seconds`` per group on ``resource``."""

    name: str
    resource: str
    seconds: float


def chain_bound(
    G: int, stages: list[PipeStage], latency: float, extra: dict[str, float] | None = None
) -> float:
    """Lower bound of a step for one chain of stages (``extra``: per-group work on a resource that is not
    on the chain, such as the leader's own bottom model in topology 6)."""
    total = sum(s.seconds for s in stages)
    terms = [(G - 1) * s.seconds + total + latency for s in stages]
    load: dict[str, float] = dict(extra or {})
    for s in stages:
        load[s.resource] = load.get(s.resource, 0.0) + s.seconds
    terms += [G * v for v in load.values()]
    return max(terms) if terms else 0.0


@dataclass(frozen=True)
class PipeStageModel:
    """Cost of a stage for a group of ``n`` samples: compute ``a0 + a1 n`` seconds, or for a link stage
    ``(a0 + a1 n)`` bytes at ``bandwidth`` bytes/s."""

    name: str
    resource: str
    a0: float
    a1: float
    bandwidth: float | None = None  # bytes/s for link stages

    def seconds(self, n: int) -> float:
        v = self.a0 + self.a1 * n
        return v / self.bandwidth if self.bandwidth else v


@dataclass
class StepModel:
    """Chains (one per follower) and off-chain loads, with total latency per chain."""

    chains: list[list[PipeStageModel]]
    latency: float
    extra: list[PipeStageModel] = field(default_factory=list)

    def predict(self, batch: int, G: int) -> float:
        n = group_sizes(batch, G)[0]
        extra: dict[str, float] = {}
        for s in self.extra:
            extra[s.resource] = extra.get(s.resource, 0.0) + s.seconds(n)
        g = min(G, batch)
        return max(
            chain_bound(g, [PipeStage(s.name, s.resource, s.seconds(n)) for s in chain], self.latency, extra)
            for chain in self.chains
        )


@dataclass
class GroupChoice:
    """Result of the automatic choice of G."""

    groups: int
    seed_formula: float
    predicted_s: float
    predicted_serial_s: float
    table: dict[int, float]


def choose_groups(model: StepModel, batch: int, max_groups: int, seed_value: float) -> GroupChoice:
    """G minimising the predicted step time (per-group overheads make very large G lose); among values
    within 1 % of the best, the smallest."""
    top = max(1, min(max_groups, batch))
    table = {g: model.predict(batch, g) for g in range(1, top + 1)}
    best = min(table.values())
    g = min(k for k, v in table.items() if v <= best * 1.01)
    return GroupChoice(g, seed_value, table[g], table[1], table)
