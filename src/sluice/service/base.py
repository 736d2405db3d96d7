"""What the parts of :class:`sluice.service.core.TrainingService` share: :class:`Shared` (one producer's
configuration, store and LDNs) and the store updates and checks that need nothing else. Each part
(:mod:`~sluice.service.requests`, :mod:`~sluice.service.processes`, :mod:`~sluice.service.proposals`,
:mod:`~sluice.service.retraining`, :mod:`~sluice.service.messages`, :mod:`~sluice.service.subscriptions`) is
a class constructed with what it uses of these and the parts it calls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sluice.control.lifecycle import Phase, ProcessRecord, request_status
from sluice.service.auth import Actor, may_see
from sluice.service.db import MOI
from sluice.service.nrm import READ_ONLY, WRITABLE, MnSError, ldn_to_dn
from sluice.service.worker import WorkerGone

if TYPE_CHECKING:
    from sluice.service.config import ServiceConfig
    from sluice.service.store import Store, Tx
    from sluice.service.worker import Supervisor

ENDED = ("FINISHED", "FAILED", "CANCELLED")
_DUMP: dict[str, Any] = {"mode": "json", "exclude_none": True, "exclude_defaults": True}


def _phase(proc: MOI) -> Phase:
    return Phase.of(proc.internal)


@dataclass(frozen=True)
class Shared:
    """One producer as its parts see it: its configuration, its store, the LDNs of its training function
    (``tf``) and model repository (``repo``)."""

    cfg: ServiceConfig
    store: Store
    tf: str
    repo: str

    def get(self, ldn: str, actor: Actor | None = None) -> MOI:
        """The MOI at ``ldn``; 404 when there is none or ``actor`` may not see it (None: no restriction)."""
        row = self.store.get(ldn)
        if row is None or not may_see(actor, row.internal.get("owner"), row.object_class):
            raise MnSError(404, f"no managed object {ldn_to_dn(ldn)}", bad_objects=[ldn_to_dn(ldn)])
        return row


def process_request_status(proc: MOI) -> str:
    """The ``requestStatus`` a request shows while ``proc`` is its latest process."""
    return request_status(ProcessRecord.of(proc.internal), proc.attributes.get("progressStatus", {}).get("status"))


def sync_request(tx: Tx, proc: MOI) -> None:
    """The request of ``proc`` takes the status of ``proc`` when ``proc`` is its latest process."""
    req = tx.get(proc.internal["request"])
    if req is None or req.internal.get("current") != proc.dn:
        return
    attrs = dict(req.attributes)
    attrs["requestStatus"] = process_request_status(proc)
    if attrs != req.attributes:
        tx.update(req, attributes=attrs)


def set_process(tx: Tx, proc: MOI, *, attrs: dict[str, Any] | None = None, vs: dict[str, Any] | None = None,
                internal: dict[str, Any] | None = None) -> None:
    """Update ``proc``'s attributes, vsData and internal state (each merged key by key); its request follows."""
    a = dict(proc.attributes)
    a.update(attrs or {})
    v = dict(proc.vs_data)
    v.update(vs or {})
    i = dict(proc.internal)
    i.update(internal or {})
    tx.update(proc, attributes=a, vs_data=v, internal=i)
    sync_request(tx, proc)


def check_attrs(cls: str, attrs: Any, *, old: dict[str, Any] | None = None) -> dict[str, Any]:
    """The writable attributes of ``attrs`` for class ``cls``; 400 for a changed read-only one (unchanged from
    ``old``: ignored), an unknown one, or a control flag that is not a boolean."""
    if not isinstance(attrs, dict):
        raise MnSError(400, "attributes must be an object", bad_attributes=["attributes"])
    ro = sorted(k for k in attrs if k in READ_ONLY[cls] and (old is None or attrs[k] != old.get(k)))
    if ro:
        raise MnSError(400, f"read-only attributes of {cls}: {', '.join(ro)} (the producer sets them)",
                       bad_attributes=ro)
    unknown = sorted(k for k in attrs if k not in WRITABLE[cls] and k not in READ_ONLY[cls])
    if unknown:
        raise MnSError(400, f"{cls} has no attribute {', '.join(unknown)}", bad_attributes=unknown)
    for k in ("cancelRequest", "suspendRequest", "cancelProcess", "suspendProcess"):
        if k in attrs and not isinstance(attrs[k], bool):
            raise MnSError(400, f"{k} must be true or false", bad_attributes=[k])
    return {k: v for k, v in attrs.items() if k not in READ_ONLY[cls]}


def call_worker(supervisor: Supervisor, proc: MOI, cmd: dict[str, Any], attr: str) -> None:
    """Send the worker of ``proc`` a command and wait for its answer: 409 when it has no worker any more,
    503 when it did not answer in time, 400 (naming ``attr``) when it refused."""
    try:
        ack = supervisor.call(proc.dn, cmd)
    except WorkerGone as exc:
        raise MnSError(409, "the training process is not running any more", bad_attributes=[attr]) from exc
    if not ack.get("ok"):
        status = 503 if ack.get("timeout") else 400
        raise MnSError(status, f"the training process refused it: {ack.get('error')}", bad_attributes=[attr])
