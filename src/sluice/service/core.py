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

The class is one producer made of parts, each a class constructed with what it uses
(:class:`~sluice.service.base.Shared`: the configuration, the store and the LDNs; the supervisor, the outbox;
the parts it calls): ``requests`` (:mod:`~sluice.service.requests`), ``processes``
(:mod:`~sluice.service.processes`), ``proposals`` (:mod:`~sluice.service.proposals`), ``retraining``
(:mod:`~sluice.service.retraining`), ``messages`` (the queue and the worker's messages:
:mod:`~sluice.service.messages`) and ``subscriptions`` (:mod:`~sluice.service.subscriptions`). This module
builds them, starts and stops the background parts (outbox, supervisor, chain cancels), recovers the processes
a stop interrupted, and reads.
"""

from __future__ import annotations

from sluice.service.auth import Actor, may_see
from sluice.service.base import Shared, _phase
from sluice.service.capabilities import Prober
from sluice.service.chain_cancels import ChainCancels
from sluice.service.config import ServiceConfig
from sluice.service.db import MOI, Artifact, make_engine, migrate
from sluice.service.messages import WorkerMessages
from sluice.service.nrm import MnSError, ldn_to_dn
from sluice.service.outbox import Outbox
from sluice.service.processes import Processes
from sluice.service.proposals import Proposals
from sluice.service.requests import Requests
from sluice.service.retraining import Retraining
from sluice.service.store import Store
from sluice.service.subscriptions import Subscriptions
from sluice.service.worker import Supervisor

__all__ = ["TrainingService"]


class TrainingService:
    """One producer: its store, outbox and supervisor, and the parts that carry out the REST interface's
    operations (``requests``, ``processes``, ``retraining``, ``subscriptions``) and the workers' messages
    (``messages``)."""

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
        self.chain_cancels = ChainCancels(self.store, cfg.producers)  # the producers' requests of ended chains
        shared = Shared(cfg, self.store, self.tf, self.repo)
        self.shared = shared
        self.proposals = Proposals(shared)
        self.messages = WorkerMessages(shared, self.chain_cancels, self.proposals.history_and_shapes)
        self.supervisor = Supervisor(cfg.max_concurrent, self.messages.next_spec, self.messages.on_message,
                                     start_method=cfg.worker_start, call_timeout_s=cfg.call_timeout_s)
        self.prober = Prober(self.supervisor.ctx)
        self.retraining = Retraining(shared, self.supervisor, self.proposals.new_process)
        self.processes = Processes(shared, self.supervisor, self.messages.end_process, self.retraining.upload)
        self.requests = Requests(shared, self.supervisor, self.prober, self.proposals, self.processes,
                                 self.retraining)
        self.subscriptions = Subscriptions(shared, self.outbox)

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
            for row in tx.of_class("MLTrainingProcess"):  # their worker stopped with the service
                if _phase(row).active:
                    self.messages.requeue_interrupted(tx, row, "the service stopped")
        self.outbox.start()
        self.supervisor.start()
        self.chain_cancels.start()
        return self

    def stop(self) -> None:
        self.supervisor.stop()
        self.outbox.stop()
        self.chain_cancels.stop()
        self.db.dispose()

    # ------------------------------------------------------------------ reads
    def get(self, ldn: str, actor: Actor | None = None) -> MOI:
        """The MOI at ``ldn``; 404 when there is none or ``actor`` may not see it (None: no restriction)."""
        return self.shared.get(ldn, actor)

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
