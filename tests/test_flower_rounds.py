"""An empty round is not progress: a round of the Flower engine in which no node answered is not an iteration, is
sent again to the terminals it drew, and a few of them in a row end the run with ``ENGINE_FAILURE`` naming each node
and its last error or the round's timeout (:mod:`sluice.runtimes.flower.rounds`). The ServerApp's :class:`FlowerEngine`
and the ClientApp's handlers run in this process over the grid of tests/test_flower_clients.py, here with nodes that
stay silent or fail for a number of sendings. The same engine runs the service's federation jobs, whose configuration
carries the limit to the ServerApp."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

pytest.importorskip("flwr")

from sluice.control import ProcessHooks, TrainingProcess  # noqa: E402
from sluice.hfl import HFLEngine  # noqa: E402
from sluice.runtimes.jobs import load_job  # noqa: E402
from test_flower_clients import TINY, LocalGrid, task_identity  # noqa: E402, F401

pytestmark = pytest.mark.usefixtures("task_identity")  # a Flower message is made only within a run

FAILURE = "<class 'RuntimeError'>:<'the disk is on fire'>"


class MutedGrid(LocalGrid):
    """Training messages of the ``mute``-th pushes (0, 1, ...) get no answer (``how="silent"``) or an error reply
    (``how="error"``), as from a ClientApp that raised; hellos are answered. ``nodes`` lists the terminals that
    have a node (default: all)."""

    def __init__(self, job_json: str, terminals: int, mute: set[int] | None = None, how: str = "silent",
                 nodes: list[int] | None = None) -> None:
        super().__init__(job_json, terminals)
        for c in set(range(terminals)) - set(range(terminals) if nodes is None else nodes):
            del self.contexts[100 + c]
        self.mute, self.how, self.pushes = mute if mute is not None else set(range(10**6)), how, 0

    def push_messages(self, messages: list[Any]) -> list[str]:
        from flwr.app import Error, Message, MessageType

        if messages[0].metadata.message_type != MessageType.TRAIN or self.pushes not in self.mute:
            self.pushes += messages[0].metadata.message_type == MessageType.TRAIN
            return super().push_messages(messages)
        self.pushes += 1
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = msg.object_id
            ids.append(msg.object_id)
            if self.how == "error":
                self.replies[msg.object_id] = Message(Error(code=2, reason=FAILURE), reply_to=msg)
        return ids


def _engine(job: Any, grid: LocalGrid, timeout_s: float = 0.3, **kw: Any) -> Any:
    from sluice.runtimes.flower.engine import FlowerEngine

    return FlowerEngine(job.config, grid, round_timeout_s=timeout_s, poll_s=0.0, **kw)


def _run(engine: Any, iterations: int) -> tuple[Any, list[Any]]:
    events: list[Any] = []
    hooks = ProcessHooks(on_event=lambda e, _: events.append(e))
    report = TrainingProcess(engine, {"iterations": iterations}, hooks=hooks).run()
    return report, events


def test_empty_rounds_are_sent_again_and_are_no_iterations() -> None:
    """Two empty sendings of round 1 and two of round 2 (the limit is 3 in a row): three iterations as the
    simulator's, each round sent to the terminals it drew; the bytes of the empty sendings count."""
    job = load_job("hfl", None, [*TINY, "train.participation=0.67", "seed=3"])
    grid = MutedGrid(json.dumps(job.dump()), 3, mute={0, 1, 3, 4})
    report, events = _run(_engine(job, grid), 3)
    sim_report, sim = _run(HFLEngine(job.config), 3)
    assert report.cause.value == "CRITERION_MET" and report.iterations == 3 and grid.pushes == 7
    assert [[p.client for p in e.clients] for e in events] == [[p.client for p in e.clients] for e in sim]
    assert [e.metrics["participants"] for e in events] == [2.0, 2.0, 2.0]
    assert events[0].metrics["test_accuracy"] == sim[0].metrics["test_accuracy"]  # all resynced to θ_0
    assert events[0].bytes_down > sim[0].bytes_down and events[1].bytes_down > sim[1].bytes_down
    assert all(p.resynced for p in events[1].clients)  # they did not answer: what they hold is unknown


