"""Transactions over the MOI store, with the notifications of each change written in the same transaction.

Every write goes through :meth:`Store.write`: one database transaction, and one writer at a time. Within a
process a lock serialises them (all writers of a service live in its web server's process, so SQLite never
sees two writers). On PostgreSQL each write transaction also starts with ``pg_advisory_xact_lock`` on
:data:`WRITE_LOCK_KEY`, held until it commits or rolls back, so writers in several processes or hosts
sharing one database are serialised too. Hence the next ``seq`` (``max + 1``) is read under the lock, and
outbox ids (from a sequence, assigned at insert) increase in commit order: the outbox, reading committed
rows by id, never sees a smaller id commit after a larger one. :func:`check_storable` refuses, on every
backend, the values PostgreSQL could not store. :class:`Tx` creates, updates and deletes MOIs and, for each
change, inserts one outbox row per matching subscription (``notifyMOICreation``, ``notifyMOIAttributeValueChanges``
with new and old values, ``notifyMOIDeletion``). The outbox is delivered only after the transaction
commits (:mod:`sluice.service.outbox`), so a notification is never sent for a change that was rolled back
and never lost for one that was committed.

Subscriptions (``NtfSubscriptionControl``) match by ``notificationTypes``, ``scope`` (relative to the
subscription's parent: ``BASE_ONLY``, ``BASE_NTH_LEVEL`` with ``scopeLevel``, ``BASE_SUBTREE``/``BASE_ALL``;
default all) and ``notificationFilter``. Sluice reads a filter as one or more node paths separated by
``|``: ``MLTrainingProcess``, ``MLTrainingFunction=TF1/MLTrainingReport`` or
``/SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingRequest=R1``; an MOI matches when its LDN ends with the
path's last node (a class alone matches every id) and the path's leading nodes name a run of consecutive
RDNs above it, from the root or from any node below it (each a ``Class=id``, or a ``Class`` for any id).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from sluice.service.auth import creator, may_see
from sluice.service.db import MOI, Notification
from sluice.service.nrm import MnSError, ldn_to_dn, now_iso, parent_of, vs_container

WRITE_LOCK_KEY = 0x736C_7569_6365  # PostgreSQL advisory lock key of the store's writers ("sluice" in ASCII)
MAX_LDN = 1000  # width of moi.dn and moi.parent_dn
MAX_RECIPIENT = 2000  # width of notification.recipient


def _unstorable_text(value: Any) -> bool:
    """A string PostgreSQL cannot store as text or JSONB: one holding U+0000 or a lone surrogate."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return "\x00" in value


