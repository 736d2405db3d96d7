"""Centralised full-batch reference: the same parts, rows, seeds and batches in one autograd graph.

Used to check exactness (SPEC P5): pipelined split training with any G must end with the weights this
produces, ``loss = mean_i ℓ(top(...bottoms(x_i)...), y_i)`` over each whole batch (the leader's loss of
:func:`~sluice.split.models.group_loss` with one group), one optimizer step per batch. Every party's task is
loaded here as the parties load their own (:func:`~sluice.split.engine.party_task`), and the rows are those
every table holds, split as the leader splits them.
"""

from __future__ import annotations

import numpy as np
import torch

from sluice.tasks.split import SplitTask, build_part

from ._data import party_data
from .config import SplitConfig
from .engine import party_task
from .models import group_loss, make_optimizer
from .plan import BatchPlan, agree_rows, make_plan
from .topology import topology


def _parts(cfg: SplitConfig, lead: SplitTask, tasks: dict[str, SplitTask]) -> dict[str, torch.nn.Module]:
    """Every trained part by name (``leader.top``, ``leader.bottom``, each follower's part), seeded as the parties
    seed theirs."""
    topo = topology(cfg.topology)
    parts = {"leader.top": build_part(lead, "top", cfg.seed, "leader.top")}
    if topo.leader_bottom:
        parts["leader.bottom"] = build_part(lead, "bottom", cfg.seed, "leader.bottom")
    for name, t in tasks.items():
        parts[topo.part(name)] = build_part(t, "bottom", cfg.seed, topo.part(name))
    return parts


def _forward(cfg: SplitConfig, parts: dict[str, torch.nn.Module], x_lead: torch.Tensor | None,
             x_followers: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """The leader's output for one batch: the U-shape's leader-follower-leader chain, or the top over the
    concatenated bottoms."""
    topo = topology(cfg.topology)
    if topo.u_shape:
        (mid,) = [topo.part(f"follower-{i + 1}") for i in range(cfg.followers)]
        return parts["leader.top"](parts[mid](parts["leader.bottom"](x_lead)))
    hs = [parts["leader.bottom"](x_lead)] if topo.leader_bottom else []
    hs += [parts[name](X) for name, X in x_followers]
    return parts["leader.top"](torch.cat(hs, dim=1) if len(hs) > 1 else hs[0])


def reference_train(cfg: SplitConfig, steps: int) -> tuple[dict[str, dict[str, torch.Tensor]], list[float]]:
    """Train ``steps`` full-batch steps centrally; returns (part name -> state dict, loss per step)."""
    torch.set_num_threads(1)
    topo = topology(cfg.topology)
    lead = party_task(cfg, "leader")
    tasks = {f"follower-{i + 1}": party_task(cfg, f"follower-{i + 1}") for i in range(cfg.followers)}
    assert lead.table is not None
    common = np.ones(len(lead.table.ids), dtype=bool)
    for t in tasks.values():
        if topo.follower_features and t.table is not None:
            common &= np.isin(lead.table.ids, t.table.ids)
    plan = make_plan(cfg, *agree_rows(cfg, lead.table, np.flatnonzero(common)))
    parts = _parts(cfg, lead, tasks)
    dt = next(p for p in parts["leader.top"].parameters() if p.is_floating_point()).dtype
    data = party_data(lead, plan.train_ids, plan.test_ids, dt, True)
    assert data.y_train is not None
    y = torch.from_numpy(np.ascontiguousarray(data.y_train))
    y = y if lead.kind == "classification" else y.to(dt)
    X_f = [(topo.part(n), party_data(t, plan.train_ids, plan.test_ids, dt, False).X_train)
           for n, t in tasks.items() if topo.follower_features]
    opts = []
    for name, m in parts.items():
        task = lead if name.startswith("leader") else tasks[name.split(".")[0]]
        params = list(m.parameters())
        opts.append(task.optimizer(params, cfg.train.lr) if task.optimizer else make_optimizer(params, plan.hparams))
    batches = BatchPlan(len(plan.train_ids), cfg.train.batch_size, cfg.seed)
    losses = []
    for s in range(steps):
        b = torch.from_numpy(batches.batch(s))
        x_lead = data.X_train[b] if topo.u_shape or topo.leader_bottom else None
        z = _forward(cfg, parts, x_lead, [(name, X[b]) for name, X in X_f])
        loss = group_loss(lead, z, y[b], len(b))
        loss.backward()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    states = {n: {k: v.detach().clone() for k, v in m.state_dict().items()} for n, m in parts.items()}
    return states, losses
