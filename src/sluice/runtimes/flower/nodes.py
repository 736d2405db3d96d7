"""The SuperLink calls of :class:`~sluice.runtimes.flower.engine.FlowerEngine` and its view of the nodes.

:class:`Link` makes every call to the SuperLink through the Flower ``Grid`` with ``link_timeout_s``: a
SuperLink that does not answer in time, or a call that fails, raises :class:`~sluice.errors.TrainingError` and
sets :attr:`Link.lost` (the Flower client itself retries forever).

:class:`Nodes` knows which Flower node serves which terminal and what each terminal holds. A node not seen yet
is asked (the ``hello`` query) which terminal it serves, how many training samples it holds, which rounds of the
model and anchor it holds and how long its ClientApp took to start. A question stays asked until its node
answers or it expires (after ``node_wait_s``), so a ClientApp slow to start answers a later look. A node that
cannot serve the job (no or a wrong ``partition-id``) is kept in :attr:`Nodes.refused` with its error; a node
that holds other rounds than the server sent its terminal (it restarted with an empty state), and the terminal
of a node that is gone, get a dense resynchronisation (:attr:`Nodes.resync`) in a mode where terminals keep a
state.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

from sluice.errors import TrainingError
from sluice.runtimes.flower import protocol as P
from sluice.runtimes.flower.rounds import error_text, unavailable

SHOWN = 5
"""Silent nodes an error names one by one (the others are counted)."""


class Link:
    """Calls to the SuperLink through ``grid``, each bounded by ``timeout_s``; replies are polled every
    ``poll_s`` seconds."""

    def __init__(self, grid: Any, timeout_s: float, poll_s: float) -> None:
        self.grid = grid
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.lost = False  # a call timed out or failed
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="sluice-link")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the grid, or :class:`TrainingError` when the SuperLink does not answer in time
        (the Flower client itself retries forever)."""
        future = self._pool.submit(fn, *args)
        try:
            return future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            self.lost = True
            raise TrainingError(f"the SuperLink did not answer within {self.timeout_s:g} s ({what}); "
                                "is it still running?") from None
        except Exception as exc:  # noqa: BLE001 - every transport error is the link's failure
            self.lost = True
            raise TrainingError(f"the SuperLink failed ({what}): {type(exc).__name__}: {exc}") from None

    def exchange(self, messages: list[Any], deadline_s: float) -> list[Any]:
        """Push ``messages``; pull replies until all arrived or ``deadline_s`` passed. The reply to each
        message, in order (None where none came)."""
        if not messages:
            return []
        ids = list(self.call("push messages", self.grid.push_messages, messages))
        replies = self.pull({i for i in ids if i}, deadline_s)
        return [replies.get(i) if i else None for i in ids]

    def pull(self, ids: set[str], deadline_s: float) -> dict[str, Any]:
        """The replies to the messages ``ids`` that come until all did or ``deadline_s`` passed, by message id."""
        waiting, replies = set(ids), {}
        end = time.monotonic() + deadline_s
        while waiting and time.monotonic() < end:
            for reply in self.call("pull messages", self.grid.pull_messages, sorted(waiting)):
                rid = reply.metadata.reply_to_message_id
                if rid in waiting:
                    waiting.discard(rid)
                    replies[rid] = reply
            if waiting:
                time.sleep(self.poll_s)
        return replies


