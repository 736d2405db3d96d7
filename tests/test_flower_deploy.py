"""Sluice on Flower's deployment engine: real SuperLink and SuperNode processes on 127.0.0.1 with TLS.

One 3-node deployment serves the run compared with the simulator (same numbers, round by round) and the
fault run (a node killed mid-run is dropped, its restarted node is resynchronised with a dense message), both
with server momentum replayed by the nodes (and, in the first, uploads sized by the terminals' weights). Every
process started here is stopped in a finalizer. ``sluice run --runtime flower``, which starts its own
deployment, is tested in tests/test_flower_run.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from sluice.runtimes.flower.deploy import LocalDeployment, submit
from sluice.runtimes.jobs import load_job

pytestmark = [pytest.mark.flower, pytest.mark.slow, pytest.mark.timeout(480)]

TINY = ["data.num_clients=3", "train.participation=1.0", "model.hidden=[32]", "train.local_epochs=1"]
REPLAYED = ["compression.momentum=0.9", "compression.momentum_replay=0.4"]


def _wait_rows(out: Path, n: int, timeout_s: float) -> list[dict]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        rows = []
        if (out / "metrics.jsonl").exists():
            rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
        if len(rows) >= n or (out / "report.json").exists():
            return rows
        err = out / "flower" / "server-error.txt"
        assert not err.exists(), err.read_text()
        time.sleep(0.25)
    raise AssertionError(f"{out}: fewer than {n} rounds after {timeout_s} s")


def _wait_report(out: Path, timeout_s: float) -> dict:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if (out / "report.json").exists():  # written whole (a rename), after every row of metrics.jsonl
            return json.loads((out / "report.json").read_text())
        err = out / "flower" / "server-error.txt"
        assert not err.exists(), err.read_text()
        time.sleep(0.25)
    raise AssertionError(f"{out}: no report after {timeout_s} s")


def _wait_file(path: Path, timeout_s: float) -> None:
    """Until ``path`` exists: what the ServerApp writes after the report (the plot) comes a moment later."""
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < end, f"no {path} after {timeout_s} s"
        time.sleep(0.1)


def _wait_log(path: Path, offset: int, text: str, count: int, timeout_s: float) -> None:
    """Until ``text`` appears ``count`` times in what a process logged to ``path`` after byte ``offset``."""
    end = time.monotonic() + timeout_s
    while path.read_bytes()[offset:].decode("utf-8", "replace").count(text) < count:
        assert time.monotonic() < end, f"{path}: {text!r} not {count} times after {timeout_s} s"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory):
    dep = LocalDeployment(tmp_path_factory.mktemp("flower") / "dep", nodes=3, tls=True)
    try:
        dep.start()
        yield dep
    finally:
        dep.stop()
    assert all(p.poll() is not None for p in dep.procs.values())


def _submit(dep: LocalDeployment, job, out: Path, **run_config) -> None:
    work = out.parent / (out.name + "-work")
    work.mkdir(parents=True)
    # the ServerApp asks for replies every 0.25 s (not 0.05): a round takes seconds, and the polls cost CPU that
    # the nodes' ClientApp processes need on a busy machine
    submit(job.dump(), out, work, dep.home, run_config={"min-nodes": 3, "poll-interval": 0.25, **run_config})


def test_three_tls_nodes_give_the_simulators_numbers(deployment: LocalDeployment, tmp_path: Path) -> None:
    from sluice.hfl import HFLEngine

    assert deployment.certs is not None and deployment.certs.ca.exists()  # TLS: the nodes verify the link
    # with server momentum, which the nodes replay on the output layer from the velocity in their context, and
    # uploads sized by the terminals' weights, which the server sends with each message
    # two rounds: the first from the initial model and the sizes the server expects, the second from the state
    # each node kept in its context (replayed velocity, compressor state) and the sample counts the nodes reported
    job = load_job("hfl", None, [*TINY, "train.rounds=2", *REPLAYED, "compression.up_by_weight=0.5"])
    out = tmp_path / "run"
    _submit(deployment, job, out, **{"round-timeout": 120.0})
    report = _wait_report(out, 420)
    rows = _wait_rows(out, 2, 5)
    assert report["cause"] == "CRITERION_MET" and report["iterations"] == 2, report
    assert [r["round"] for r in rows] == [1, 2]

    sim = HFLEngine(job.config)
    for row in rows:
        ev = sim.iterate()
        assert row["dropped"] == 0 and row["participants"] == 3
        assert row["bytes_up"] == ev.bytes_up and row["bytes_down"] == ev.bytes_down, row["round"]
        for key in ("test_accuracy", "test_loss", "train_loss", "test_f1"):
            assert row[key] == ev.metrics[key], (row["round"], key)
        # Flower's own serialisation of the same messages is counted beside Sluice's bytes, and is larger
        assert row["flower_bytes_up"] > row["bytes_up"] and row["flower_bytes_down"] > row["bytes_down"]
    _wait_file(out / "accuracy_vs_round.png", 60)
    assert (out / "status.json").exists()
    assert report["bytes_up"] == sum(r["bytes_up"] for r in rows)
    # the same model as the simulator's, bit for bit
    import torch

    saved = torch.load(out / "model.pt")["params"].numpy()
    assert np.array_equal(saved, sim.params)


@pytest.mark.timeout(480)
def test_killed_node_is_dropped_and_its_restarted_node_resynchronised(deployment: LocalDeployment,
                                                                      tmp_path: Path) -> None:
    job = load_job("hfl", None, [*TINY, "train.rounds=3", *REPLAYED])
    out = tmp_path / "faults"
    # round 2 lasts the whole round timeout (the killed node never answers); the live nodes must answer within
    # it on a loaded machine too (each message starts a fresh ClientApp process: seconds of imports per node)
    live = deployment.logs / "node-0.log"
    start = live.stat().st_size
    _submit(deployment, job, out, **{"round-timeout": 60.0})
    _wait_rows(out, 1, 200)
    deployment.kill_node(2)  # its message of round 2 gets no answer
    # the new node for terminal 2 must come after round 2's messages went out (or round 2 would find it and
    # send it terminal 2's message) and before round 3's: the live node 0 receiving its second train message
    # of this run says round 2's are out, and round 2 then lasts its whole timeout
    _wait_log(live, start, "Receiving: train message", 2, 120)
    deployment.start_node(2)  # a new node, empty state, for terminal 2: found before round 3
    report = _wait_report(out, 300)
    rows = _wait_rows(out, 3, 5)
    assert report["cause"] == "CRITERION_MET" and report["iterations"] == 3, report
    r1, r2, r3 = rows
    assert r1["dropped"] == 0 and r1["participants"] == 3
    assert r2["dropped"] == 1 and r2["participants"] == 2  # the killed node's terminal, and the run went on
    assert r3["resynced"] == 1 and r3["participants"] == 3 and r3["dropped"] == 0
    d = job.config.model.hidden[0] * 65 + 10 * 33  # 64 features → 32 → 10 classes
    assert r3["bytes_down"] >= 4 * d > r1["bytes_down"]  # the dense resync message (and velocity) is counted
