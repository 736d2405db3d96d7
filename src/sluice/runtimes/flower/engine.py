"""The server loop of horizontal FL on Flower's deployment engine, as a Sluice engine (one round per iteration).

:class:`FlowerEngine` drives the same :class:`sluice.hfl.Server` the simulator drives and samples terminals
the same way (``numpy.random.default_rng(seed)``: ``choice`` of ``m = max(1, round(q·n))`` terminals, then
``m`` uniform draws for simulated failures), so a deployment whose nodes all answer gives, round by round,
the accuracy and the Sluice bytes of ``sluice run``. Only the transport differs: each sampled terminal's
downlink message goes to the Flower node whose ``partition-id`` is that terminal, in its own Flower
message, and the uploads come back as replies (:mod:`sluice.runtimes.flower.protocol`). With
``compression.up_by_weight`` the k/d of each upload follows the sample counts the nodes report (those of
the server's copy of the partition until a node has answered).

Faults:

* a node that does not answer within ``round_timeout_s`` (killed, stalled) or answers with an error counts
  as dropped in that round (``dropped``); the round closes with the uploads that arrived. Its next message
  is a dense resynchronisation, since the server cannot know what it applied;
* a round in which no node answered at all (each silent or failing, or no node left) is *empty*: not an
  iteration, it is sent again to the same terminals, and ``empty_rounds`` of them in a row end the run with a
  :class:`sluice.errors.TrainingError` (``ENGINE_FAILURE``) naming each node and its last error or the
  round's timeout. The first round's first sending waits longer by the ClientApp start-up the nodes
  measured, up to half the timeout (:mod:`sluice.runtimes.flower.rounds`);
* a node the server has not seen yet is asked which terminal it serves and which rounds of the model and
  anchor it holds; a node that holds other rounds than the server sent (it restarted with an empty state)
  gets a dense message (and, in anchor mode, the dense anchor) the next time its terminal is sampled. Those
  bytes are counted, and ``resynced`` counts such messages per round;
* every call to the SuperLink has ``link_timeout_s``: a SuperLink that is gone ends the round with a
  :class:`sluice.errors.TrainingError` (the control plane reports ``ENGINE_FAILURE``) instead of the
  Flower client's endless retries.

Each round's event lists every sampled terminal's part (:class:`sluice.engine.ClientRound`), as the
simulator's: samples and train loss from its reply, the local training time its node measured, ``dropped``
for a terminal that uploaded nothing (a simulated failure, no answer, no node) and ``resynced`` when its
message was a dense resynchronisation.

Bytes: ``bytes_up``/``bytes_down`` are Sluice's, ``len()`` of the encoded messages, counted like the
simulator (a message sent to a terminal that then fails counts; an anchor broadcast counts once per
terminal in the round it is made, and travels with the terminal's next message). The metrics
``flower_bytes_up``/``flower_bytes_down`` add what Flower serialises for the same messages (its message,
record and array objects, as pushed to and pulled from the SuperLink), to show Flower's framing beside
Sluice's payload.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from sluice.engine import ClientRound, Suspendable
from sluice.errors import ConfigError, DataError, TaskError
from sluice.hfl.config import HFLConfig
from sluice.hfl.learner import Learner
from sluice.hfl.rounds import Exchanged, ServerModel, client_metrics
from sluice.hfl.server import Server
from sluice.metrics import MetricSpec
from sluice.runtimes.flower import protocol as P
from sluice.runtimes.flower.nodes import Link, Nodes
from sluice.runtimes.flower.rounds import DEFAULT_EMPTY_ROUNDS, Silence, Try, silent_reason
from sluice.tasks import client_datasets, load_task
from sluice.tasks.resolve import Federation
from sluice.wire.state import field, pack, unpack

NODE_DATA = ("on a Flower federation the training data lives on the nodes, which this runtime does not add to, "
             "limit or count")


def node_data_refusal(requirements: Any) -> str | None:
    """Why a job with ``requirements`` (:class:`~sluice.control.params.Requirements`, its dict, or None) cannot
    train on Flower: a requirement on the amount of training data (None when it has none)."""
    from sluice.control.feasibility import DATA_KEYS

    doc = requirements if isinstance(requirements, dict) or requirements is None else requirements.model_dump()
    asked = [k for k in DATA_KEYS if (doc or {}).get(k) is not None]
    return f"requirements.{asked[0]}: {NODE_DATA}; drop the data amount requirements" if asked else None


def flower_object_bytes(msg: Any) -> int:
    """Bytes Flower serialises for ``msg``: its message, record and array objects as pushed and pulled."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sum(len(obj.deflate()) for obj in get_all_nested_objects(msg).values())


