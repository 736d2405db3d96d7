"""What an ended chain leaves at its producers is cancelled, even at producers that come back later.

A chained request (:mod:`sluice.service.chain`) creates one request at each of its producers. When the chain
ends, its engine cancels those still training; a producer that cannot be reached then (killed, restarting,
cut off) would resume the request when it comes back and train it on for nobody. :class:`ChainCancels`, one
thread of the chain's service, closes that gap:

* the producers' request ids of a chain follow from its process record (:func:`chain_id_of`: the process's
  LDN, sequence number and creation time), so nothing has to be written before the chain starts;
* every ended chain process whose record does not yet say that each producer's request is settled is
  looked at: a producer's request that has ended (``FINISHED``, ``CANCELLED``) or that the producer does not
  hold (HTTP 404: never created, or deleted) is settled; one still in progress is cancelled, and settled
  once the producer acknowledged the cancel (HTTP 200). A producer that cannot be reached, or that refuses
  for now, is asked again later: after :data:`FIRST_RETRY_S`, doubling up to :data:`MAX_RETRY_S`;
* what was settled, and how, is written to the chain process's record in the store (``internal``, never
  shown), in the same store as the process: after a restart of the service the thread looks at every ended
  chain again and goes on with what was not settled;
* a producer the service's configuration no longer names cannot be asked: it is settled as such.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any

from sluice.control.lifecycle import Phase
from sluice.errors import SluiceError

log = logging.getLogger(__name__)

SWEEP_S = 1.0
"""How often ended chains are looked for (a chain's producers are asked when their retry time came)."""
FIRST_RETRY_S = 1.0
MAX_RETRY_S = 15.0
RECORD_KEY = "chain_cancels"
"""Key of a chain process's ``internal``: producer name → how its request was settled."""
ENDED = ("FINISHED", "CANCELLED")


def chain_id_of(process_ldn: str, seq: int, created_at: float) -> str:
    """The chain id of a chain process (its producers' requests are ``<chain id>-<producer>``): the same for
    the same stored process, after any restart, and different for any other process of any service."""
    digest = hashlib.sha256(f"{process_ldn}|{seq}|{created_at!r}".encode()).hexdigest()
    return f"chain-{digest[:12]}"


class ChainCancels:
    """The thread that settles the producers' requests of ended chains (see the module docstring)."""

    def __init__(self, store: Any, producers: dict[str, Any], *, sweep_s: float = SWEEP_S) -> None:
        self.store = store
        self.producers = producers
        self.sweep_s = sweep_s
        self._retry: dict[tuple[str, str], tuple[float, float]] = {}  # (process, producer) → (when, delay)
        self._open: dict[str, dict[str, str]] = {}  # ended chain process → producer → request, not settled
        self._since: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sluice-chain-cancels", daemon=True)

    @staticmethod
    def fields(row: Any) -> dict[str, Any]:
        """What the service adds to the job of chain process ``row`` when it starts it (with the endpoints)."""
        return {"chain_id": chain_id_of(row.dn, row.seq, row.created_at)}

    def start(self) -> ChainCancels:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the store or a producer failed: the next sweep tries again
                log.exception("settling the producers' requests of ended chains failed; trying again")
            self._stop.wait(self.sweep_s)

    def pending(self) -> list[tuple[str, str, str]]:
        """``(process LDN, producer, its request id)`` of every ended chain's request not settled yet: the
        first call reads every process, later ones those changed since (a minute of slack for the clocks of
        other writers of the same store)."""
        import sqlalchemy as sa

        from sluice.service.db import MOI

        since, self._since = self._since, time.time() - 60.0
        query = sa.select(MOI).where(MOI.object_class == "MLTrainingProcess")
        if since is not None:
            query = query.where(MOI.updated_at >= since)
        with self.store.read() as s:
            for row in s.scalars(query.order_by(MOI.seq)):
                i = row.internal or {}
                if i.get("kind") != "chain" or i.get("phase") != Phase.ENDED:
                    continue
                done = i.get(RECORD_KEY) or {}
                cid = chain_id_of(row.dn, row.seq, row.created_at)
                names = [str(n) for n in (i.get("raw") or {}).get("producers") or [] if str(n) not in done]
                if names:
                    self._open[row.dn] = {n: f"{cid}-{n}" for n in names}
                else:
                    self._open.pop(row.dn, None)
        return [(ldn, n, rid) for ldn, names in self._open.items() for n, rid in names.items()]

    def sweep(self, now: float | None = None) -> int:
        """Ask every producer whose retry time came; the number of requests still to settle."""
        now = time.monotonic() if now is None else now
        left = 0
        for ldn, name, rid in self.pending():
            when, delay = self._retry.get((ldn, name), (0.0, FIRST_RETRY_S))
            if when > now:
                left += 1
                continue
            outcome = self._settle(name, rid)
            if outcome is None:
                self._retry[(ldn, name)] = (now + delay, min(MAX_RETRY_S, delay * 2))
                left += 1
                continue
            self._retry.pop((ldn, name), None)
            self._record(ldn, name, outcome)
            self._open.get(ldn, {}).pop(name, None)
        return left

    def _settle(self, name: str, rid: str) -> str | None:
        """How producer ``name``'s request ``rid`` is settled now, or None to ask again later."""
        from sluice.service.client import MnSClientError, ProvMnSClient

        ep = self.producers.get(name)
        if ep is None:
            return "producer no longer configured"
        try:
            with ProvMnSClient(ep.url, timeout=ep.timeout_s, token=ep.token, ca_file=ep.ca_file) as c:
                try:
                    status = c.request(rid)["attributes"].get("requestStatus")
                except MnSClientError as exc:
                    if exc.status == 404:
                        return "not held by the producer"
                    raise
                if status in ENDED:
                    return f"ended {status}"
                c.cancel(rid)
                return "cancelled"
        except SluiceError as exc:
            log.info("request %s at producer %s is not settled yet: %s", rid, name, exc)
            return None

    def _record(self, ldn: str, name: str, outcome: str) -> None:
        with self.store.write() as tx:
            row = tx.get(ldn)
            if row is None:
                return
            internal = dict(row.internal)
            internal[RECORD_KEY] = {**(internal.get(RECORD_KEY) or {}), name: outcome}
            tx.update(row, internal=internal, notify=False)
