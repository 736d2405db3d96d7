"""A run's data inbox: how a consumer hands more training data to a process that is AWAITING_DATA.

``put`` checks a ``.npz`` file holding arrays ``X`` (samples × features) and ``y`` (one label or target
row per sample), optionally ``client`` (an integer: which client of a federated run gets it), and
moves a copy into ``<run dir>/inbox/`` under a temporary name first, so a reader never sees half a
file. The training process reads the ``oldest`` waiting file and ``settle`` s it: to ``inbox/consumed/``
when its engine took the data, else to ``inbox/rejected/`` with a ``.reason.txt`` saying why.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from sluice.errors import DataError
from sluice.files import atomic_path

INBOX = "inbox"


def inbox_of(run_dir: str | Path) -> Path:
    """The inbox folder of a run directory."""
    return Path(run_dir) / INBOX


def load_arrays(path: str | Path) -> dict[str, Any]:
    """Read and check a data file: ``.npz`` with ``X`` (2-D), ``y`` of the same length, both finite
    numbers, and optionally an integer ``client``; no other arrays."""
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
    extra = sorted(set(arrays) - {"X", "y", "client"})
    if extra:
        raise DataError(f"{p} holds arrays {extra}; allowed: X, y and (federated runs) client")
    X, y = arrays["X"], arrays["y"]
    if X.ndim != 2 or X.shape[0] == 0:
        raise DataError(f"X must be a non-empty 2-D array (samples × features), got shape {X.shape}")
    if y.shape[0] != X.shape[0]:
        raise DataError(f"X has {X.shape[0]} rows but y has {y.shape[0]}; they must match")
    if not np.issubdtype(X.dtype, np.number) or not np.isfinite(X).all():
        raise DataError("X must hold finite numbers")
    if not np.issubdtype(y.dtype, np.number) or not np.isfinite(y).all():
        raise DataError("y must hold finite numbers")
    out: dict[str, Any] = {"X": X, "y": y}
    if "client" in arrays:
        c = arrays["client"]
        if c.size != 1 or not np.issubdtype(c.dtype, np.integer) or int(c.reshape(-1)[0]) < 0:
            raise DataError(f"client must be one integer >= 0, got {c!r}")
        out["client"] = int(c.reshape(-1)[0])
    return out


def save_arrays(path: str | Path, X: np.ndarray, y: np.ndarray, client: int | None = None) -> Path:
    """Write a data file that :func:`put` accepts."""
    arrays: dict[str, np.ndarray] = {"X": np.asarray(X), "y": np.asarray(y)}
    if client is not None:
        arrays["client"] = np.asarray(int(client))
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return Path(path)


def put(run_dir: str | Path, path: str | Path, client: int | None = None) -> Path:
    """Check ``path`` and drop it into the run's inbox (for ``client``, when given); return where it
    landed."""
    if not Path(run_dir).is_dir():
        raise DataError(f"run directory not found: {run_dir}")
    arrays = load_arrays(path)
    if client is not None:
        if client < 0:
            raise DataError(f"client must be >= 0, got {client}")
        arrays["client"] = client
    box = inbox_of(run_dir)
    box.mkdir(exist_ok=True)
    final = box / f"{time.time_ns():020d}-{os.getpid()}.npz"
    with atomic_path(final) as tmp:
        save_arrays(tmp, arrays["X"], arrays["y"], arrays.get("client"))
    return final


def oldest(box: str | Path) -> Path | None:
    """The oldest waiting file in the inbox folder ``box`` (None when there is none)."""
    box = Path(box)
    files = sorted(box.glob("*.npz")) if box.is_dir() else []
    return files[0] if files else None


def settle(path: str | Path, reason: str | None = None) -> Path:
    """Move an inbox file aside: to ``consumed/`` when the run took it, else to ``rejected/`` with
    ``<name>.reason.txt`` saying why it was refused. Returns where it went."""
    f = Path(path)
    folder = f.parent / ("consumed" if reason is None else "rejected")
    folder.mkdir(exist_ok=True)
    if reason is not None:
        (folder / f"{f.name}.reason.txt").write_text(reason + "\n", encoding="utf-8")
    os.replace(f, folder / f.name)
    return folder / f.name

