"""The Flower App: ``server_app`` runs the Sluice job under the control plane, ``client_app`` is one terminal.

The ServerApp's main loop is :func:`sluice.runtimes.training.run_job` over a :class:`FlowerEngine`: the same
``[termination]``, ``[requirements]``, ``report.json``, ``status.json``, ``metrics.jsonl`` and plots as
``sluice run``, written into the run configuration's ``out-dir`` on the SuperLink's host. A criterion that
fires returns from ``main``, which ends the Flower run at that round. A run configuration with
``sluice-control`` (``HOST:PORT``, and ``sluice-key``, the hex of the connection's authentication key) is a
run of the management service instead: the ServerApp connects there, receives the worker spec and trains
under :func:`sluice.runtimes.remote.run_steered`, steered by the service's worker (:mod:`sluice.runtimes.flower.relay`).

The ClientApp runs :class:`sluice.hfl.Client` unchanged: the terminal is the node's ``partition-id``. The
node builds the job's task where it runs, with ``[task.args]`` updated by its own node configuration's
``task.<name>`` entries (a path to the node's files, say), and trains on that task's dataset for its
terminal, or on the task's only dataset when the task built there holds just one (the node's own data).
Everything the terminal carries between rounds (held model, anchor, compressor state) lives in the node's
``Context.state`` as the client's state bytes, beside the rounds of the model and anchor it holds and, for a
dataset of tensors, the data itself (every message starts a fresh ClientApp process).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from functools import lru_cache
from pathlib import Path
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from sluice.runtimes.flower import protocol as P

server_app = ServerApp()
client_app = ClientApp()


# --------------------------------------------------------------------------------------------- server
@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """Train the run configuration's job; its report lands in ``out-dir``."""
    from rich.console import Console

    from sluice.errors import SluiceError, TrainingError
    from sluice.runtimes.jobs import job_from_dict
    from sluice.runtimes.plots import plot_accuracy
    from sluice.runtimes.training import run_job, summarize_hfl

    rc = {**P.RUN_CONFIG_DEFAULTS, **dict(context.run_config)}
    if str(rc["sluice-control"]):
        _steered(grid, rc)
        return
    out = str(rc["out-dir"]) or None
    error_file = Path(out) / "flower" / "server-error.txt" if out else None
    engine = None
    try:
        job = job_from_dict("hfl", json.loads(str(rc["sluice-job"])))
        engine = _engine(job, grid, rc)
        console = Console(file=sys.stdout, force_terminal=False, width=140)
        try:
            code = run_job(job, out, console=console, unit="round", prefix="run", summarize=summarize_hfl,
                           plot=plot_accuracy, engine=engine)
        except TrainingError as exc:  # the engine could not start: no node answered, or the SuperLink went away
            if out is None:
                raise
            from sluice.runtimes.flower.failure import failure_report

            failure_report(job, Path(out), f"the engine could not start: {exc}")
            code = 9  # ENGINE_FAILURE, the report's exit status
        console.print(f"sluice: training finished, exit status {code}")
    except (SluiceError, ValueError) as exc:
        if error_file is not None:
            error_file.parent.mkdir(parents=True, exist_ok=True)
            error_file.write_text(f"{type(exc).__name__}: {exc}\n", encoding="utf-8")
        raise
    except BaseException:
        if error_file is not None:
            error_file.parent.mkdir(parents=True, exist_ok=True)
            error_file.write_text(traceback.format_exc(), encoding="utf-8")
        raise
    if engine is not None and engine.link_lost:
        # the report is written; Flower's own exit handling would retry the lost SuperLink for ever
        sys.stdout.flush()
        os._exit(0)


def _engine(job: Any, grid: Grid, rc: dict[str, Any]) -> Any:
    from sluice.runtimes.flower.engine import FlowerEngine

    return FlowerEngine(job.config, grid, round_timeout_s=float(rc["round-timeout"]),
                        link_timeout_s=float(rc["link-timeout"]), node_wait_s=float(rc["node-wait"]),
                        min_nodes=int(rc["min-nodes"]) or None, poll_s=float(rc["poll-interval"]),
                        empty_rounds=int(rc["empty-rounds"]))


def _steered(grid: Grid, rc: dict[str, Any]) -> None:
    """Train the job the service's worker at ``sluice-control`` sends, steered by it."""
    from multiprocessing.connection import Client

    from sluice.runtimes.jobs import job_from_dict
    from sluice.runtimes.remote import run_steered

    host, _, port = str(rc["sluice-control"]).rpartition(":")
    conn = Client((host.strip("[]"), int(port)), authkey=bytes.fromhex(str(rc["sluice-key"])))
    spec = conn.recv()
    engine = _engine(job_from_dict("hfl", spec["raw"]), grid, rc)
    run_steered(spec, conn, engine)
    if engine.link_lost:  # the report went to the service; Flower would retry the lost SuperLink for ever
        sys.stdout.flush()
        os._exit(0)


# --------------------------------------------------------------------------------------------- client
@lru_cache(maxsize=2)
def _config(job_json: str) -> Any:
    """The job's HFL configuration."""
    import torch

    from sluice.runtimes.jobs import job_from_dict

    torch.set_num_threads(1)  # as the simulator: the same arithmetic, the same bits
    return job_from_dict("hfl", json.loads(job_json)).config


def _node_args(context: Context) -> dict[str, Any]:
    """The node configuration's ``task.<name>`` entries, as keyword arguments of the task."""
    return {k.removeprefix("task."): v for k, v in context.node_config.items() if str(k).startswith("task.")}


