"""Subscriptions: the consumer's ``NtfSubscriptionControl`` resources, which the outbox sends notifications to."""

from __future__ import annotations

from typing import Any

from sluice.service.auth import Actor, tag
from sluice.service.base import Shared, check_attrs
from sluice.service.db import MOI
from sluice.service.nrm import CM_NOTIFICATION_TYPES, MnSError, check_id, id_of, read_vs
from sluice.service.outbox import Outbox


class Subscriptions:
    """Create, replace and delete subscriptions; each write takes the ``outbox``'s send lock, so no notification
    is in flight to a subscription while it changes (none reaches a subscriber after its ``DELETE`` answered)."""

    def __init__(self, shared: Shared, outbox: Outbox) -> None:
        self.shared = shared
        self.outbox = outbox

    def put(self, ldn: str, body: dict[str, Any], actor: Actor | None = None) -> tuple[MOI, bool]:
        """Create (owned by ``actor``) or replace (404 when ``actor`` may not see it) a subscription."""
        check_id(id_of(ldn))
        if self.shared.store.get(ldn) is not None:
            self.shared.get(ldn, actor)
        attrs = check_attrs("NtfSubscriptionControl", body.get("attributes") or {})
        read_vs(body, "NtfSubscriptionControl")
        addr = attrs.get("notificationRecipientAddress")
        if not isinstance(addr, str) or not addr.startswith(("http://", "https://")):
            raise MnSError(400, "notificationRecipientAddress must be an http(s) URI",
                           bad_attributes=["notificationRecipientAddress"])
        types = attrs.get("notificationTypes")
        if types is not None:
            bad = [t for t in types if t not in CM_NOTIFICATION_TYPES] if isinstance(types, list) else [types]
            if bad:
                raise MnSError(400, f"notificationTypes: this producer sends {', '.join(CM_NOTIFICATION_TYPES)}; "
                               f"got {bad}", bad_attributes=["notificationTypes"])
        scope = attrs.get("scope")
        if scope is not None:
            st = scope.get("scopeType", "BASE_ALL") if isinstance(scope, dict) else None
            if st not in ("BASE_ONLY", "BASE_NTH_LEVEL", "BASE_SUBTREE", "BASE_ALL"):
                raise MnSError(400, "scope.scopeType must be BASE_ONLY, BASE_NTH_LEVEL, BASE_SUBTREE or BASE_ALL",
                               bad_attributes=["scope"])
        with self.outbox.send_lock, self.shared.store.write() as tx:
            cur = tx.get(ldn)
            if cur is None:
                return tx.create(ldn, "NtfSubscriptionControl", attrs, None, tag(actor)), True
            tx.update(cur, attributes=attrs)
            return cur, False

    def delete(self, ldn: str) -> None:
        """Delete the subscription at ``ldn`` (404 when there is none)."""
        self.shared.get(ldn)
        with self.outbox.send_lock, self.shared.store.write() as tx:
            cur = tx.get(ldn)
            if cur is not None:
                tx.delete(cur)
