"""``sluice run --runtime flower`` for a newcomer: each local node takes its own settings (``--node-arg``), a missing
Flower executable is named in the error, and nodes that never answer end the run with ``ENGINE_FAILURE`` (exit 9)
within ``--empty-rounds`` + 1 round timeouts, the cause naming them (:mod:`sluice.runtimes.flower.rounds`).

The last two start real SuperLink and SuperNode processes on 127.0.0.1 (marked ``flower``); every process they
start is stopped, and the end-to-end run checks that none is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from sluice.runtimes.flower import deploy
from sluice.runtimes.flower.deploy import DeploymentError, LocalDeployment
from sluice.runtimes.flower.runner import FlowerOptions, node_args, run_on_flower
from sluice.runtimes.jobs import load_job
from test_flower_run import _flower_processes_of

TINY = ["data.num_clients=2", "train.participation=1.0", "model.hidden=[16]", "train.local_epochs=1"]


def test_node_args_give_each_node_its_own_settings(tmp_path: Path) -> None:
    got = node_args(["data_dir=/data/site-{c}", "1:scale=2.5", "verbose=true", "0:data_dir=/elsewhere"], 2)
    assert got == {0: {"data_dir": "/elsewhere", "verbose": True}, 1: {"data_dir": "/data/site-1", "scale": 2.5,
                                                                       "verbose": True}}
    for bad, why in (("data_dir", "expects"), ("x:a=1", "expects"), ("2:a=1", "not one of the 2"),
                     ("a=[1, 2]", "string, number or boolean")):
        with pytest.raises(DeploymentError, match=why):
            node_args([bad], 2)
    dep = LocalDeployment(tmp_path, nodes=2, tls=False, node_args=got)
    argv: list[list[str]] = []
    dep._spawn = lambda name, args: argv.append(args)  # type: ignore[method-assign]
    dep.start_node(1)
    config = argv[0][argv[0].index("--node-config") + 1]
    assert config == 'partition-id=1 num-partitions=2 task.data_dir="/data/site-1" task.scale=2.5 task.verbose=true'


def test_node_args_apply_to_the_nodes_sluice_run_starts(tmp_path: Path) -> None:
    from sluice.cli import main

    assert main(["run", "--node-arg", "data_dir=/x", "--out", str(tmp_path / "a")]) == 2  # the simulator: refused
    job = load_job("hfl", None, TINY)
    with pytest.raises(DeploymentError, match="--node-config 'task.NAME=VALUE'"):
        run_on_flower(job, str(tmp_path / "b"), FlowerOptions(superlink="127.0.0.1:9", insecure=True,
                                                              node_args=["data_dir=/x"]), console=Console())
    with pytest.raises(DeploymentError, match="--empty-rounds must be at least 1"):
        run_on_flower(job, str(tmp_path / "c"), FlowerOptions(empty_rounds=0), console=Console())
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_a_flower_executable_missing_from_the_environment_is_named(tmp_path: Path, monkeypatch) -> None:
    """Flower's processes start ``flower-superexec`` by name: missing beside this Python, the run says so before
    starting anything."""
    here = Path(sys.executable).parent
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for exe in here.iterdir():
        if exe.name != "flower-superexec":
            (bin_dir / exe.name).symlink_to(exe)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    with pytest.raises(DeploymentError, match="flower-superexec not found next to .*start it by name"):
        run_on_flower(load_job("hfl", None, TINY), str(tmp_path / "run"), FlowerOptions(), console=Console())


def test_a_run_on_a_superlink_elsewhere_exits_with_its_reports_status(tmp_path: Path, monkeypatch, capsys) -> None:
    """The report of a run submitted to a SuperLink elsewhere stays on that host; ``sluice run`` exits with the
    status the ServerApp prints at the end of the run's log (9 for nodes that never answered), not 0 because Flower
    saw its ServerApp return."""
    from sluice.runtimes.flower import runner

    flwr = tmp_path / "flwr"
    flwr.write_text("#!/bin/sh\necho 'round 1: no node answered'\necho 'sluice: training finished, exit status 9'\n")
    flwr.chmod(0o755)
    monkeypatch.setattr(runner, "_bin", lambda name: str(flwr))
    assert runner.stream_log(tmp_path, 7) == 9
    assert "no node answered" in capsys.readouterr().out
    flwr.write_text("#!/bin/sh\necho 'the run was stopped'\n")
    assert runner.stream_log(tmp_path, 7) is None


@pytest.mark.flower
@pytest.mark.timeout(120)
def test_a_superlink_that_cannot_start_its_executor_is_named(tmp_path: Path, monkeypatch) -> None:
    """A SuperLink whose PATH lacks its environment's bin directory exits on ``flower-superexec`` not found:
    ``sluice run`` names it instead of only Flower's "Connection to the SuperLink is unavailable"."""
    real_env = deploy.flower_env

    def without_bin(home: Path) -> dict[str, str]:
        env = real_env(home)
        env["PATH"] = "/usr/bin:/bin"
        return env

    monkeypatch.setattr(deploy, "flower_env", without_bin)
    with pytest.raises(DeploymentError) as err:
        run_on_flower(load_job("hfl", None, TINY), str(tmp_path / "run"), FlowerOptions(insecure=True),
                      console=Console())
    assert "'flower-superexec'" in str(err.value) and "first on PATH" in str(err.value), err.value