class Nodes:
    """The nodes serving the ``n`` terminals of a federation, as :class:`Link` ``link`` finds them (see the module
    docstring). ``keeps_state``: the terminals keep a state across rounds (the ``per-client`` and ``anchor``
    downlinks), so one whose node holds other rounds than it was sent needs a resynchronisation. ``startup``
    receives each node's measured ClientApp start-up, in seconds, by node id."""

    def __init__(self, link: Link, n: int, *, keeps_state: bool, wait_s: float, round_timeout_s: float,
                 startup: dict[int, float]) -> None:
        self.link = link
        self.n = n
        self.keeps_state = keeps_state
        self.wait_s = wait_s
        self.round_timeout_s = round_timeout_s
        self.startup = startup
        self.node_of: dict[int, int] = {}  # terminal -> Flower node id
        self.seen: set[int] = set()  # node ids that answered which terminal they serve
        self.hellos: dict[str, int] = {}  # message id -> node id: questions not answered yet
        self.refused: dict[int, str] = {}  # node id -> why it cannot serve a terminal of this job
        self.resync: set[int] = set()  # terminals whose next message must be dense
        self.sent: dict[int, tuple[int, int]] = {}  # terminal -> (model round, anchor round) it was sent
        self.examples: dict[int, int] = {}  # terminal -> training samples its node last reported

    def discover(self, deadline_s: float | None = None) -> None:
        """Ask every node not seen yet which terminal it serves and what it holds, and take the answers that come
        within ``deadline_s`` (default: the round timeout). A question stays asked until its node answers or it
        expires (after ``wait_s``): a ClientApp slow to start answers a later look."""
        from flwr.app import ConfigRecord, Message, MessageType, RecordDict

        link = self.link
        nodes = list(link.call("get node ids", link.grid.get_node_ids))
        alive = set(nodes)
        for c in [c for c, nid in self.node_of.items() if nid not in alive]:
            del self.node_of[c]
            self.resync.add(c)
        self.hellos = {mid: nid for mid, nid in self.hellos.items() if nid in alive}
        asked = set(self.hellos.values())
        new = [nid for nid in nodes if nid not in self.seen and nid not in asked]
        if new:
            hello = [Message(RecordDict({P.META: ConfigRecord({"op": "hello"})}), nid, MessageType.QUERY,
                             ttl=max(self.wait_s, self.round_timeout_s, 1.0)) for nid in new]
            ids = link.call("push messages", link.grid.push_messages, hello)
            self.hellos.update({mid: nid for mid, nid in zip(ids, new, strict=True) if mid})
        if self.hellos:
            got = link.pull(set(self.hellos), self.round_timeout_s if deadline_s is None else deadline_s)
            for mid, reply in got.items():
                self._hello_reply(self.hellos.pop(mid), reply)

    def _hello_reply(self, nid: int, reply: Any) -> None:
        if reply.has_error():
            if not unavailable(reply):  # a node that cannot serve this job (no or a wrong partition-id)
                self.seen.add(nid)
                self.refused[nid] = error_text(reply)
            return  # else the question expired, or the node missed its heartbeats: it is asked again
        meta = reply.content.config_records[P.META]
        if "startup-seconds" in meta:  # the ClientApp's start-up, measured on the node
            self.startup[nid] = float(meta["startup-seconds"])
        c = int(meta["terminal"])
        self.seen.add(nid)
        if not 0 <= c < self.n:
            return  # a node outside this federation's terminals takes no part
        self.node_of[c] = nid
        self.examples[c] = int(meta["num-examples"])
        held = (int(meta["model-round"]), int(meta["anchor-round"]))
        if held != self.sent.get(c, (0, 0)) and self.keeps_state:
            self.resync.add(c)

    def wait(self, want: int) -> None:
        """Until nodes serve ``want`` terminals; :class:`TrainingError` naming the nodes that refused or did not
        answer when they do not within ``wait_s``."""
        end = time.monotonic() + self.wait_s
        while True:
            self.discover(deadline_s=min(self.round_timeout_s, max(1.0, end - time.monotonic())))
            if len(self.node_of) >= want:
                return
            if time.monotonic() >= end:
                why = "".join(f"; node {nid}: {reason}" for nid, reason in self.refused.items())
                silent = sorted(set(self.hellos.values()))
                why += "".join(f"; node {nid}: no answer (a ClientApp slower to start than that?)"
                               for nid in silent[:SHOWN])
                why += f"; {len(silent) - SHOWN} more nodes did not answer" if len(silent) > SHOWN else ""
                terms = sorted(self.node_of)
                more = len(terms) - 4 * SHOWN
                seen = f"{terms[:4 * SHOWN]}" + (f" and {more} more" if more > 0 else "")
                raise TrainingError(f"{len(self.node_of)} of the {want} nodes needed answered within "
                                    f"{self.wait_s:g} s (terminals {seen}); start "
                                    "a SuperNode per terminal with --node-config 'partition-id=<c>', or wait longer "
                                    f"for them (--node-wait){why}")
            time.sleep(0.5)

    def await_any(self, deadline_s: float) -> None:
        """Until a node serves a terminal again, or ``deadline_s`` passed."""
        end = time.monotonic() + deadline_s
        while not self.node_of and time.monotonic() < end:
            time.sleep(max(self.link.poll_s, 0.2))
            self.discover(deadline_s=max(0.5, min(self.round_timeout_s, end - time.monotonic())))
