"""The Flower engine's per-client reports equal the simulator's: the ServerApp's :class:`FlowerEngine` and the
ClientApp's handlers, in this process, over a grid that hands each message to its node's handler (no
SuperLink, no SuperNode: the deployment itself is tested in tests/test_flower_deploy.py). A node that does
not answer drops out of its round and rejoins with a dense resynchronisation, in its report too."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

pytest.importorskip("flwr")

from sluice.control import ProcessHooks, TrainingProcess  # noqa: E402
from sluice.hfl import HFLEngine  # noqa: E402
from sluice.runtimes.jobs import load_job  # noqa: E402

TINY = ["data.num_clients=3", "model.hidden=[16]", "train.local_epochs=1"]


class LocalGrid:
    """A Flower ``Grid`` whose nodes are the ClientApp's handlers, called when a message is pushed, each with
    its node's own context. ``silent`` holds the (round, terminal) pairs whose message gets no answer."""

    def __init__(self, job_json: str, terminals: int, silent: set[tuple[int, int]] = frozenset()) -> None:
        from flwr.app import Context, RecordDict

        self.contexts = {100 + c: Context(1, 100 + c, {"partition-id": c}, RecordDict(), {"sluice-job": job_json})
                         for c in range(terminals)}
        self.silent = set(silent)
        self.replies: dict[str, Any] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def push_messages(self, messages: list[Any]) -> list[str]:
        from flwr.app import MessageType

        from sluice.runtimes.flower import app
        from sluice.runtimes.flower import protocol as P

        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = msg.object_id  # as the SuperLink sets it
            ids.append(msg.object_id)
            meta = msg.content.config_records[P.META]
            if msg.metadata.message_type == MessageType.TRAIN and (int(meta["round"]), int(meta["terminal"])) \
                    in self.silent:
                continue
            handler = app.hello if msg.metadata.message_type == MessageType.QUERY else app.train
            self.replies[msg.object_id] = handler(msg, self.contexts[msg.metadata.dst_node_id])
        return ids

    def pull_messages(self, ids: list[str]) -> list[Any]:
        return [self.replies.pop(i) for i in ids if i in self.replies]


@pytest.fixture
def task_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a Flower process knows of itself (a message is made only within a run)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name in ("_run_id", "_task_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, name, 1)


def _parts(events: list[Any]) -> list[list[tuple]]:
    return [[(p.client, p.samples, p.dropped, p.resynced, p.metrics) for p in e.clients] for e in events]


def _reports(report: Any) -> list[dict[str, Any]]:
    times = {"training_s", "started_at", "ended_at"}
    return [{k: v for k, v in c.model_dump().items() if k not in times} for c in report.clients]


def test_flower_gives_the_simulators_per_client_reports(task_identity: None) -> None:
    from sluice.runtimes.flower.engine import FlowerEngine

    job = load_job("hfl", None, [*TINY, "train.participation=0.67", "train.dropout=0.3", "seed=5"])
    grid = LocalGrid(json.dumps(job.dump()), 3)
    runs = []
    for engine in (HFLEngine(job.config), FlowerEngine(job.config, grid, round_timeout_s=5.0, poll_s=0.0)):
        events: list[Any] = []
        hooks = ProcessHooks(on_event=lambda e, _, ev=events: ev.append(e))
        report = TrainingProcess(engine, {"iterations": 4}, hooks=hooks).run()
        runs.append((events, report))
    (sim_events, sim), (fl_events, fl) = runs
    assert _parts(fl_events) == _parts(sim_events)
    for key in ("test_accuracy", "train_loss", "participants", "dropped"):
        assert [e.metrics[key] for e in fl_events] == [e.metrics[key] for e in sim_events], key
    assert [(e.bytes_up, e.bytes_down) for e in fl_events] == [(e.bytes_up, e.bytes_down) for e in sim_events]
    assert _reports(fl) == _reports(sim)
    assert sum(c.dropped for c in fl.clients) > 0  # the simulated failures
    assert all(c.training_s > 0 and c.started_at for c in fl.clients if c.rounds)  # timed on the node


def test_a_node_that_does_not_answer_drops_out_and_rejoins(task_identity: None) -> None:
    from sluice.runtimes.flower.engine import FlowerEngine

    job = load_job("hfl", None, [*TINY, "train.participation=1.0"])
    grid = LocalGrid(json.dumps(job.dump()), 3, silent={(2, 1)})
    events: list[Any] = []
    report = TrainingProcess(FlowerEngine(job.config, grid, round_timeout_s=0.5, poll_s=0.0), {"iterations": 3},
                             hooks=ProcessHooks(on_event=lambda e, _: events.append(e))).run()
    assert [[(p.client, p.dropped, p.resynced) for p in e.clients] for e in events] == [
        [(0, False, False), (1, False, False), (2, False, False)],
        [(0, False, False), (1, True, False), (2, False, False)],
        [(0, False, False), (1, False, True), (2, False, False)],
    ]
    c1 = report.clients[1]
    assert (c1.rounds, c1.dropped, c1.resynced, c1.last_round) == (2, 1, 1, 3)
    assert [(c.rounds, c.dropped) for c in report.clients] == [(3, 0), (2, 1), (3, 0)]


def test_a_restored_engine_goes_on_from_the_checkpoint_with_every_node_resynchronised(task_identity: None) -> None:
    """A checkpoint restored in a later Flower run (new nodes, empty contexts): the server goes on where it was,
    samples as the uninterrupted run does, and sends every terminal a dense resynchronisation first."""
    from sluice.runtimes.flower.engine import FlowerEngine

    job = load_job("hfl", None, [*TINY, "train.participation=0.67", "seed=2"])
    doc = json.dumps(job.dump())
    whole = FlowerEngine(job.config, LocalGrid(doc, 3), round_timeout_s=5.0, poll_s=0.0)
    first = FlowerEngine(job.config, LocalGrid(doc, 3), round_timeout_s=5.0, poll_s=0.0)
    ahead = [whole.iterate() for _ in range(3)]
    [first.iterate() for _ in range(2)]
    buf = first.checkpoint()
    later = FlowerEngine(job.config, LocalGrid(doc, 3), round_timeout_s=5.0, poll_s=0.0)
    later.restore(buf)
    later.start()
    assert np.array_equal(later.server.params, first.server.params) and later.server.round == 2
    ev = later.iterate()
    assert [p.client for p in ev.clients] == [p.client for p in ahead[2].clients]  # the same sampling
    assert all(p.resynced and not p.dropped for p in ev.clients)
    assert ev.bytes_down > ahead[2].bytes_down  # dense messages, counted
    # the nodes' own state (compressor residuals) starts afresh; the model goes on as the uninterrupted run's
    assert ev.metrics["test_accuracy"] == pytest.approx(ahead[2].metrics["test_accuracy"], abs=0.05)
    with pytest.raises(Exception, match="hfl-flower"):
        later.restore(HFLEngine(job.config).checkpoint())


def test_data_for_a_flower_run_is_refused_with_the_reason() -> None:
    """The data loop cannot feed a federation: the nodes hold the data (the service answers the upload with this)."""
    from sluice.errors import DataError
    from sluice.runtimes.flower.engine import FlowerEngine

    engine = FlowerEngine(load_job("hfl", None, TINY).config, grid=None)
    for call in (engine.check_data, engine.add_data):
        with pytest.raises(DataError, match="training data lives on the nodes"):
            call((0, np.zeros((2, 64), np.float32), np.zeros(2, np.int64)))
