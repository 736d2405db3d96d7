"""Tasks: the user's model and data through every path — TOML, Python, built-in workloads, bad input."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import sluice
from sluice.cli import main
from sluice.config import load_config
from sluice.errors import TaskError
from sluice.hfl import HFLEngine
from sluice.hfl.config import HFLConfig
from sluice.local.config import LocalConfig
from sluice.models import num_params
from sluice.tasks import client_datasets, load_task
from sluice.tasks.builtin import MnistCNN

FACTORIES = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset

import sluice


def data(n, features=6, classes=3, seed=0, label_shift=0, targets=None):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, features, generator=g)
    y = (X[:, 0] > 0).long() + (X[:, 1] > 0).long() + label_shift if targets is None else targets(X)
    return TensorDataset(X, y)


def make(clients=4, hidden=8, seed=0):
    return sluice.Task(model=lambda: nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Linear(hidden, 3)),
                       train=[data(30, seed=seed + c) for c in range(clients)], test=data(40, seed=99), name="toy")


def not_a_task():
    return {"model": None}


def wrong_features():
    task = make()
    task.model = lambda: nn.Linear(5, 3)
    return task


def labels_out_of_range():
    task = make()
    task.train = [data(30, label_shift=5)]
    return task


def vector_loss():
    task = make()
    task.loss = lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
    return task


def fails():
    raise RuntimeError("the data directory is not mounted")
'''


@pytest.fixture
def factories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module of task factories importable as ``toy_tasks``."""
    (tmp_path / "toy_tasks.py").write_text(textwrap.dedent(FACTORIES), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "toy_tasks"


def test_public_api_is_explicit() -> None:
    assert set(sluice.__all__) == {"ConfigError", "DataError", "MetricSpec", "Partition", "SluiceError", "SplitTask",
                                   "Table", "Task", "TaskError", "__version__", "read_table", "run_task"}
    assert sluice.TaskError is TaskError and issubclass(sluice.TaskError, sluice.SluiceError)
    assert sluice.MetricSpec("hits", True, 0.0).name == "hits"
    assert sluice.Task.__module__ == "sluice.tasks.task"


def test_a_factory_in_toml_trains_with_its_arguments(factories: str, tmp_path: Path) -> None:
    cfg = tmp_path / "job.toml"
    cfg.write_text(f'[task]\nfactory = "{factories}:make"\n[task.args]\nclients = 3\nhidden = 5\n'
                   '[train]\nrounds = 3\nparticipation = 1.0\n', encoding="utf-8")
    out = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 3 and summary["num_params"] == 6 * 5 + 5 + 5 * 3 + 3
    assert "factory" in (out / "config.toml").read_text()
    report = json.loads((out / "report.json").read_text())
    assert report["model"]["id"] == "hfl-make"
    state = torch.load(out / "model.pt", weights_only=True)
    assert state["state_dict"]["0.weight"].shape == (5, 6) and state["state_dict"]["0.weight"].device.type == "cpu"


def test_set_task_name_picks_a_builtin_for_run_and_local(tmp_path: Path) -> None:
    out = tmp_path / "cnn"
    assert main(["run", "--set", "task.name=digits_cnn", "--set", "train.rounds=2", "--set", "data.num_clients=4",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_params"] == num_params(load_task(load_config(None, ["task.name=digits_cnn"], HFLConfig).task,
                                                         seed=0).model())
    assert main(["local", "--set", "task.name=digits_cnn", "--set", "train.iterations=1",
                 "--out", str(tmp_path / "local")]) == 0
    local = json.loads((tmp_path / "local" / "summary.json").read_text())
    assert local["num_params"] == summary["num_params"] and local["iterations"] == 1
    assert 0 <= local["final_test_accuracy"] <= 1


@pytest.mark.parametrize(("factory", "message"), [
    ("no_such_module:make", "cannot import 'no_such_module'"),
    ("{m}:missing", "has no 'missing'"),
    ("{m}:not_a_task", "returned dict, not a sluice.Task"),
    ("{m}:wrong_features", "cannot take the samples"),
    ("{m}:labels_out_of_range", "labels from 5 to 7, but the model has 3 outputs"),
    ("{m}:vector_loss", "the loss must be a scalar"),
    ("{m}:fails", "the data directory is not mounted"),
])
def test_a_task_that_does_not_fit_is_refused_before_training(factories: str, tmp_path: Path, factory: str,
                                                             message: str, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    code = main(["run", "--set", f"task.factory={factory.format(m=factories)}", "--set", "train.rounds=2",
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in " ".join(err.split()) and "task" in err
    assert not out.exists()  # nothing half-written


def test_unknown_device_and_missing_gpu_are_configuration_errors(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    assert main(["run", "--set", "train.device=tpu", "--out", str(tmp_path / "a")]) == 2
    assert "train.device" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["run", "--set", "train.device=cuda", "--out", str(tmp_path / "b")]) == 2
        assert "no CUDA GPU" in capsys.readouterr().err
        assert not (tmp_path / "b").exists()


def test_unknown_builtin_and_both_name_and_factory_are_refused(capsys: pytest.CaptureFixture) -> None:
    assert main(["run", "--set", "task.name=imagenet"]) == 2
    assert "unknown built-in task 'imagenet'" in capsys.readouterr().err
    assert main(["run", "--set", "task.name=digits", "--set", "task.factory=a:b"]) == 2
    assert "not both" in capsys.readouterr().err


def test_run_task_in_python_writes_a_run_directory(factories: str, tmp_path: Path) -> None:
    import toy_tasks

    code = sluice.run_task(toy_tasks.make(), {"train": {"rounds": 2}, "compression": {"up": "topk"}},
                           out=tmp_path / "py")
    assert code == 0
    lines = (tmp_path / "py" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[-1])["bytes_up"] > 0
    assert json.loads((tmp_path / "py" / "report.json").read_text())["model"]["id"] == "hfl-toy"
    assert sluice.run_task(toy_tasks.make(), {"train": {"iterations": 2}}, engine="local",
                           out=tmp_path / "loc") == 0
    with pytest.raises(TaskError.__mro__[1], match="engine 'hfl' or 'local'"):
        sluice.run_task(toy_tasks.make(), engine="split")


def test_mnist_cnn_is_the_papers_cnn_on_pathological_shards() -> None:
    assert num_params(MnistCNN()) == 1_663_370
    cfg = load_config(None, ["task.name=mnist_cnn"], HFLConfig)
    task = load_task(cfg.task, seed=0, data=cfg.data)
    clients = client_datasets(task, cfg.data, seed=0)
    assert len(clients) == 100
    labels = [np.unique(ds.tensors[1].numpy()) for ds in clients]
    assert max(len(u) for u in labels) <= 2  # 2 shards of one label each
    assert tuple(clients[0].tensors[0].shape[1:]) == (1, 28, 28)


def test_kpi_sequence_model_trains_on_the_scenario_with_its_metrics() -> None:
    cfg = load_config(None, ["task.name=kpi_cnn", "task.args.scenario={cells = 4, days = 4}", "train.rounds=1",
                             "train.participation=1.0"], HFLConfig)
    eng = HFLEngine(cfg)
    ev = eng.iterate()
    assert "test_f1" in ev.metrics and ev.bytes_up > 0
    assert eng.data.model_type is not None and len(eng.data.clients) == 4
    assert any(isinstance(m, torch.nn.Conv1d) for m in eng.learner.model.modules())


def test_local_trains_a_builtin_task_from_its_config() -> None:
    from sluice.local import engine_from_config

    eng = engine_from_config(load_config(None, ["task.name=digits_cnn", "train.iterations=1"], LocalConfig))
    before = eng.evaluate()["test_accuracy"]
    ev = eng.iterate()
    assert ev.metrics["test_accuracy"] > before
    assert eng.num_layers == 5  # conv, BatchNorm, conv, BatchNorm, linear


def test_the_own_model_example_runs_as_the_readme_shows(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    example = root / "examples" / "own_model" / "cnn.py"
    assert len(example.read_text().splitlines()) <= 40
    assert "examples/own_model/cnn.py --out runs/own-cnn --rounds 60" in (root / "README.md").read_text()
    out = tmp_path / "own"
    res = subprocess.run([sys.executable, str(example), "--out", str(out), "--rounds", "60"], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]  # the target was met within 60 rounds
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] < 60 and summary["final_accuracy"] >= 0.95 and summary["total_bytes_up"] > 0
    report = json.loads((out / "report.json").read_text())
    assert report["cause"] == "CRITERION_MET" and "test_accuracy" in report["termination"]["performance"]


def test_error_messages_keep_their_brackets(capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "--host", "192.0.2.1"]) == 2  # refused before it listens: no TLS, no tokens
    assert "[auth] tokens" in capsys.readouterr().err  # printed as written, not taken for console markup


def test_a_last_batch_of_one_sample_is_left_out_where_batchnorm_needs_two() -> None:
    """A model with BatchNorm1d cannot train on a batch of one sample ("Expected more than 1 value per
    channel"): a client of 11 samples in batches of 10 ends each epoch with one; the loop leaves it out."""
    import math

    from torch import nn

    from sluice.hfl.learner import Learner
    from sluice.tasks.builtin import tabular
    from sluice.tasks.task import Task, take

    base = tabular("digits")
    task = Task(model=lambda: nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10)),
                train=base.train, test=base.test, name="bn")
    learner = Learner(task, 0, "cpu")
    delta, loss, _ = learner.fit(learner.theta0, learner.buffers0, take(base.train, range(11)), epochs=2,
                                 batch_size=10, lr=0.05, seed=0)
    assert math.isfinite(loss) and abs(delta).max() > 0
