"""Delivery of the notification outbox: POST each notification to its subscriber after its change committed.

One thread delivers, oldest first. A subscriber's notifications go out in ``notificationId`` order: when
one fails (no 2xx answer, or no answer within the timeout) it is retried with exponential back-off
(``notify_backoff_s`` doubling up to 60 s) and that subscriber's later notifications wait for it; after
``notify_max_attempts`` it is dropped (kept in the table, marked ``dropped``) so one dead subscriber cannot
block forever. Other subscribers are not held up. The ``notificationId`` is the outbox row id, added to
the stored payload when it is sent; ids commit in increasing order (:class:`sluice.service.store.Store`
serialises writers, across processes too on PostgreSQL), so reading committed rows by id never skips one
that commits later with a smaller id.

:attr:`Outbox.send_lock` is held while a POST is in flight; deleting a subscription takes it too, so no
notification reaches a subscriber after its ``DELETE`` answered.

Across restarts delivery is at least once, and at most one notification per subscriber is sent twice: a
row is marked delivered in the transaction after its POST answered, so a service killed between the two
sends that one notification again when it restarts (before any later one: the order holds). Nothing else
is repeated, no committed notification is lost, and ids keep increasing. The repeated notification carries
the same ``notificationId``: a subscriber that remembers the last id it took discards it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sluice.service.db import Notification
from sluice.service.store import Store


class Outbox:
    def __init__(self, store: Store, *, timeout_s: float = 5.0, max_attempts: int = 12,
                 backoff_s: float = 0.5, ca_file: str | None = None) -> None:
        """``ca_file``: CA certificates that verify https recipients (default: the system's)."""
        self.store = store
        self.ca_file = ca_file
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.send_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sluice-outbox", daemon=True)
        self._client: Any = None

    def start(self) -> Outbox:
        import httpx

        from sluice.service.client import tls_context

        self._client = httpx.Client(timeout=self.timeout_s, trust_env=False, verify=tls_context(self.ca_file))
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.store.committed.set()
        if self._thread.is_alive():
            self._thread.join(self.timeout_s + 2)
        if self._client is not None:
            self._client.close()

    def pending(self) -> int:
        with Session(self.store.engine) as s:
            return int(s.scalar(sa.select(sa.func.count()).select_from(Notification).where(
                Notification.delivered_at.is_(None), Notification.dropped.is_(False))) or 0)

    # ------------------------------------------------------------------ loop
    def _due(self) -> tuple[list[Notification], float | None]:
        """Notifications to send now (the oldest undelivered one of each subscriber, if due) and when the
        next one falls due."""
        now = time.time()
        with Session(self.store.engine, expire_on_commit=False) as s:
            rows = list(s.scalars(
                sa.select(Notification).where(Notification.delivered_at.is_(None), Notification.dropped.is_(False))
                .order_by(Notification.id).limit(500)
            ))
        heads: dict[str, Notification] = {}
        for r in rows:
            heads.setdefault(r.subscription_dn, r)
        due = [r for r in heads.values() if r.next_attempt_at <= now]
        later = [r.next_attempt_at for r in heads.values() if r.next_attempt_at > now]
        return sorted(due, key=lambda r: r.id), (min(later) if later else None)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                due, nxt = self._due()
            except Exception:  # noqa: BLE001 - the database may be briefly unavailable; try again
                due, nxt = [], time.time() + 1.0
            if not due:
                wait = 1.0 if nxt is None else max(0.01, min(1.0, nxt - time.time()))
                self.store.committed.wait(wait)
                self.store.committed.clear()
                continue
            for row in due:
                if self._stop.is_set():
                    return
                self._send(row)

    def _send(self, row: Notification) -> None:
        payload = {"notificationId": row.id, **row.payload}
        with self.send_lock:
            with Session(self.store.engine) as s:  # unsubscribed meanwhile: the row is gone
                if s.get(Notification, row.id) is None:
                    return
            error = None
            try:
                resp = self._client.post(row.recipient, json=payload)
                if not 200 <= resp.status_code < 300:
                    error = f"HTTP {resp.status_code}"
            except Exception as exc:  # noqa: BLE001 - any failure to deliver is retried
                error = f"{type(exc).__name__}: {exc}"
            with self.store.write() as tx:
                cur = tx.s.get(Notification, row.id)
                if cur is None:
                    return
                cur.attempts += 1
                if error is None:
                    cur.delivered_at = time.time()
                    cur.last_error = None
                else:
                    cur.last_error = error
                    if cur.attempts >= self.max_attempts:
                        cur.dropped = True
                    else:
                        cur.next_attempt_at = time.time() + min(60.0, self.backoff_s * 2 ** (cur.attempts - 1))
