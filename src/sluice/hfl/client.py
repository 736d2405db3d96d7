"""Terminal side of horizontal FL: local training from the model it holds, then the update Δ."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from sluice.models import get_flat, set_flat


def local_train(
    model: nn.Module,
    params: np.ndarray,
    X: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> tuple[np.ndarray, float]:
    """Train ``model`` from ``params`` with plain SGD on (X, y); return (Δ = θ_local − θ, mean loss).

    ``model`` is a scratch module whose parameters are overwritten; batches are shuffled with ``seed``.
    """
    set_flat(model, params)
    model.train()
    gen = torch.Generator().manual_seed(seed)
    Xt = torch.from_numpy(X)
    yt = torch.from_numpy(y)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    n = len(yt)
    total, count = 0.0, 0
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, batch_size):
            b = order[start : start + batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(Xt[b]), yt[b])
            loss.backward()
            opt.step()
            total += loss.item() * len(b)
            count += len(b)
    delta = get_flat(model).astype(np.float64) - params.astype(np.float64)
    return delta, total / max(count, 1)


@torch.no_grad()
def evaluate(model: nn.Module, params: np.ndarray, X: np.ndarray, y: np.ndarray, num_classes: int) -> dict:
    """Loss, accuracy and macro precision / recall / F1 of ``params`` on (X, y)."""
    set_flat(model, params)
    model.eval()
    logits = model(torch.from_numpy(X))
    yt = torch.from_numpy(y)
    loss = float(nn.functional.cross_entropy(logits, yt))
    pred = logits.argmax(1).numpy()
    conf = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(conf, (y, pred), 1)
    tp = np.diag(conf).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(conf.sum(0) > 0, tp / conf.sum(0), 0.0)
        recall = np.where(conf.sum(1) > 0, tp / conf.sum(1), 0.0)
        f1 = np.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
    present = conf.sum(1) > 0
    return {
        "test_loss": loss,
        "test_accuracy": float(tp.sum() / max(len(y), 1)),
        "test_precision": float(precision[present].mean()) if present.any() else 0.0,
        "test_recall": float(recall[present].mean()) if present.any() else 0.0,
        "test_f1": float(f1[present].mean()) if present.any() else 0.0,
    }