@pytest.mark.parametrize("how", ["silent", "error"])
def test_nodes_that_never_answer_end_the_run_with_the_cause(how: str) -> None:
    """Nodes silent past the timeout, or failing: after ``empty_rounds`` sendings of round 1, ENGINE_FAILURE
    (exit 9) with no iteration and a cause naming every node and why. Failing nodes end each sending at once."""
    job = load_job("hfl", None, [*TINY, "train.participation=1.0"])
    grid = MutedGrid(json.dumps(job.dump()), 3, how=how)
    timeout = 0.3 if how == "silent" else 60.0
    t0 = time.monotonic()
    report, events = _run(_engine(job, grid, timeout, empty_rounds=2), 5)
    assert time.monotonic() - t0 < 60.0
    assert (report.cause.value, report.exit_code, report.iterations, events) == ("ENGINE_FAILURE", 9, 0, [])
    assert grid.pushes == 2
    detail = report.detail
    assert "no node answered in 2 rounds in a row" in detail and "--round-timeout" in detail, detail
    why = FAILURE if how == "error" else "no answer within 0.3 s"
    for c in range(3):
        assert f"terminal {c}: node {100 + c}: {why}" in detail, detail


def test_an_empty_streak_ends_only_in_a_row() -> None:
    """A round answered between empty ones starts the count again; the limit of 1 ends the run at the first."""
    job = load_job("hfl", None, [*TINY, "train.participation=1.0"])
    report, _ = _run(_engine(job, MutedGrid(json.dumps(job.dump()), 3, mute={0, 2, 4}), empty_rounds=2), 3)
    assert report.cause.value == "CRITERION_MET" and report.iterations == 3
    report, _ = _run(_engine(job, MutedGrid(json.dumps(job.dump()), 3, mute={1}), empty_rounds=1), 3)
    assert report.cause.value == "ENGINE_FAILURE" and report.iterations == 1
    assert "round 2 sent 1 times" in report.detail


def test_terminals_without_a_node_drop_out_without_emptying_the_round() -> None:
    """Two nodes for three terminals: a round that draws only the third closes with it dropped, as a simulated
    failure does in the simulator; it is no empty round."""
    job = load_job("hfl", None, [*TINY, "train.participation=0.34", "seed=1"])
    grid = MutedGrid(json.dumps(job.dump()), 3, mute=set(), nodes=[0, 1])
    report, events = _run(_engine(job, grid, min_nodes=2, empty_rounds=1), 6)
    assert report.cause.value == "CRITERION_MET" and report.iterations == 6
    alone = [e for e in events if [p.client for p in e.clients] == [2]]
    assert alone and all(e.metrics["participants"] == 0 and e.clients[0].dropped for e in alone)


def test_the_first_round_waits_for_the_start_up_the_nodes_measured(monkeypatch) -> None:
    """The hello reply carries the ClientApp's start-up; the first sending of the first round waits that much
    longer, up to half the round timeout, the later ones the timeout."""
    from sluice.runtimes.flower import app

    monkeypatch.setattr(app, "_startup_seconds", lambda: 4.0)
    job = load_job("hfl", None, [*TINY, "train.participation=1.0"])
    engine = _engine(job, MutedGrid(json.dumps(job.dump()), 3, mute=set()), 10.0)
    engine.start()
    assert engine.silence.startup == {100: 4.0, 101: 4.0, 102: 4.0}
    engine.iterate()
    assert engine.silence.deadline([100]) == 10.0
    slow = _engine(job, MutedGrid(json.dumps(job.dump()), 3, mute=set()), 6.0)
    slow.start()
    assert slow.silence.deadline([100, 101]) == 9.0 and slow.silence.deadline([100]) == 6.0


