"""Write the tables of a small vertical federation: parties that hold different columns of the same subjects.

The subjects are the 1,797 scans of scikit-learn's digits (8x8 pixels). The leader holds the left half of
every scan it has (pixel columns 0-3) and the label; one follower (or two) holds the right half (pixel
columns 4-7, or 4-5 and 6-7). Each party holds only part of the subjects (about 85 %, drawn with a fixed
seed), under ids that no one else could guess, so the parties must find the ids they share.

    python examples/vertical/make_tables.py --out tables            # leader.csv, follower-1.csv
    python examples/vertical/make_tables.py --out tables3 --followers 2
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
from sklearn.datasets import load_digits


def write(path: Path, ids: np.ndarray, columns: list[str], X: np.ndarray, labels: np.ndarray | None) -> None:
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["id", *columns, *(["label"] if labels is not None else [])])
        for i, sid in enumerate(ids):
            out.writerow([sid, *(f"{v:g}" for v in X[i]), *([int(labels[i])] if labels is not None else [])])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tables", help="folder for leader.csv and follower-N.csv")
    ap.add_argument("--followers", type=int, default=1, choices=[1, 2])
    ap.add_argument("--hold", type=float, default=0.85, help="share of the subjects each party holds")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    X, y = load_digits(return_X_y=True)
    images = X.reshape(-1, 8, 8)
    ids = np.array([f"s{v:08x}" for v in rng.choice(2**32, len(y), replace=False)])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    blocks = [range(0, 4)] + ([range(4, 8)] if args.followers == 1 else [range(4, 6), range(6, 8)])
    for k, cols in enumerate(blocks):
        keep = np.sort(rng.choice(len(y), int(args.hold * len(y)), replace=False))
        part = images[keep][:, :, list(cols)].reshape(len(keep), -1)
        names = [f"px{r}_{c}" for r in range(8) for c in cols]
        name = "leader" if k == 0 else f"follower-{k}"
        order = rng.permutation(len(keep))  # every party lists its rows in its own order
        write(out / f"{name}.csv", ids[keep][order], names, part[order], y[keep][order] if k == 0 else None)
        print(f"{out / (name + '.csv')}: {len(keep)} rows, {len(names)} feature columns"
              + (" and the label" if k == 0 else ""))


if __name__ == "__main__":
    main()
