"""A run's data inbox: how a consumer hands more training data to a process that is AWAITING_DATA.

``put`` checks a ``.npz`` file holding arrays ``X`` (samples × features) and ``y`` (one label or target
row per sample), optionally ``terminal`` (an integer: which party of a federated run gets it), and
moves a copy into ``<run dir>/inbox/`` under a temporary name first, so a reader never sees half a
file. ``take`` returns the oldest waiting file as ``{"X": ..., "y": ...}`` and moves it to
``inbox/consumed/``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from sluice.errors import DataError

INBOX = "inbox"


def inbox_of(run_dir: str | Path) -> Path:
    """The inbox folder of a run directory."""
    return Path(run_dir) / INBOX


def load_arrays(path: str | Path) -> dict[str, Any]:
    """Read and check a data file: ``.npz`` with ``X`` (2-D), ``y`` of the same length and optionally
    an integer ``terminal``."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file not found: {p}")
    try:
        with np.load(p, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # numpy raises several kinds for a bad file
        raise DataError(f"{p} is not a readable .npz file with arrays X and y: {exc}") from exc
    if "X" not in arrays or "y" not in arrays:
        raise DataError(f"{p} must hold arrays named X and y, it holds {sorted(arrays)}")
    X, y = arrays["X"], arrays["y"]
    if X.ndim != 2 or X.shape[0] == 0:
        raise DataError(f"X must be a non-empty 2-D array (samples × features), got shape {X.shape}")
    if y.shape[0] != X.shape[0]:
        raise DataError(f"X has {X.shape[0]} rows but y has {y.shape[0]}; they must match")
    if not np.issubdtype(X.dtype, np.number) or not np.isfinite(X).all():
        raise DataError("X must hold finite numbers")
    out: dict[str, Any] = {"X": X, "y": y}
    if "terminal" in arrays:
        t = arrays["terminal"]
        if t.size != 1 or not np.issubdtype(t.dtype, np.integer) or int(t.reshape(-1)[0]) < 0:
            raise DataError(f"terminal must be one integer >= 0, got {t!r}")
        out["terminal"] = int(t.reshape(-1)[0])
    return out


def save_arrays(path: str | Path, X: np.ndarray, y: np.ndarray, terminal: int | None = None) -> Path:
    """Write a data file that :func:`put` accepts."""
    arrays: dict[str, np.ndarray] = {"X": np.asarray(X), "y": np.asarray(y)}
    if terminal is not None:
        arrays["terminal"] = np.asarray(int(terminal))
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return Path(path)


def put(run_dir: str | Path, path: str | Path, terminal: int | None = None) -> Path:
    """Check ``path`` and drop it into the run's inbox (for ``terminal``, when given); return where it
    landed."""
    if not Path(run_dir).is_dir():
        raise DataError(f"run directory not found: {run_dir}")
    arrays = load_arrays(path)
    if terminal is not None:
        if terminal < 0:
            raise DataError(f"terminal must be >= 0, got {terminal}")
        arrays["terminal"] = terminal
    box = inbox_of(run_dir)
    box.mkdir(exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}.npz"
    tmp = box / (name + ".tmp")
    save_arrays(tmp, arrays["X"], arrays["y"], arrays.get("terminal"))
    final = box / name
    os.replace(tmp, final)
    return final


def take(box: str | Path) -> dict[str, Any] | None:
    """Oldest waiting data in the inbox folder ``box`` (None when empty); the file is moved aside."""
    box = Path(box)
    if not box.is_dir():
        return None
    files = sorted(box.glob("*.npz"))
    if not files:
        return None
    f = files[0]
    data = load_arrays(f)
    done = box / "consumed"
    done.mkdir(exist_ok=True)
    os.replace(f, done / f.name)
    return data
