"""PNG plots of a run's metrics (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_accuracy(records: list[dict[str, Any]], out_dir: str | Path, key: str = "round") -> list[Path]:
    """Accuracy against the iteration and against cumulative megabytes (up + down)."""
    return _curves(records, Path(out_dir), "test_accuracy", "accuracy", "test accuracy", key, bytes_axis=True)


def plot_metrics(records: list[dict[str, Any]], out_dir: str | Path, names: list[str], key: str = "round",
                 bytes_axis: bool = True) -> list[Path]:
    """Each metric of ``names`` that the records hold (a scenario's type-specific errors) against the
    iteration, ``<name>_vs_<key>.png``, and with ``bytes_axis`` against cumulative megabytes,
    ``<name>_vs_mb.png``."""
    out: list[Path] = []
    for name in names:
        out += _curves(records, Path(out_dir), name, name, name, key, bytes_axis)
    return out


def _curves(records: list[dict[str, Any]], out_dir: Path, metric: str, stem: str, ylabel: str, key: str,
            bytes_axis: bool) -> list[Path]:
    rows = [r for r in records if metric in r and r[metric] is not None]
    if not rows:
        return []
    ys = [r[metric] for r in rows]
    axes = [(f"{stem}_vs_{key}.png", [r[key] for r in rows], key)]
    if bytes_axis:
        axes.append((f"{stem}_vs_mb.png", [(r["cum_bytes_up"] + r["cum_bytes_down"]) / 1e6 for r in rows],
                     "cumulative traffic, up + down (MB)"))
    paths = []
    for name, xs, label in axes:
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        ax.plot(xs, ys, lw=1.5)
        ax.set_xlabel(label)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / name)
        plt.close(fig)
        paths.append(out_dir / name)
    return paths