def _partition(context: Context) -> tuple[Any, int, Any, Any]:
    """(configuration, terminal, learner, training data) of this node. A dataset of tensors is kept in the
    node's context after the first message, so that later messages (each a fresh process) skip building it."""
    import torch
    from torch.utils.data import TensorDataset

    from sluice.hfl.learner import Learner
    from sluice.tasks import client_datasets, load_task

    cfg = _config(str(context.run_config["sluice-job"]))
    task = load_task(cfg.task, seed=cfg.seed, data=cfg.data, hidden=cfg.model.hidden, node_args=_node_args(context))
    learner = Learner(task, cfg.seed, cfg.train.device)
    state = context.state
    if P.DATA_RECORD in state.array_records:
        arrays = state.array_records[P.DATA_RECORD]
        c = int(state.config_records[P.DATA_META]["terminal"])
        data = TensorDataset(torch.from_numpy(arrays["X"].numpy()), torch.from_numpy(arrays["y"].numpy()))
        return cfg, c, learner, learner.check([data])[0]
    own = task.per_client and len(task.train) == 1
    clients = list(task.train) if own else client_datasets(task, cfg.data, seed=cfg.seed)
    c = _terminal(context, cfg.data.num_clients or len(clients) if own else len(clients))
    data = learner.check([clients[0 if own else c]])[0]
    if isinstance(data, TensorDataset):
        X, y = (t.cpu().numpy() for t in data.tensors)
        state[P.DATA_RECORD] = ArrayRecord({"X": Array(X), "y": Array(y)})
        state[P.DATA_META] = ConfigRecord({"terminal": c})
    return cfg, c, learner, data


def _terminal(context: Context, num_terminals: int) -> int:
    from sluice.errors import ConfigError

    value = context.node_config.get(P.NODE_TERMINAL_KEY)
    if value is None:
        raise ConfigError(f"this SuperNode has no {P.NODE_TERMINAL_KEY} in its node configuration; start it "
                          f"with --node-config '{P.NODE_TERMINAL_KEY}=<terminal>'")
    c = int(value)
    if not 0 <= c < num_terminals:
        raise ConfigError(f"{P.NODE_TERMINAL_KEY}={c} but the job has {num_terminals} terminals")
    return c


def _held(context: Context) -> tuple[bytes | None, int, int]:
    """(client state bytes or None, model round, anchor round) kept in the node's context."""
    state = context.state
    if P.STATE_RECORD not in state.array_records:
        return None, 0, 0
    meta = state.config_records[P.STATE_META]
    return state.array_records[P.STATE_RECORD]["state"].data, int(meta["model-round"]), int(meta["anchor-round"])


def _bytes(buf: bytes) -> Array:
    return Array(dtype="uint8", shape=(len(buf),), stype="sluice.bytes", data=bytes(buf))


@client_app.query()
def hello(msg: Message, context: Context) -> Message:
    """Which terminal this node serves and which rounds of the model and anchor it holds."""
    _, c, _, data = _partition(context)
    _, model_round, anchor_round = _held(context)
    meta = {"terminal": c, "model-round": model_round, "anchor-round": anchor_round, "num-examples": len(data),
            "startup-seconds": _startup_seconds()}
    return Message(RecordDict({P.META: ConfigRecord(meta)}), reply_to=msg)


def _startup_seconds() -> float:
    """How long this ClientApp process took to get here, its task built: the start-up every message pays
    (each starts a fresh process), which the server adds to its first round's timeout."""
    import psutil

    return max(0.0, time.time() - psutil.Process().create_time())


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Apply the anchors and the downlink message, train, reply with the upload (the Sluice client half)."""
    from sluice.errors import WireError
    from sluice.hfl.client import Client

    cfg, c, learner, data = _partition(context)
    meta = msg.content.config_records[P.META]
    arrays = msg.content.array_records[P.RECORD]
    if int(meta["terminal"]) != c:
        raise WireError(f"a message for terminal {meta['terminal']} reached the node of terminal {c}")
    state, model_round, anchor_round = _held(context)
    resync = bool(meta["resync"])
    mode = cfg.compression.downlink
    if not resync and ((mode == "per-client" and model_round != int(meta["base-round"]))
                       or (mode == "anchor" and anchor_round != int(meta["anchor-round"]))):
        raise WireError(f"terminal {c} holds model round {model_round} and anchor round {anchor_round}, the "
                        f"server sent a patch against {meta['base-round']} / {meta['anchor-round']}: it must resync")
    client = Client.from_state_bytes(cfg, state, learner) if state is not None and not resync else Client(cfg, c,
                                                                                                          learner)
    trainable = int(meta["trainable"])
    client.set_trainable_layers(None if trainable < 0 else trainable)
    rounds = list(meta["anchor-rounds"])
    for i in range(int(meta["anchors"])):
        client.receive_anchor(arrays[f"anchor-{i}"].data)
        anchor_round = int(rounds[i])
    down = arrays["down"].data
    reply = RecordDict()
    timing: dict[str, float] = {}
    if bool(meta["fail"]):  # simulated failure: it received the model, then failed before uploading
        client.sync(down)
    else:
        started, t0 = time.time(), time.perf_counter()
        upload = client.train(down, data, int(meta["round"]), up_ratio=float(meta["up-ratio"]))
        timing = {"train-seconds": time.perf_counter() - t0, "train-started": started}
        reply[P.RECORD] = ArrayRecord({"up": _bytes(upload)})
    model_round = int(meta["model-round"])
    context.state[P.STATE_RECORD] = ArrayRecord({"state": _bytes(client.state_bytes())})
    context.state[P.STATE_META] = ConfigRecord({"model-round": model_round, "anchor-round": anchor_round})
    reply[P.META] = ConfigRecord({"terminal": c, "model-round": model_round, "anchor-round": anchor_round,
                                  "num-examples": len(data), "train-loss": float(client.train_loss or 0.0),
                                  **timing})
    return Message(reply, reply_to=msg)
