"""A task whose training data only the Flower nodes hold: each SuperNode builds its client's data from the task's
factory with its own node configuration (``task.data_dir``), the ServerApp only the model and the test set.

The run gives, round by round, the simulator's numbers on the same three datasets; every process started here is
stopped in a finalizer.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from sluice.hfl import HFLEngine
from sluice.runtimes.flower.deploy import LocalDeployment
from sluice.runtimes.jobs import load_job
from test_flower_deploy import _submit, _wait_report, _wait_rows

pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.timeout(480)]

FACTORY = '''
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

import sluice


def _model():
    return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))


def task(data_dir=None):
    """On a node, its own files; on the server, no training data (the model and the test set only)."""
    z = np.load(Path(__file__).parent / "test.npz")
    test = TensorDataset(torch.from_numpy(z["X"]), torch.from_numpy(z["y"]))
    train = []
    if data_dir is not None:
        own = np.load(Path(data_dir) / "train.npz")
        train = [TensorDataset(torch.from_numpy(own["X"]), torch.from_numpy(own["y"]))]
    return sluice.Task(model=_model, train=train, test=test, name="node-files")


def pooled(root, clients=3):
    """The same federation in one process, for comparison."""
    out = task()
    out.train = [task(f"{root}/node-{c}").train[0] for c in range(clients)]
    return out
'''


def _write_files(root: Path) -> None:
    rng = np.random.default_rng(0)

    def rows(n: int) -> dict[str, np.ndarray]:
        X = rng.normal(size=(n, 5)).astype(np.float32)
        return {"X": X, "y": ((X[:, 0] > 0).astype(np.int64) + (X[:, 1] > 0.5))}

    (root / "nodefiles.py").write_text(textwrap.dedent(FACTORY), encoding="utf-8")
    np.savez(root / "test.npz", **rows(60))
    for c, n in enumerate((40, 25, 55)):  # different sizes: the uploads are weighted by what each node holds
        (root / f"node-{c}").mkdir()
        np.savez(root / f"node-{c}" / "train.npz", **rows(n))


@pytest.fixture(scope="module")
def node_files(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("nodefiles")
    _write_files(root)
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), old) if p)
    dep = LocalDeployment(root / "dep", nodes=3, tls=True,
                          node_args={c: {"data_dir": str(root / f"node-{c}")} for c in range(3)})
    try:
        dep.start()
        yield root, dep
    finally:
        dep.stop()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def test_nodes_train_on_the_data_only_they_hold(node_files, tmp_path: Path, monkeypatch) -> None:
    root, dep = node_files
    sets = ["task.factory=nodefiles:task", "data.num_clients=3", "train.participation=1.0", "train.rounds=2",
            "train.local_epochs=1"]
    job = load_job("hfl", None, sets)
    out = tmp_path / "run"
    _submit(dep, job, out, **{"round-timeout": 120.0})
    report = _wait_report(out, 420)
    rows = _wait_rows(out, 2, 5)
    assert report["cause"] == "CRITERION_MET" and report["iterations"] == 2, report

    monkeypatch.syspath_prepend(str(root))
    pooled = load_job("hfl", None, [*sets, "task.factory=nodefiles:pooled", f'task.args.root="{root}"'])
    sim = HFLEngine(pooled.config)
    for row in rows:
        ev = sim.iterate()
        assert row["participants"] == 3 and row["dropped"] == 0
        assert row["bytes_up"] == ev.bytes_up and row["bytes_down"] == ev.bytes_down, row["round"]
        assert row["test_accuracy"] == ev.metrics["test_accuracy"] and row["train_loss"] == ev.metrics["train_loss"]
