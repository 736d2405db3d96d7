"""The producer behind the REST interface: requests, processes, reports, models and subscriptions.

Resources and who writes them (LDNs under ``SubNetwork={sn}``)::

    MLTrainingFunction={tf}/MLTrainingRequest={id}   consumer creates/modifies; requestStatus is the producer's
    MLTrainingFunction={tf}/MLTrainingProcess={id}   producer creates one per (re)training; consumer PATCHes controls
    MLTrainingFunction={tf}/MLTrainingReport={id}    producer creates when a process ends (read-only)
    MLModelRepository={mr}/MLModel={id}              producer creates with the trained model (read-only, downloadable)
    NtfSubscriptionControl={id}                      consumer creates/deletes

A request carries Sluice's job in VsDataContainer entries: ``sluice-job`` (the engine kind and its
configuration, as in a job TOML file, with ``model.id/version/type``; its ``[task]`` names a built-in task
or one registered in the service's ``[tasks]``, never an import path: :mod:`sluice.service.tasks`),
``sluice-requirements`` (R1; the
3GPP ``performanceRequirements`` add their thresholds), ``sluice-termination`` (T1) and
``sluice-negotiation`` (``decidedBy``: ``consumer`` — the default when termination parameters are sent —,
``producer`` — the default otherwise — or ``negotiated``: the producer proposes and the process waits
in ``AWAITING_AGREEMENT`` until the consumer accepts (``{"accept": true}``) or modifies the proposal by
PATCHing the process). Feedback (``sluice-feedback`` on the request: ``{"metric", "value"}``) and new
training data on an ended process start a retraining (T7): a new process, the next model version.

Process life (``internal.phase``, :class:`~sluice.control.lifecycle.Phase`): ``proposed`` → ``queued`` →
``starting`` → ``running`` → ``ended``, as the pure transitions of :mod:`sluice.control.lifecycle`; this
module carries out their effects. The request's ``requestStatus`` follows its latest process: NOT_STARTED
(proposed, queued, starting), IN_PROGRESS (running or awaiting data), SUSPENDED, CANCELLING (cancel asked,
not yet ended), FINISHED, CANCELLED (cancelled, or refused before training: feasibility, a job that cannot be
built).

The class is one producer made of parts: this module (start, stop, recovery, reads, deletes, subscriptions),
:mod:`~sluice.service.requests`, :mod:`~sluice.service.processes`, :mod:`~sluice.service.retraining` and
:mod:`~sluice.service.messages` (the queue and the worker's messages), over :mod:`~sluice.service.base`.
"""

from __future__ import annotations

import threading
from typing import Any

from sluice.service.auth import Actor, may_see, tag
from sluice.service.base import _phase
from sluice.service.capabilities import Prober
from sluice.service.cascade import delete_request_tree
from sluice.service.config import ServiceConfig
from sluice.service.db import MOI, Artifact, make_engine, migrate
from sluice.service.messages import WorkerMessagesMixin
from sluice.service.nrm import (
    CM_NOTIFICATION_TYPES,
    MnSError,
    check_id,
    id_of,
    ldn_to_dn,
    read_vs,
)
from sluice.service.outbox import Outbox
from sluice.service.processes import ProcessesMixin
from sluice.service.requests import RequestsMixin
from sluice.service.retraining import RetrainingMixin
from sluice.service.store import Store, Tx
from sluice.service.worker import Supervisor

__all__ = ["TrainingService"]


