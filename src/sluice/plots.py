"""PNG plots of a run's metrics (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_accuracy(records: list[dict[str, Any]], out_dir: str | Path, key: str = "round") -> list[Path]:
    """Accuracy against the iteration and against cumulative megabytes (up + down)."""
    out_dir = Path(out_dir)
    rows = [r for r in records if "test_accuracy" in r]
    if not rows:
        return []
    acc = [r["test_accuracy"] for r in rows]
    paths = []
    for name, xs, label in (
        ("accuracy_vs_round.png", [r[key] for r in rows], key),
        ("accuracy_vs_mb.png", [(r["cum_bytes_up"] + r["cum_bytes_down"]) / 1e6 for r in rows],
         "cumulative traffic, up + down (MB)"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        ax.plot(xs, acc, lw=1.5)
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / name)
        plt.close(fig)
        paths.append(out_dir / name)
    return paths
