"""What Sluice's messages look like inside Flower messages, and what a run configuration carries.

Flower carries records; Sluice puts its own bytes into them unchanged (``uint8`` arrays whose ``len()`` is
the Sluice byte count) and a few integers beside them:

* downlink (``TRAIN``, server → terminal ``c`` in round ``t``): array record ``sluice`` with ``down`` (the
  Sluice downlink message) and ``anchor-0``, ``anchor-1``... (anchor broadcasts the node has not received
  yet, oldest first); config record ``sluice-meta`` with ``round`` (t), ``terminal`` (c), ``model-round``
  (the server rounds the message brings the node to), ``base-round`` and ``anchor-round`` (the model and
  anchor rounds the server believes the node holds, checked by the node), ``anchor-rounds`` (the rounds of
  the anchors sent), ``fail`` (simulated failure: sync, then upload nothing), ``resync`` (the message is a
  dense resynchronisation), ``trainable`` (layers to train, -1 for all) and ``up-ratio`` (k/d of the
  upload, :meth:`sluice.hfl.config.CompressionConfig.up_shares`);
* uplink (the reply): array record ``sluice`` with ``up`` (the Sluice upload; absent for a simulated
  failure); config record ``sluice-meta`` with ``terminal``, ``model-round``, ``anchor-round``,
  ``num-examples`` and ``train-loss`` and, when it trained, ``train-seconds`` (its local training time) and
  ``train-started`` (when that began, ``time.time()`` on the node);
* hello (``QUERY``, sent once to every node the server has not seen): the reply names the node's terminal
  (its ``partition-id`` node configuration), the rounds of the model and anchor it holds, so that a
  node that restarted with an empty state is found and resynchronised with a dense message, and
  ``startup-seconds``, how long its ClientApp process took to start and build its task (the server's first
  round waits that much longer).

A run configuration (Flower's ``run_config``) holds the Sluice job as JSON (``sluice-job``), the run
directory the server writes (``out-dir``), the server's timeouts and how many empty rounds in a row end the
run (``empty-rounds``, :mod:`sluice.runtimes.flower.rounds`).
"""

from __future__ import annotations

from sluice.runtimes.flower.rounds import DEFAULT_EMPTY_ROUNDS

RECORD, META = "sluice", "sluice-meta"
STATE_RECORD, STATE_META = "sluice-client", "sluice-client-meta"
DATA_RECORD, DATA_META = "sluice-data", "sluice-data-meta"
NODE_TERMINAL_KEY = "partition-id"
NODE_COUNT_KEY = "num-partitions"

RUN_CONFIG_DEFAULTS: dict[str, str | int | float] = {
    "sluice-job": "{}",
    "out-dir": "",
    "round-timeout": 60.0,
    "link-timeout": 30.0,
    "node-wait": 120.0,
    "min-nodes": 0,
    "poll-interval": 0.05,
    "empty-rounds": DEFAULT_EMPTY_ROUNDS,
    "sluice-control": "",
    "sluice-key": "",
}
"""Every key of the run configuration with its default (Flower refuses keys its app does not declare)."""