def _uint8(buf: bytes) -> Any:
    from flwr.app import Array

    return Array(dtype="uint8", shape=(len(buf),), stype="sluice.bytes", data=bytes(buf))


class FlowerEngine(ServerModel, Suspendable):
    """Implements :class:`sluice.engine.Engine` over a Flower ``Grid``; one iteration is one round. ``link``
    makes the calls to the SuperLink; ``nodes`` (built by :meth:`start`) knows which node serves which terminal
    and what each terminal holds (:mod:`sluice.runtimes.flower.nodes`)."""

    nodes: Nodes

    def __init__(self, cfg: HFLConfig, grid: Any, *, round_timeout_s: float = 60.0, link_timeout_s: float = 30.0,
                 node_wait_s: float = 120.0, min_nodes: int | None = None, poll_s: float = 0.05,
                 empty_rounds: int = DEFAULT_EMPTY_ROUNDS) -> None:
        if isinstance(empty_rounds, bool) or not isinstance(empty_rounds, int) or empty_rounds < 1:
            raise ConfigError(f"empty rounds in a row that end the run must be an integer >= 1, got {empty_rounds!r}")
        self.cfg = cfg
        self.grid = grid
        self.round_timeout_s = float(round_timeout_s)
        self.link_timeout_s = float(link_timeout_s)
        self.node_wait_s = float(node_wait_s)
        self.min_nodes = min_nodes
        self.poll_s = float(poll_s)
        self.silence = Silence(empty_rounds, self.round_timeout_s)
        self.server: Server | None = None
        self.link = Link(grid, self.link_timeout_s, self.poll_s)
        self._trainable: int | None = None
        self._pending: dict[int, list[tuple[int, bytes]]] = {}  # terminal -> anchor broadcasts not yet sent
        self._suspended = False
        self._restored: list[Any] | None = None  # a checkpoint's server side, applied by start()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self.server is not None:
            return
        cfg = self.cfg
        torch.set_num_threads(1)
        task = load_task(cfg.task, seed=cfg.seed, data=cfg.data, hidden=cfg.model.hidden)
        self.learner = learner = Learner(task, cfg.seed, cfg.train.device)
        cfg = self._fit(task, learner)
        self.n, self._sizes = terminals(task, cfg)
        self.data = Federation(task, [])  # the server holds the test set only
        self.theta0 = learner.theta0
        self.server = Server(cfg, self.theta0, self.n, output_layer=learner.output_layer,
                             buffers=learner.buffers0 if learner.num_buffers else None)
        self._anchor = self.theta0.copy(), self.server.replayed_velocity()  # what a resync sends as the anchor
        self._rng = np.random.default_rng(cfg.seed)
        self.nodes = Nodes(self.link, self.n, keeps_state=cfg.compression.downlink in ("per-client", "anchor"),
                           wait_s=self.node_wait_s, round_timeout_s=self.round_timeout_s,
                           startup=self.silence.startup)
        if self._restored is not None:
            self._apply_restored(*self._restored)
        self.nodes.wait(self.min_nodes if self.min_nodes else self.n)

    def stop(self) -> None:
        super().stop()
        self.link.close()

    @property
    def link_lost(self) -> bool:
        """Whether a call to the SuperLink timed out or failed."""
        return self.link.lost

    @property
    def metrics(self) -> dict[str, MetricSpec]:
        cfg = self.cfg
        task = load_task(cfg.task, seed=cfg.seed, data=cfg.data, hidden=cfg.model.hidden) if self.server is None \
            else self.data.task
        return task.declared_metrics([
            MetricSpec("participants", True, 0.0), MetricSpec("dropped", False, 0.0),
            MetricSpec("resynced", False, 0.0), MetricSpec("nodes", True, 0.0),
            MetricSpec("flower_bytes_up", False, 0.0), MetricSpec("flower_bytes_down", False, 0.0)])

    counts_bytes = True

    def set_trainable_layers(self, layers: int) -> None:
        """Every terminal trains only the last ``layers`` layers (sent with each message)."""
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= self.num_layers:
            raise ConfigError(f"layers to train must be in 1..{self.num_layers}, got {layers!r}")
        self._trainable = int(layers)

    def check_data(self, data: Any) -> None:
        raise DataError(f"{NODE_DATA}: add the data on the nodes")

    def add_data(self, data: Any) -> None:
        self.check_data(data)

    # -- checkpoint ---------------------------------------------------------------------------
    def checkpoint(self) -> bytes:
        """The server's side of the federation as bytes: the server's state, the sampling RNG, the anchor a
        resynchronisation sends and the layers trained. What the nodes hold is not in it: after
        :meth:`restore` every terminal's next message is a dense resynchronisation."""
        self.start()
        params, velocity = self._anchor
        return pack({"kind": "hfl-flower", "server": self.server.state_bytes(), "rng": self._rng.bit_generator.state,
                     "anchor": [params, velocity], "trainable_layers": self._trainable})

    def restore(self, buf: bytes) -> None:
        """Go on from a :meth:`checkpoint` taken under the same configuration (in this or a later Flower run;
        applied when the engine starts)."""
        restored = field(unpack(buf), "hfl-flower", "server", "rng", "anchor", "trainable_layers")
        if self.server is not None:
            self._apply_restored(*restored)
        else:
            self._restored = restored

    def _apply_restored(self, server: bytes, rng: dict[str, Any], anchor: list[Any], trainable: int | None) -> None:
        self.server = Server.from_state_bytes(self.cfg, server)
        if self.server.num_clients != self.n:
            raise ConfigError(f"the checkpoint holds {self.server.num_clients} terminals, this job has {self.n}")
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = rng
        self._anchor = anchor[0], anchor[1]
        self._trainable = trainable
        self.nodes.sent.clear()
        self._pending.clear()
        self.nodes.resync = set(range(self.n))  # what each node holds is unknown: its next message is dense

    # -- one round (the loop: sluice.hfl.rounds) ------------------------------------------------
    def _population(self) -> int:
        return self.n

    def _broadcast(self, anchor: bytes) -> int:
        """Every terminal gets the anchor with its next message; counted in the round it is made."""
        self._anchor = self.server.params.copy(), self.server.replayed_velocity()
        for c in range(self.n):
            self._pending.setdefault(c, []).append((self.server.round, anchor))
        return self.n * len(anchor)

    def _exchange(self, rnd: int, sampled_: np.ndarray, failed_: np.ndarray) -> Exchanged:
        """Round ``rnd`` over the grid: an empty round (no node answered) is not an iteration, it is sent again
        to the same terminals (:mod:`sluice.runtimes.flower.rounds`)."""
        sampled, failed = sampled_.tolist(), failed_.tolist()
        spent = [0, 0]  # Sluice's and Flower's bytes down of the round's empty tries
        while True:
            self.nodes.discover()
            t = self._try(rnd, sampled, failed)
            if t.out:
                self._receive(t, self.link.exchange([msg for _, msg in t.out], t.deadline))
                if t.answered:
                    break
            elif self.nodes.node_of:
                break  # it drew only terminals no node serves: they drop out, as in the simulator
            else:  # no node serves any terminal: wait for one as long as a round waits
                self.nodes.await_any(t.deadline)
                if self.nodes.node_of:
                    continue
            spent[0] += t.bytes_down
            spent[1] += t.flower_down
            self.silence.empty(rnd, t)  # TrainingError at the limit
        if t.answered:
            self.silence.answered()
        metrics = {"resynced": float(t.resynced), "nodes": float(len(self.nodes.node_of)),
                   "flower_bytes_up": float(t.flower_up), "flower_bytes_down": float(t.flower_down + spent[1])}
        return Exchanged(bytes_up=t.bytes_up, bytes_down=t.bytes_down + spent[0], weights=t.weights,
                         losses=t.losses, parts=[t.parts[c] for c in sorted(t.parts)], dropped=t.dropped,
                         metrics=metrics)

    def _try(self, rnd: int, sampled: list[int], failed: list[bool]) -> Try:
        """The messages of round ``rnd`` to the terminals ``sampled`` (``failed``: their simulated failures),
        built and counted, not sent."""
        from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

        cfg, server, nodes = self.cfg, self.server, self.nodes
        t = Try(self.silence.deadline([nodes.node_of[c] for c in sampled if c in nodes.node_of]))
        anchor_mode = cfg.compression.downlink == "anchor"
        shares = cfg.compression.up_shares([nodes.examples.get(c, self._sizes[c]) for c in sampled])
        for c, fails, share in zip(sampled, failed, shares, strict=True):
            down = server.message(c)
            node = nodes.node_of.get(c)
            if node is None:  # no node serves this terminal now: nothing is sent
                t.dropped += 1
                nodes.resync.add(c)
                t.parts[c] = ClientRound(c, dropped=True)
                t.problems[c] = f"no SuperNode serves it (one started with --node-config 'partition-id={c}')"
                continue
            pending = self._pending.pop(c, [])
            resync = c in nodes.resync
            if resync:
                down = server.resync_message()
                pending = ([(server.downlink.anchor_round, server.downlink.full_message(*self._anchor))]
                           if anchor_mode else [])
                t.bytes_down += sum(len(b) for _, b in pending)
                nodes.resync.discard(c)
                t.resynced += 1
            t.bytes_down += len(down)
            base = nodes.sent.get(c, (0, 0))
            anchor_round = pending[-1][0] if pending else base[1]
            arrays = {"down": _uint8(down)}
            arrays.update({f"anchor-{i}": _uint8(b) for i, (_, b) in enumerate(pending)})
            meta = {"round": rnd, "terminal": c, "model-round": server.round, "base-round": base[0],
                    "anchor-round": base[1], "anchor-rounds": [r for r, _ in pending] or [0],
                    "anchors": len(pending), "fail": bool(fails), "resync": resync, "up-ratio": share,
                    "trainable": -1 if self._trainable is None else self._trainable}
            msg = Message(RecordDict({P.RECORD: ArrayRecord(arrays), P.META: ConfigRecord(meta)}), node,
                          MessageType.TRAIN, ttl=max(t.deadline, 1.0), group_id=str(rnd))
            t.flower_down += flower_object_bytes(msg)
            nodes.sent[c] = (server.round, anchor_round)
            t.out.append((c, msg))
            t.parts[c] = ClientRound(c, dropped=True, resynced=resync)  # until its upload arrives
        return t

    def _receive(self, t: Try, replies: list[Any]) -> None:
        """Hand the server the uploads among ``replies`` (to the messages ``t.out``, in terminal order: the
        server sorts anyway) and fill in ``t``: the parts of the terminals that sent one, the uploads' weights
        and train losses, Sluice's and Flower's bytes up, the terminals that dropped (no answer, an error, or a
        simulated failure), those that answered, and why each silent one was."""
        for (c, msg), reply in zip(t.out, replies, strict=True):
            if reply is None or reply.has_error() or not reply.has_content():
                t.dropped += 1
                self.nodes.resync.add(c)  # what the node applied is unknown: its next message is dense
                t.problems[c] = f"node {msg.metadata.dst_node_id}: {silent_reason(reply, t.deadline)}"
                continue
            t.answered += 1
            t.flower_up += flower_object_bytes(reply)
            meta = reply.content.config_records[P.META]
            arrays = reply.content.array_records.get(P.RECORD)
            if arrays is None or "up" not in arrays:
                t.dropped += 1  # a simulated failure: it synced and uploads nothing
                continue
            upload = arrays["up"].data
            weight = float(meta["num-examples"])
            t.parts[c] = _part(t.parts[c], meta)
            self.nodes.examples[c] = int(weight)
            t.bytes_up += len(upload)
            self.server.receive(c, upload, weight)
            t.weights.append(weight)
            t.losses.append(float(meta["train-loss"]))

    def _evaluate(self) -> dict[str, float]:
        """Test metrics of the server model, as the simulator computes them after each round (not the
        engine capability ``evaluate``: the simulator does not offer it, and the control plane must decide
        the same way on both)."""
        return self.learner.evaluate(self.server.params, self.server.buffers, self.data.task.test)


def _part(sent: ClientRound, meta: Any) -> ClientRound:
    """A terminal's part in the round once its upload came, from its reply's ``sluice-meta``: samples and
    train loss, and the local training time and start its node measured (none from a node that does not
    send them)."""
    seconds = float(meta["train-seconds"]) if "train-seconds" in meta else 0.0
    started = float(meta["train-started"]) if "train-started" in meta else None
    return ClientRound(sent.client, int(meta["num-examples"]), seconds, started,
                       client_metrics(float(meta["train-loss"])), resynced=sent.resynced)


def terminals(task: Any, cfg: HFLConfig) -> tuple[int, list[int]]:
    """The job's number of terminals and the samples the server expects each to hold until its node reports
    them: the task's client datasets where the server can build them (a built-in task), else
    ``data.num_clients`` terminals of equal weight (a task whose data lives only on the nodes)."""
    try:
        sizes = [len(ds) for ds in client_datasets(task, cfg.data, seed=cfg.seed)]
    except TaskError:
        if cfg.data.num_clients is None:
            raise
        return cfg.data.num_clients, [1] * cfg.data.num_clients
    return len(sizes), sizes
