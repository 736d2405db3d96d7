"""Print what ``load_federated`` builds: ``python -m sluice.data [seed=N] [dataset=mnist] [alpha=0.1] ...``.

Arguments are ``key=value`` settings of the ``[data]`` section (plus ``seed``); unset keys keep their
defaults. Prints the summary and the per-client label histogram.
"""

from __future__ import annotations

import sys

from sluice.config import load_config
from sluice.data.config import DataConfig
from sluice.data.federated import load_federated
from sluice.errors import SluiceError


def main(argv: list[str]) -> int:
    seed = 0
    overrides = []
    for arg in argv:
        if arg.startswith("seed="):
            try:
                seed = int(arg.split("=", 1)[1])
            except ValueError:
                print(f"error: seed must be an integer, got {arg!r}", file=sys.stderr)
                return 2
        else:
            overrides.append(arg)
    try:
        cfg = load_config(None, overrides, model=DataConfig)
        fed = load_federated(cfg, seed)
    except SluiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(fed.summary())
    hist = fed.label_histogram()
    print("client  size  labels " + " ".join(f"{c:>4d}" for c in range(fed.num_classes)))
    for k, row in enumerate(hist):
        print(f"{k:>6d} {int(row.sum()):>5d}         " + " ".join(f"{int(v):>4d}" for v in row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