def _unstorable_in(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_unstorable_text(k) or _unstorable_in(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_unstorable_in(v) for v in value)
    return _unstorable_text(value)


def check_storable(ldn: str, cls: str, attributes: dict[str, Any] | None, vs_data: dict[str, Any] | None) -> None:
    """Refuse (400) what not every backend can store, so that SQLite and PostgreSQL accept the same MOIs: an
    LDN longer than :data:`MAX_LDN`, a subscription's recipient longer than :data:`MAX_RECIPIENT`, and
    strings holding U+0000 or unpaired surrogates (neither is valid text in PostgreSQL)."""
    if len(ldn) > MAX_LDN:
        raise MnSError(400, f"the name of the {cls} is {len(ldn)} characters long; at most {MAX_LDN} are kept",
                       bad_objects=[ldn_to_dn(ldn)])
    for name, value in (attributes or {}).items():
        if _unstorable_text(name) or _unstorable_in(value):
            raise MnSError(400, f"attribute {name!r} holds U+0000 or an unpaired surrogate",
                           bad_attributes=[name])
    for cid, value in (vs_data or {}).items():
        if _unstorable_text(cid) or _unstorable_in(value):
            raise MnSError(400, f"VsDataContainer {cid!r} holds U+0000 or an unpaired surrogate",
                           bad_attributes=[f"VsDataContainer/{cid}"])
    recipient = (attributes or {}).get("notificationRecipientAddress")
    if cls == "NtfSubscriptionControl" and isinstance(recipient, str) and len(recipient) > MAX_RECIPIENT:
        raise MnSError(400, f"notificationRecipientAddress is {len(recipient)} characters long; at most "
                            f"{MAX_RECIPIENT} are kept", bad_attributes=["notificationRecipientAddress"])


def _depth(ldn: str) -> int:
    return ldn.count("/") + 1


def _node_matches(node: str, rdn: str) -> bool:
    """Whether a node of a filter path (``Class=id``, or ``Class`` for any id) names RDN ``rdn``."""
    return rdn == node if "=" in node else rdn.partition("=")[0] == node


def _filter_matches(flt: str | None, ldn: str) -> bool:
    """Whether the MOI at ``ldn`` matches filter ``flt`` (see the module docstring)."""
    if not flt or not flt.strip():
        return True
    rdns = ldn.split("/")
    above = rdns[:-1]
    for alt in flt.split("|"):
        path = alt.strip().strip("/")
        if not path:
            continue
        *head, last = path.split("/")
        if not _node_matches(last, rdns[-1]):
            continue
        n = len(head)
        if any(all(_node_matches(h, r) for h, r in zip(head, above[i:i + n], strict=True))
               for i in range(len(above) - n + 1)):
            return True
    return False


def subscription_matches(sub: MOI, ldn: str, ntype: str, owner: str | None = None) -> bool:
    """Whether subscription ``sub`` wants a notification of type ``ntype`` about MOI ``ldn``, owned by
    ``owner``: a consumer's subscription hears of that consumer's MOIs only (:mod:`sluice.service.auth`)."""
    if not may_see(creator(sub.internal), owner, ldn.rpartition("/")[2].partition("=")[0]):
        return False
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
        self.changed: list[tuple[str, str]] = []
        """``(ldn, class)`` of every MOI this transaction created, changed or deleted, for :attr:`Store.listeners`."""
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
        check_storable(ldn, cls, attributes, vs_data)
        t = time.time()
        seq = (self.s.scalar(sa.select(sa.func.max(MOI.seq))) or 0) + 1
        row = MOI(dn=ldn, parent_dn=parent_of(ldn), object_class=cls, seq=seq, attributes=dict(attributes),
                  vs_data=dict(vs_data or {}), internal=dict(internal or {}), version=1, created_at=t, updated_at=t)
        self.s.add(row)
        self.s.flush()
        self.changed.append((ldn, cls))
        if cls == "NtfSubscriptionControl":
            self._subs = None
        else:
            shown: dict[str, Any] = {k: v for k, v in row.attributes.items()}
            if row.vs_data:  # a report's cause and criterion reach the subscriber with its creation
                shown["VsDataContainer"] = [vs_container(k, v) for k, v in row.vs_data.items()]
            self._notify(ldn, "notifyMOICreation", {"attributeList": shown or {"objectClass": cls}},
                         row.internal.get("owner"))
        return row

    def update(self, row: MOI, *, attributes: dict[str, Any] | None = None, vs_data: dict[str, Any] | None = None,
               internal: dict[str, Any] | None = None, notify: bool = True) -> dict[str, Any]:
        """Set new values (whole dicts); returns the attributes that changed (name → new value) and
        notifies their change with the old values."""
        check_storable(row.dn, row.object_class, attributes, vs_data)
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
        self.changed.append((row.dn, row.object_class))
        if row.object_class == "NtfSubscriptionControl":
            self._subs = None
        elif changed_new and notify:
            changes = [changed_new] + ([changed_old] if changed_old else [])
            self._notify(row.dn, "notifyMOIAttributeValueChanges", {"attributeListValueChanges": changes},
                         row.internal.get("owner"))
        return changed_new

    def delete(self, row: MOI) -> None:
        ldn, cls, owner = row.dn, row.object_class, row.internal.get("owner")
        attrs = dict(row.attributes)
        self.s.delete(row)
        self.s.flush()
        self.changed.append((ldn, cls))
        if cls == "NtfSubscriptionControl":
            self._subs = None
            self.s.execute(sa.delete(Notification).where(Notification.subscription_dn == ldn,
                                                         Notification.delivered_at.is_(None)))
        else:
            self._notify(ldn, "notifyMOIDeletion", {"attributeList": attrs or {"objectClass": cls}}, owner)

    # ------------------------------------------------------------------ outbox
    def _notify(self, ldn: str, ntype: str, body: dict[str, Any], owner: str | None) -> None:
        if self._subs is None:
            self._subs = self.of_class("NtfSubscriptionControl")
        t = time.time()
        for sub in self._subs:
            if not subscription_matches(sub, ldn, ntype, owner):
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
        self.listeners: list[Callable[[list[tuple[str, str]]], None]] = []
        """Called after every commit that changed MOIs with their ``(ldn, class)``, in the writer's thread (the
        dashboard's live feed): a listener must return at once."""

    @contextmanager
    def write(self) -> Iterator[Tx]:
        with self.lock:
            with Session(self.engine, expire_on_commit=False) as s:
                tx = Tx(self, s)
                with s.begin():
                    if self.engine.dialect.name == "postgresql":
                        s.execute(sa.text("SELECT pg_advisory_xact_lock(CAST(:key AS BIGINT))"),
                                  {"key": WRITE_LOCK_KEY})
                    yield tx
            if tx.notified:
                self.committed.set()
            if tx.changed:
                for listener in self.listeners:
                    listener(tx.changed)

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as s:
            yield s

    def get(self, ldn: str) -> MOI | None:
        with self.read() as s:
            return s.get(MOI, ldn)
