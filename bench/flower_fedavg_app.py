"""Flower's own FedAvg on the data and model of a Sluice job: the baseline of ``bench/flower_runtime.py``.

The ServerApp runs ``flwr.serverapp.strategy.FedAvg.start`` (every node gets the same dense float32 model;
replies are dense models weighted by their sample counts) and evaluates the global model on the job's
test set after every round, appending ``{round, time, test_accuracy}`` to the run configuration's
``out-file``. The ClientApp trains the node's partition (its ``partition-id``) with the local training of
Sluice's client (:func:`sluice.hfl.client.local_train`, the same epochs, batch size, learning rate and
batch seeds).
"""

from __future__ import annotations

import json
import time

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from sluice.data import load_federated
from sluice.hfl.client import build_model, local_train
from sluice.metrics import classification_metrics
from sluice.models import get_flat, set_flat
from sluice.runtimes.jobs import job_from_dict

server_app = ServerApp()
client_app = ClientApp()


def _setup(context: Context):  # noqa: ANN202
    torch.set_num_threads(1)
    cfg = job_from_dict("hfl", json.loads(str(context.run_config["sluice-job"]))).config
    data = load_federated(cfg.data, seed=cfg.seed)
    return cfg, data, build_model(cfg, data.num_features, data.num_classes)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    cfg, data, model = _setup(context)
    out = str(context.run_config["out-file"])
    t0 = time.perf_counter()
    rows: list[dict] = []

    @torch.no_grad()
    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        set_flat(model, arrays.to_numpy_ndarrays()[0])
        model.eval()
        m = classification_metrics(model(torch.from_numpy(data.X_test)), data.y_test, data.num_classes)
        rows.append({"round": server_round, "time": time.perf_counter() - t0, "test_accuracy": m["test_accuracy"]})
        with open(out, "w", encoding="utf-8") as f:
            json.dump(rows, f)
        return MetricRecord({"test_accuracy": m["test_accuracy"]})

    n = len(data.clients)
    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n)
    strategy.start(grid=grid, initial_arrays=ArrayRecord([get_flat(model)]),
                   num_rounds=int(context.run_config["rounds"]), evaluate_fn=evaluate)
    with open(out + ".done", "w", encoding="utf-8") as f:
        f.write("done\n")


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    cfg, data, model = _setup(context)
    c = int(context.node_config["partition-id"])
    X, y = data.clients[c]
    params = msg.content["arrays"].to_numpy_ndarrays()[0].astype(np.float32)
    rnd = int(msg.metadata.group_id or 0)
    tr = cfg.train
    delta, loss = local_train(model, params, X, y, epochs=tr.local_epochs, batch_size=tr.batch_size, lr=tr.lr,
                              seed=cfg.seed * 1_000_003 + rnd * 1009 + c)
    new = (params.astype(np.float64) + delta).astype(np.float32)
    return Message(RecordDict({"arrays": ArrayRecord([new]),
                               "metrics": MetricRecord({"train_loss": loss, "num-examples": len(y)})}), reply_to=msg)