def test_the_limit_reaches_the_serverapp_from_sluice_run_and_from_a_federation() -> None:
    from sluice.errors import ConfigError
    from sluice.runtimes.flower import app
    from sluice.runtimes.flower import protocol as P
    from sluice.runtimes.flower.engine import FlowerEngine
    from sluice.runtimes.flower.relay import FederationConfig
    from sluice.runtimes.flower.runner import FlowerOptions

    fed = FederationConfig(superlink="127.0.0.1:9092", insecure=True)
    assert fed.run_config()["empty-rounds"] == P.RUN_CONFIG_DEFAULTS["empty-rounds"] == 3
    assert FederationConfig(superlink="h:1", insecure=True, empty_rounds=5).run_config()["empty-rounds"] == 5
    with pytest.raises(ValueError, match="empty_rounds"):
        FederationConfig(superlink="h:1", insecure=True, empty_rounds=0)
    assert FlowerOptions(empty_rounds=4).run_config()["empty-rounds"] == 4
    job = load_job("hfl", None, TINY)
    engine = app._engine(job, None, {**P.RUN_CONFIG_DEFAULTS, "empty-rounds": 7})
    assert engine.silence.limit == 7
    with pytest.raises(ConfigError, match="empty rounds"):
        FlowerEngine(job.config, None, empty_rounds=0)


def test_a_federation_job_whose_nodes_never_answer_fails_with_the_cause(tmp_path) -> None:
    """The service's federation jobs: the ServerApp builds the engine from the federation's run configuration and
    trains under the service's worker protocol (:func:`sluice.runtimes.remote.run_steered`); the process ends
    ENGINE_FAILURE after ``empty_rounds`` empty rounds, the cause in its report."""
    import multiprocessing
    import threading

    from sluice.runtimes.flower import app
    from sluice.runtimes.flower import protocol as P
    from sluice.runtimes.flower.relay import FederationConfig
    from sluice.runtimes.remote import run_steered

    job = load_job("hfl", None, [*TINY, "train.participation=1.0"])
    fed = FederationConfig(superlink="127.0.0.1:9092", insecure=True, nodes=3, round_timeout_s=0.3, empty_rounds=2)
    engine = app._engine(job, MutedGrid(json.dumps(job.dump()), 3, how="error"),
                         {**P.RUN_CONFIG_DEFAULTS, **fed.run_config(), "poll-interval": 0.0})
    spec = {"process": "P", "kind": "hfl", "raw": job.dump(), "termination": {"iterations": 3},
            "requirements": None, "uploads": [], "work_dir": str(tmp_path)}
    parent, child = multiprocessing.Pipe()
    worker = threading.Thread(target=run_steered, args=(spec, child, engine), daemon=True)
    worker.start()
    msg: dict[str, Any] = {}
    while msg.get("kind") not in ("done", "failed", "refused"):
        assert parent.poll(60), "no word from the worker within 60 s"
        msg = parent.recv()
    worker.join(60)
    assert msg["kind"] == "done", msg
    report = msg["report"]
    assert (report["cause"], report["iterations"]) == ("ENGINE_FAILURE", 0)
    assert "no node answered in 2 rounds in a row" in report["detail"] and FAILURE in report["detail"]


def test_a_run_whose_nodes_never_answer_the_hello_ends_with_a_report(tmp_path) -> None:
    """No node answers before ``node-wait``: the ServerApp writes an ENGINE_FAILURE report (``sluice run`` exits 9
    with it) instead of only an error file."""
    from flwr.app import Context, RecordDict

    from sluice.runtimes.flower import app

    job = load_job("hfl", None, TINY)
    doc = json.dumps(job.dump())
    rc = {"sluice-job": doc, "out-dir": str(tmp_path / "run"), "node-wait": 0.5, "round-timeout": 0.3,
          "poll-interval": 0.0}
    app.main(MutedGrid(doc, 3, nodes=[]), Context(1, 0, {}, RecordDict(), rc))
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert (report["cause"], report["iterations"]) == ("ENGINE_FAILURE", 0)
    assert report["detail"].startswith("the engine could not start: 0 of the 3 nodes needed answered within 0.5 s")
    assert not (tmp_path / "run" / "flower" / "server-error.txt").exists()