@pytest.mark.flower
def test_flwr_run_against_no_superlink_says_what_to_check(tmp_path: Path) -> None:
    deploy.write_connection(tmp_path / "home", "sluice", f"127.0.0.1:{deploy.free_port()}", None)
    with pytest.raises(DeploymentError, match="No SuperLink answers there.*flower-superexec"):
        deploy.submit({}, tmp_path / "run", tmp_path, tmp_path / "home", timeout_s=60)


STALLING = '''
import threading
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

import sluice


def task(data_dir=None, mode="train"):
    """The node's own file (data_dir); mode="stall": its ClientApp never ends a training message."""
    def load(path):
        z = np.load(path)
        return TensorDataset(torch.from_numpy(z["X"]), torch.from_numpy(z["y"]))

    def optimizer(params, lr):
        if mode == "stall":
            threading.Event().wait()
        return torch.optim.SGD(params, lr=lr)

    return sluice.Task(model=lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)),
                       train=[load(Path(data_dir) / "train.npz")] if data_dir else [],
                       test=load(Path(__file__).parent / "test.npz"), optimizer=optimizer, name="stalling")
'''


def _files(root: Path) -> None:
    rng = np.random.default_rng(0)
    (root / "stalling.py").write_text(textwrap.dedent(STALLING), encoding="utf-8")
    for where, n in (("test.npz", 30), ("node-0/train.npz", 20), ("node-1/train.npz", 25)):
        X = rng.normal(size=(n, 4)).astype(np.float32)
        (root / where).parent.mkdir(exist_ok=True)
        np.savez(root / where, X=X, y=(X[:, 0] > 0).astype(np.int64))


def _until(path: Path, proc: subprocess.Popen, limit_s: float) -> float:
    """When ``path`` appeared (time.monotonic()), waiting at most ``limit_s`` while ``proc`` runs."""
    end = time.monotonic() + limit_s
    while not path.exists():
        assert proc.poll() is None or path.exists(), f"sluice run ended (status {proc.returncode}) before {path}"
        assert time.monotonic() < end, f"no {path} after {limit_s} s"
        time.sleep(0.05)
    return time.monotonic()


@pytest.mark.flower
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_nodes_that_never_answer_end_the_run_with_exit_9_and_the_cause(tmp_path: Path) -> None:
    """Two nodes, each on its own file (``--node-arg``), whose ClientApps never answer a training message: the
    run ends ENGINE_FAILURE (exit 9) with no iteration, within (N + 1) round timeouts of its first round, the
    cause naming both nodes and the timeout; no Flower process is left."""
    timeout_s, empty = 6.0, 2
    _files(tmp_path)
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "sluice", "run", "--runtime", "flower", "--insecure", "--out", str(out),
            "--round-timeout", str(timeout_s), "--empty-rounds", str(empty),
            "--node-arg", f"data_dir={tmp_path}/node-{{c}}", "--node-arg", 'mode="stall"',
            *[x for kv in [*TINY, "task.factory=stalling:task", "train.rounds=4"] for x in ("--set", kv)]]
    env = {**os.environ, "COLUMNS": "160",
           "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        training = _until(out / "status.json", proc, 180)  # written as the first round starts
        ended = _until(out / "report.json", proc, (empty + 1) * timeout_s + 30)
        text, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        for p in _flower_processes_of(out / "flower" / "flwr-home"):
            p.kill()
    print(f"time to failure from the first round: {ended - training:.1f} s")
    assert proc.returncode == 9, text[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert (report["cause"], report["iterations"]) == ("ENGINE_FAILURE", 0), report
    # N round deadlines (the first allowing for the ClientApps' start-up, at most half a timeout more) and Flower's
    # polls: well under N + 1 timeouts on an idle machine; the slack keeps a loaded one from failing a run that
    # ended by itself, while a run that waited for the default 60 s round timeout still fails
    assert ended - training < (empty + 1) * timeout_s + 30, ended - training
    detail = report["detail"]
    assert f"no node answered in {empty} rounds in a row" in detail and "--round-timeout" in detail, detail
    for c in range(2):
        assert f"terminal {c}: node " in detail
    assert detail.count(f"no answer within {timeout_s:g} s") == 2, detail
    assert _flower_processes_of(out / "flower" / "flwr-home") == []
