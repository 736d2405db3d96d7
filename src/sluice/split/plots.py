"""Plot of a split-training run: training loss per step and test accuracy when evaluated."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_loss(records: list[dict[str, Any]], run_dir: str | Path) -> Path:
    """Write ``loss.png`` into ``run_dir`` from ``metrics.jsonl`` records: batch loss per step (left axis)
    and test accuracy (right axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([r["step"] for r in records], [r["train_loss"] for r in records], lw=1, label="batch loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ev = [r for r in records if "test_accuracy" in r]
    if ev:
        ax2 = ax.twinx()
        ax2.plot([r["step"] for r in ev], [r["test_accuracy"] for r in ev], "o-", color="C1", ms=3)
        ax2.set_ylabel("test accuracy", color="C1")
    fig.tight_layout()
    out = Path(run_dir) / "loss.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