class TrainingService(RequestsMixin, ProcessesMixin, RetrainingMixin, WorkerMessagesMixin):
    """One producer: its store, outbox and supervisor; every operation of the REST interface."""

    def __init__(self, cfg: ServiceConfig, public_url: str) -> None:
        self.cfg = cfg
        self.public_url = public_url.rstrip("/")
        sn = f"SubNetwork={cfg.subnetwork}"
        self.sn = sn
        self.tf = f"{sn}/MLTrainingFunction={cfg.training_function}"
        self.repo = f"{sn}/MLModelRepository={cfg.model_repository}"
        self.db = make_engine(cfg.database)
        migrate(self.db)
        self.store = Store(self.db, system_dn=ldn_to_dn(sn), href=self.href)
        self.outbox = Outbox(self.store, timeout_s=cfg.notify_timeout_s, max_attempts=cfg.notify_max_attempts,
                             backoff_s=cfg.notify_backoff_s, ca_file=cfg.notify_ca_file)
        self.supervisor = Supervisor(cfg.max_concurrent, self._next_spec, self._on_message,
                                     start_method=cfg.worker_start, call_timeout_s=cfg.call_timeout_s)
        self.prober = Prober(self.supervisor.ctx)
        self._last_progress: dict[str, float] = {}
        self._policy_lock = threading.Lock()
        from sluice.service.chain_cancels import ChainCancels  # the producers' requests of ended chains
        self.chain_cancels = ChainCancels(self.store, cfg.producers)

    def href(self, ldn: str) -> str:
        return f"{self.public_url}{self.cfg.base_path}/{ldn}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> TrainingService:
        with self.store.write() as tx:
            for ldn, cls, attrs in (
                (self.sn, "SubNetwork", {"userLabel": "Sluice"}),
                (self.tf, "MLTrainingFunction", {"mLModelRepositoryRef": ldn_to_dn(self.repo)}),
                (self.repo, "MLModelRepository", {}),
            ):
                if tx.get(ldn) is None:
                    tx.create(ldn, cls, attrs)
            self._recover(tx)
        self.outbox.start()
        self.supervisor.start()
        self.chain_cancels.start()
        return self

    def stop(self) -> None:
        self.supervisor.stop()
        self.outbox.stop()
        self.chain_cancels.stop()
        self.db.dispose()

    def _recover(self, tx: Tx) -> None:
        """Processes that were starting or running when the service stopped lost their worker with it: each
        goes back to the queue or ends (:meth:`_requeue_interrupted`). Queued ones stay queued."""
        for row in tx.of_class("MLTrainingProcess"):
            if _phase(row).active:
                self._requeue_interrupted(tx, row, "the service stopped")

    # ------------------------------------------------------------------ reads
    def get(self, ldn: str, actor: Actor | None = None) -> MOI:
        """The MOI at ``ldn``; 404 when there is none or ``actor`` may not see it (None: no restriction)."""
        row = self.store.get(ldn)
        if row is None or not may_see(actor, row.internal.get("owner"), row.object_class):
            raise MnSError(404, f"no managed object {ldn_to_dn(ldn)}", bad_objects=[ldn_to_dn(ldn)])
        return row

    def subtree(self, ldn: str, level: int | None, actor: Actor | None = None) -> list[MOI]:
        """MOIs below ``ldn`` down to ``level`` levels (None: all) that ``actor`` may see, in creation order."""
        import sqlalchemy as sa

        with self.store.read() as s:
            rows = list(s.scalars(sa.select(MOI).where(MOI.dn.like(ldn.replace("%", r"\%") + "/%", escape="\\"))
                                  .order_by(MOI.seq)))
        base = ldn.count("/")
        return [r for r in rows if (level is None or r.dn.count("/") - base <= level)
                and may_see(actor, r.internal.get("owner"), r.object_class)]

    def artifact(self, model_ldn: str) -> Artifact:
        with self.store.read() as s:
            art = s.get(Artifact, model_ldn)
        if art is None:
            raise MnSError(404, f"model {ldn_to_dn(model_ldn)} has no stored file", bad_objects=[ldn_to_dn(model_ldn)])
        return art

    # ------------------------------------------------------------------ delete
    def delete_request(self, ldn: str) -> None:
        req = self.get(ldn)
        proc = self.store.get(req.internal.get("current", ""))
        if proc is not None and _phase(proc).active:
            raise MnSError(409, f"the request is {req.attributes.get('requestStatus')}: cancel it "
                           "(cancelRequest: true) and delete it once it has ended")
        if proc is not None and _phase(proc).pending:
            self._cancel(proc.dn)
        with self.store.write() as tx:
            cur = tx.get(ldn)
            if cur is not None:
                delete_request_tree(tx, cur)  # its processes and reports go with it, its models stay

    # ------------------------------------------------------------------ subscriptions
    def put_subscription(self, ldn: str, body: dict[str, Any], actor: Actor | None = None) -> tuple[MOI, bool]:
        """Create (owned by ``actor``) or replace (404 when ``actor`` may not see it) a subscription."""
        check_id(id_of(ldn))
        if self.store.get(ldn) is not None:
            self.get(ldn, actor)
        attrs = self._check_attrs("NtfSubscriptionControl", body.get("attributes") or {})
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
        with self.outbox.send_lock, self.store.write() as tx:
            cur = tx.get(ldn)
            if cur is None:
                return tx.create(ldn, "NtfSubscriptionControl", attrs, None, tag(actor)), True
            tx.update(cur, attributes=attrs)
            return cur, False

    def delete_subscription(self, ldn: str) -> None:
        self.get(ldn)
        with self.outbox.send_lock, self.store.write() as tx:
            cur = tx.get(ldn)
            if cur is not None:
                tx.delete(cur)
