"""Transactions over the MOI store, with the notifications of each change written in the same transaction.

Every write goes through :meth:`Store.write`: one database transaction under one process-wide lock (all
writers live in the web server's process, so SQLite never sees two writers and PostgreSQL serialises
nothing it would not anyway). :class:`Tx` creates, updates and deletes MOIs and, for each change,
inserts one outbox row per matching subscription (``notifyMOICreation``, ``notifyMOIAttributeValueChanges``
with new and old values, ``notifyMOIDeletion``). The outbox is delivered only after the transaction
commits (:mod:`sluice.service.outbox`), so a notification is never sent for a change that was rolled back
and never lost for one that was committed.

Subscriptions (``NtfSubscriptionControl``) match by ``notificationTypes``, ``scope`` (relative to the
subscription's parent: ``BASE_ONLY``, ``BASE_NTH_LEVEL`` with ``scopeLevel``, ``BASE_SUBTREE``/``BASE_ALL``;
default all) and ``notificationFilter``. Sluice reads a filter as one or more node paths separated by
``|``: ``MLTrainingProcess`` or ``/SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingRequest=R1``; an MOI
matches when its LDN ends with the path's last node (a class alone matches every id) under the path's
leading nodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sluice.service.db import MOI, Notification
from sluice.service.nrm import ldn_to_dn, now_iso, parent_of, vs_container


def _depth(ldn: str) -> int:
    return ldn.count("/") + 1


def _filter_matches(flt: str | None, ldn: str) -> bool:
    if not flt or not flt.strip():
        return True
    for alt in flt.split("|"):
        path = alt.strip().strip("/")
        if not path:
            continue
        nodes = path.split("/")
        last = nodes[-1]
        head = "/".join(nodes[:-1])
        if head and not ldn.startswith(head + "/"):
            continue
        leaf = ldn.rpartition("/")[2]
        if ("=" in last and leaf == last) or ("=" not in last and leaf.partition("=")[0] == last):
            return True
    return False


def subscription_matches(sub: MOI, ldn: str, ntype: str) -> bool:
    """Whether subscription ``sub`` wants a notification of type ``ntype`` about MOI ``ldn``."""
    a = sub.attributes
    types = a.get("notificationTypes")
    if types and ntype not in types:
        return False
    base = sub.parent_dn or ""
    if base and ldn != base and not ldn.startswith(base + "/"):
        return False
    scope = a.get("scope") or {}
    stype = scope.get("scopeType", "BASE_ALL")
    rel = _depth(ldn) - (_depth(base) if base else 0)
    if stype == "BASE_ONLY" and rel != 0:
        return False
    if stype == "BASE_NTH_LEVEL" and rel != int(scope.get("scopeLevel", 0)):
        return False
    return _filter_matches(a.get("notificationFilter"), ldn)


class Tx:
    """One write transaction; see the module docstring."""

    def __init__(self, store: Store, session: Session) -> None:
        self.store = store
        self.s = session
        self.notified = 0
        self._subs: list[MOI] | None = None

    # ------------------------------------------------------------------ reads
    def get(self, ldn: str) -> MOI | None:
        return self.s.get(MOI, ldn)

    def children(self, ldn: str, cls: str | None = None) -> list[MOI]:
        q = sa.select(MOI).where(MOI.parent_dn == ldn)
        if cls is not None:
            q = q.where(MOI.object_class == cls)
        return list(self.s.scalars(q.order_by(MOI.seq)))

    def of_class(self, cls: str) -> list[MOI]:
        return list(self.s.scalars(sa.select(MOI).where(MOI.object_class == cls).order_by(MOI.seq)))

    # ------------------------------------------------------------------ writes
    def create(self, ldn: str, cls: str, attributes: dict[str, Any], vs_data: dict[str, Any] | None = None,
               internal: dict[str, Any] | None = None) -> MOI:
        t = time.time()
        seq = (self.s.scalar(sa.select(sa.func.max(MOI.seq))) or 0) + 1
        row = MOI(dn=ldn, parent_dn=parent_of(ldn), object_class=cls, seq=seq, attributes=dict(attributes),
                  vs_data=dict(vs_data or {}), internal=dict(internal or {}), version=1, created_at=t, updated_at=t)
        self.s.add(row)
        self.s.flush()
        if cls == "NtfSubscriptionControl":
            self._subs = None
        else:
            shown: dict[str, Any] = {k: v for k, v in row.attributes.items()}
            if row.vs_data:  # a report's cause and criterion reach the subscriber with its creation
                shown["VsDataContainer"] = [vs_container(k, v) for k, v in row.vs_data.items()]
            self._notify(ldn, "notifyMOICreation", {"attributeList": shown or {"objectClass": cls}})
        return row

    def update(self, row: MOI, *, attributes: dict[str, Any] | None = None, vs_data: dict[str, Any] | None = None,
               internal: dict[str, Any] | None = None, notify: bool = True) -> dict[str, Any]:
        """Set new values (whole dicts); returns the attributes that changed (name → new value) and
        notifies their change with the old values."""
        changed_new: dict[str, Any] = {}
        changed_old: dict[str, Any] = {}
        if attributes is not None:
            old = row.attributes or {}
            for k in set(old) | set(attributes):
                if old.get(k) != attributes.get(k):
                    changed_new[k] = attributes.get(k)
                    if k in old:
                        changed_old[k] = old[k]
            row.attributes = dict(attributes)
        if vs_data is not None:
            row.vs_data = dict(vs_data)
        if internal is not None:
            row.internal = dict(internal)
        row.version = (row.version or 0) + 1
        row.updated_at = time.time()
        if row.object_class == "NtfSubscriptionControl":
            self._subs = None
        elif changed_new and notify:
            changes = [changed_new] + ([changed_old] if changed_old else [])
            self._notify(row.dn, "notifyMOIAttributeValueChanges", {"attributeListValueChanges": changes})
        return changed_new

    def delete(self, row: MOI) -> None:
        ldn, cls = row.dn, row.object_class
        attrs = dict(row.attributes)
        self.s.delete(row)
        self.s.flush()
        if cls == "NtfSubscriptionControl":
            self._subs = None
            self.s.execute(sa.delete(Notification).where(Notification.subscription_dn == ldn,
                                                         Notification.delivered_at.is_(None)))
        else:
            self._notify(ldn, "notifyMOIDeletion", {"attributeList": attrs or {"objectClass": cls}})

    # ------------------------------------------------------------------ outbox
    def _notify(self, ldn: str, ntype: str, body: dict[str, Any]) -> None:
        if self._subs is None:
            self._subs = self.of_class("NtfSubscriptionControl")
        t = time.time()
        for sub in self._subs:
            if not subscription_matches(sub, ldn, ntype):
                continue
            payload = {
                "href": self.store.href(ldn),
                "notificationType": ntype,
                "eventTime": now_iso(t),
                "systemDN": self.store.system_dn,
                "subscriptionId": ldn_to_dn(sub.dn),
                **body,
            }
            self.s.add(Notification(subscription_dn=sub.dn, recipient=sub.attributes["notificationRecipientAddress"],
                                    payload=payload, created_at=t, attempts=0, next_attempt_at=t, dropped=False))
            self.notified += 1


class Store:
    """The database of one service; :meth:`write` for changes, :meth:`read` for queries."""

    def __init__(self, engine: sa.Engine, system_dn: str, href: Callable[[str], str]) -> None:
        self.engine = engine
        self.system_dn = system_dn
        self.href = href
        self.lock = threading.RLock()
        self.committed = threading.Event()
        """Set after every commit that queued notifications (the outbox waits on it)."""

    @contextmanager
    def write(self) -> Iterator[Tx]:
        with self.lock:
            with Session(self.engine, expire_on_commit=False) as s:
                tx = Tx(self, s)
                with s.begin():
                    yield tx
            if tx.notified:
                self.committed.set()

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as s:
            yield s

    def get(self, ldn: str) -> MOI | None:
        with self.read() as s:
            return s.get(MOI, ldn)
