"""``sluice run --runtime flower-sim``: the Sluice ServerApp and ClientApp on Flower's Simulation Engine (a local
SuperLink started ``--simulation``, Ray with 2 CPUs and no dashboard) give the simulator's numbers round by round,
and the run leaves no process behind (Ray's included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from sluice.hfl import HFLEngine
from sluice.runtimes.flower.failure import records_of
from sluice.runtimes.jobs import load_job
from test_flower_run import _flower_processes_of

pytest.importorskip("ray", reason="Flower's Simulation Engine needs sluice[flower] (flwr[simulation])")

JOB = ["data.num_clients=3", "train.participation=1.0", "model.hidden=[32]", "train.local_epochs=1", "train.rounds=3",
       "compression.up_by_weight=0.5"]


def _gone(home: Path, wait_s: float) -> list[psutil.Process]:
    end = time.monotonic() + wait_s
    while (left := _flower_processes_of(home)) and time.monotonic() < end:
        time.sleep(0.5)
    return left


@pytest.mark.flower
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_simulation_engine_gives_the_simulators_numbers(tmp_path: Path) -> None:
    out = tmp_path / "run"
    home = out / "flower" / "flwr-home"
    argv = [sys.executable, "-m", "sluice", "run", "--runtime", "flower-sim", "--ray-cpus", "2", "--round-timeout",
            "300", "--out", str(out), *[x for kv in JOB for x in ("--set", kv)]]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**env, "COLUMNS": "160"}, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=780)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        left = _gone(home, 60)
        for p in left:
            p.kill()
    assert proc.returncode == 0, text[-4000:]
    assert left == [], [p.pid for p in left]  # the SuperLink, the simulation and Ray stopped by themselves
    report = json.loads((out / "report.json").read_text())
    assert report["iterations"] == 3, report
    rows = records_of(out)
    assert [r["round"] for r in rows] == [1, 2, 3]

    job = load_job("hfl", None, JOB)
    sim = HFLEngine(job.config)
    for row in rows:
        ev = sim.iterate()
        assert row["dropped"] == 0 and row["participants"] == 3
        assert (row["bytes_up"], row["bytes_down"]) == (ev.bytes_up, ev.bytes_down), row["round"]
        for key in ("test_accuracy", "test_loss", "train_loss"):
            assert row[key] == ev.metrics[key], (row["round"], key)
    assert report["bytes_up"] == sum(r["bytes_up"] for r in rows)
    assert report["bytes_down"] == sum(r["bytes_down"] for r in rows)
    assert np.array_equal(torch.load(out / "model.pt")["params"].numpy(), sim.params)  # the same model, bit for bit


def test_simulation_options(monkeypatch, tmp_path: Path) -> None:
    from rich.console import Console

    from sluice.runtimes.flower.runner import DeploymentError, FlowerOptions, run_on_flower

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    opts = FlowerOptions(simulation=True, ray_cpus=2)
    assert opts.federation_config(3) == {"num-supernodes": 3, "client-resources-num-cpus": 1,
                                         "init-args-num-cpus": 2}
    assert "init-args-num-cpus" not in FlowerOptions(simulation=True).federation_config(3)  # Ray's own default
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a cluster has its own CPUs
    with pytest.raises(DeploymentError, match="RAY_ADDRESS"):
        opts.federation_config(3)
    assert FlowerOptions(simulation=True).federation_config(5)["num-supernodes"] == 5
    job = load_job("hfl", None, JOB)
    for wrong in ({"superlink": "127.0.0.1:9093"}, {"node_args": ["data_dir=/x"]}):
        with pytest.raises(DeploymentError, match="flower-sim"):
            run_on_flower(job, str(tmp_path / "run"), FlowerOptions(simulation=True, **wrong), console=Console())


def test_ray_cpus_needs_the_simulation_engine(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "sluice", "run", "--ray-cpus", "2", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--ray-cpus only applies with --runtime flower-sim" in done.stderr, done.stderr


def test_node_wait_needs_a_flower_runtime(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "sluice", "run", "--node-wait", "600", "--out", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--node-wait only apply with --runtime flower or flower-sim" in done.stderr, \
        done.stderr
