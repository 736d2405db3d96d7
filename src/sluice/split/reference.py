"""Centralised full-batch reference: the same parts, data, seeds and batches in one autograd graph.

Used to check exactness (SPEC P5): pipelined split training with any G must end with the weights this
produces, ``loss = mean_i ℓ(top(...bottoms(x_i)...), y_i)`` over each whole batch (ℓ: cross-entropy, or the
squared error over the outputs for regression; :func:`~sluice.split.models.head_loss`), one optimizer step
per batch.
"""

from __future__ import annotations

import numpy as np
import torch

from .config import SplitConfig
from .data import party_data
from .models import build_mlp, head_loss, make_optimizer, part_seed, targets, torch_dtype
from .task import BatchPlan, build_task


def reference_train(cfg: SplitConfig, steps: int) -> tuple[dict[str, dict[str, torch.Tensor]], list[float]]:
    """Train ``steps`` full-batch steps centrally; returns (part name -> state dict, loss per step)."""
    torch.set_num_threads(1)
    task = build_task(cfg)
    topo = task.topology
    dt = torch_dtype(cfg.model.dtype)
    t = task.table
    lead = party_data(t, task.leader_columns, task.train_ids, task.test_ids, True, np.float64)
    X_lead = torch.from_numpy(lead.X_train).to(dt)
    assert lead.y_train is not None
    y = targets(lead.y_train, t.task, dt)
    parts = {name: build_mlp(spec, part_seed(cfg.seed, name)) for name, spec in task.specs.items()}
    X_f = []
    for name, cols in zip(task.follower_names, task.follower_columns, strict=True):
        d = party_data(t, cols, task.train_ids, task.test_ids, False, np.float64)
        X_f.append((topo.part(name), torch.from_numpy(d.X_train).to(dt)))
    opts = [make_optimizer(list(m.parameters()), task.hparams) for m in parts.values()]
    plan = BatchPlan(len(task.train_ids), task.hparams["batch_size"], cfg.seed)
    losses = []
    for s in range(steps):
        b = torch.from_numpy(plan.batch(s))
        if topo.u_shape:
            (mid, _), = X_f
            z = parts["leader.top"](parts[mid](parts["leader.bottom"](X_lead[b])))
        else:
            hs = [parts["leader.bottom"](X_lead[b])] if topo.leader_bottom else []
            hs += [parts[name](X[b]) for name, X in X_f]
            z = parts["leader.top"](torch.cat(hs, dim=1))
        loss = head_loss(t.task, z, y[b], len(b))
        loss.backward()
        for o in opts:
            o.step()
            o.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    states = {n: {k: v.detach().clone() for k, v in m.state_dict().items()} for n, m in parts.items()}
    return states, losses
