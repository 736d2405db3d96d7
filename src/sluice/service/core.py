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

Process life (``internal.phase``, :class:`~sluice.service.lifecycle.Phase`): ``proposed`` → ``queued`` →
``starting`` → ``running`` → ``ended``, as the pure transitions of :mod:`sluice.service.lifecycle`; this
module carries out their effects. The request's ``requestStatus`` follows its latest process: NOT_STARTED
(proposed, queued, starting), IN_PROGRESS (running or awaiting data), SUSPENDED, CANCELLING (cancel asked,
not yet ended), FINISHED, CANCELLED (cancelled, or refused before training: feasibility, a job that cannot be
built).
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from typing import Any

from sluice.config import merge_patch
from sluice.control.params import Cause, parse_requirements, parse_termination
from sluice.control.report import brief
from sluice.errors import ConfigError, SluiceError
from sluice.metrics import OPERATIONAL_METRICS
from sluice.service.auth import Actor, inherited, may_see, tag
from sluice.service.capabilities import Prober, fit_job, fit_proposal, inference_type
from sluice.service.cascade import delete_request_tree
from sluice.service.config import ServiceConfig
from sluice.service.db import MOI, Artifact, Checkpoint, Upload, make_engine, migrate
from sluice.service.identity import request_model, stored_identity
from sluice.service.lifecycle import (
    Agreed,
    Cancel,
    Checkpointed,
    Created,
    Ended,
    EndWith,
    Interrupted,
    Iteration,
    Phase,
    ProcessRecord,
    Refused,
    SendWorker,
    Started,
    Suspend,
    created,
    request_status,
    transition,
)
from sluice.service.nrm import (
    CM_NOTIFICATION_TYPES,
    READ_ONLY,
    WRITABLE,
    MnSError,
    check_id,
    id_of,
    ldn_to_dn,
    now_iso,
    read_vs,
    safe_id,
)
from sluice.service.outbox import Outbox
from sluice.service.store import Store, Tx
from sluice.service.tasks import check_args, producer_job, producer_task
from sluice.service.validate import check_data, parse_conditions
from sluice.service.validate import config_error as _config_error
from sluice.service.validate import finite as _finite
from sluice.service.vsdata import feedback as read_feedback
from sluice.service.vsdata import request_vs
from sluice.service.worker import Supervisor, WorkerGone

ENDED = ("FINISHED", "FAILED", "CANCELLED")
_DUMP: dict[str, Any] = {"mode": "json", "exclude_none": True, "exclude_defaults": True}


def _phase(proc: MOI) -> Phase:
    return Phase.of(proc.internal)


class TrainingService:
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
        self.supervisor = Supervisor(cfg.max_concurrent, self._pick_next, self._on_message,
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

    def _requeue_interrupted(self, tx: Tx, row: MOI, why: str, limit: int | None = None) -> None:
        """A process that lost its worker (``why``: the service stopped, or the worker died) goes back to the
        queue (before anything queued later) to resume from its last checkpoint, or from scratch when it has
        none and its engine trains here; one that can do neither, was being cancelled, or already lost ``limit``
        workers, ends (FAILED with the reason, or CANCELLED): :class:`~sluice.service.lifecycle.Interrupted`.
        Until its worker reports again a resuming process shows ``progressStateInfo`` RESUMING and its request stays
        IN_PROGRESS; iterations it repeats (those after the checkpoint) change nothing the consumer has
        already seen (``internal.resume.seen``)."""
        st = dict(row.vs_data.get("sluice-status") or {})
        done = int(st.get("iterations", 0) or 0)
        ckpt = tx.s.get(Checkpoint, row.dn)
        before = ProcessRecord.of(row.internal)
        after, effects = transition(before, Interrupted(why, None if ckpt is None else ckpt.iteration, done, limit))
        for end in effects:
            if isinstance(end, EndWith):
                report = {"cause": end.cause, "status": end.status, "detail": end.detail, "iterations": done,
                          "performance": st.get("metrics", {}), "duration_s": st.get("elapsed_s", 0.0),
                          "model": row.internal.get("model")}
                self._end_process(tx, row, report, None, None)
                return
        status = dict(row.attributes["progressStatus"])
        if status.get("status") != "SUSPENDED":
            status["progressStateInfo"] = "RESUMING"
        self._set_process(tx, row, attrs={"progressStatus": status}, internal=after.changes(before))

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

    # ------------------------------------------------------------------ requests: create / replace
    def _job_from(self, attrs: dict[str, Any], vs: dict[str, Any], rid: str) -> dict[str, Any]:
        """The job a request asks for, validated without building an engine: ``kind``, ``raw`` (engine
        configuration + model identity), ``model``, ``requirements``, ``termination``, ``decided_by``."""
        from sluice.jobs import ENGINE_KINDS

        asked = request_vs(attrs, vs)
        job = dict(asked.job)
        kind = job.pop("engine", self.cfg.default_engine)
        if kind not in ENGINE_KINDS:
            raise MnSError(400, f"sluice-job engine must be one of {', '.join(ENGINE_KINDS)}, got {kind!r}",
                           bad_attributes=["VsDataContainer/sluice-job"])
        for k in ("requirements", "termination"):
            if k in job:
                raise MnSError(400, f"{k} go in the VsDataContainer sluice-{k}, not in sluice-job",
                               bad_attributes=["VsDataContainer/sluice-job"])
        if kind == "chain":
            self._check_chain(job)
        req, term, decided = asked.requirements, asked.termination, asked.decided_by
        model = dict(job.get("model") or {})
        name = inference_type(attrs.get("aIMLInferenceName"), model.get("type"))
        if name and "type" not in model:
            model["type"] = name
        if model:
            job["model"] = model
        doc = dict(job)
        if req:
            doc["requirements"] = req
        if term is not None:
            doc["termination"] = term
        try:
            parsed = self._parse_job(kind, doc)
        except MnSError as exc:  # a scenario job trains its own type only
            if name and "model.type" in exc.reason:
                exc.bad_attributes = [*exc.bad_attributes, "aIMLInferenceName"]
            raise
        out = {
            "kind": kind, "raw": {k: v for k, v in doc.items() if k not in ("requirements", "termination")},
            "model": request_model(parsed.model.model_dump(mode="json"), model, rid),
            "requirements": None if parsed.requirements is None else parsed.requirements.model_dump(
                mode="json", exclude_none=True, exclude_defaults=True),
            "termination": None if parsed.termination is None else parsed.termination.model_dump(
                mode="json", exclude_none=True, exclude_defaults=True),
            "decided_by": decided,
        }
        return fit_job(out, attrs, self.prober.of(kind, producer_job(out["raw"], self.cfg.tasks)))

    def _parse_job(self, kind: str, doc: dict[str, Any]) -> Any:
        """``doc`` validated as this producer trains it: the task it names is a built-in or a registered one
        (never an import path; :mod:`sluice.service.tasks`), with arguments that fit its function."""
        from sluice.jobs import ENGINE_KINDS, job_from_dict
        from sluice.tasks.config import TaskConfig

        section = doc.get("task")
        checked = doc if section is None else {**doc, "task": producer_task(section, self.cfg.tasks)}
        try:
            parsed = job_from_dict(kind, checked)
        except (SluiceError, ValueError) as exc:
            raise _config_error(exc, "VsDataContainer/sluice-job") from exc
        if section is None:
            return parsed
        name = section.get("name") or getattr(getattr(parsed.config, "data", None), "dataset", None)
        if name is not None and (section.get("args") or name in self.cfg.tasks):
            check_args(name, section.get("args") or {}, self.cfg.tasks)  # built-ins without args: no torch here
        if name in self.cfg.tasks and "id" not in (doc.get("model") or {}):  # named as the consumer named it
            config = parsed.config.model_copy(update={"task": TaskConfig.model_construct(name=name)})
            parsed.model = parsed.model.model_copy(update={"id": ENGINE_KINDS[kind].default_model_id(config)})
        return parsed

    def _check_chain(self, job: dict[str, Any]) -> None:
        """A chained job names producers of this service's configuration and never their endpoints."""
        if "endpoints" in job:
            raise MnSError(400, "a chained job names its producers only; where they are is the service's "
                           "configuration", bad_attributes=["VsDataContainer/sluice-job"])
        names = job.get("producers")
        unknown = [n for n in names if n not in self.cfg.producers] if isinstance(names, list) else []
        if unknown:
            known = ", ".join(self.cfg.producers) or "none configured"
            raise MnSError(400, f"unknown producer(s) {', '.join(map(str, unknown))}; this service knows: {known}",
                           bad_attributes=["VsDataContainer/sluice-job"])

    def _check_attrs(self, cls: str, attrs: Any, *, old: dict[str, Any] | None = None) -> dict[str, Any]:
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

    def put_request(self, ldn: str, body: dict[str, Any], actor: Actor | None = None) -> tuple[MOI, bool]:
        """Create (True, owned by ``actor``) or replace (False; 404 when ``actor`` may not see it) the request."""
        if self.store.get(ldn) is None:
            return self.create_request(ldn, body, actor), True
        self.get(ldn, actor)
        return self.modify_request(ldn, body.get("attributes") or {}, read_vs(body, "MLTrainingRequest"),
                                   replace=True), False

    def new_request_id(self) -> str:
        return f"R{uuid.uuid4().hex[:12]}"

    def create_request(self, ldn: str, body: dict[str, Any], actor: Actor | None = None) -> MOI:
        check_id(id_of(ldn))
        attrs = self._check_attrs("MLTrainingRequest", body.get("attributes") or {})
        vs = read_vs(body, "MLTrainingRequest")
        job = self._job_from(attrs, vs, id_of(ldn))
        attrs.setdefault("cancelRequest", False)
        attrs.setdefault("suspendRequest", False)
        attrs["requestStatus"] = "NOT_STARTED"
        with self.store.write() as tx:
            if tx.get(ldn) is not None:
                raise MnSError(409, f"{ldn_to_dn(ldn)} exists")
            req = tx.create(ldn, "MLTrainingRequest", attrs, vs, {"processes": [], "job": job, **tag(actor)})
            proc = self._new_process(tx, req, job, trigger="CONSUMER_REQUEST", suspended=attrs["suspendRequest"])
            if attrs["cancelRequest"]:
                self._cancel_pending(tx, proc)
            self._sync_request(tx, proc)
        self.supervisor.wake()
        return self.get(ldn)

    # ------------------------------------------------------------------ processes: create / negotiate
    def _history(self) -> Any:
        from sluice.control.history import RunHistory, RunRecord, job_shape, reached_of

        hist = RunHistory()
        with self.store.read() as s:
            import sqlalchemy as sa

            shapes = {id_of(p.dn): job_shape(p.internal.get("kind"), p.internal.get("raw"), p.internal.get(
                "requirements")) for p in s.scalars(sa.select(MOI).where(MOI.object_class == "MLTrainingProcess"))}
            for row in s.scalars(sa.select(MOI).where(MOI.object_class == "MLTrainingReport").order_by(MOI.seq)):
                r = row.vs_data.get("sluice-report") or {}
                m = r.get("model") or {}
                try:
                    hist.add(RunRecord(model_id=m.get("id", "model"), model_type=m.get("type"),
                                       version=str(m.get("version", "1")), cause=r.get("cause", "ENGINE_FAILURE"),
                                       fired=(r.get("criterion") or {}).get("rule"),
                                       iterations=int(r.get("iterations") or 0),
                                       duration_s=float(r.get("duration_s") or 0.0),
                                       performance={k: v for k, v in (r.get("performance") or {}).items()
                                                    if _finite(v)}, run_id=id_of(row.dn),
                                       shape=shapes.get(id_of(row.dn)), reached=reached_of(r.get("criterion"))))
                except (ValueError, TypeError):
                    continue
        return hist

    def _propose(self, job: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        from sluice.control.history import job_shape
        from sluice.control.params import parse_model
        from sluice.control.producer import Producer

        def no_engine(*_: Any) -> Any:
            raise ConfigError("proposals need no engine")

        with self._policy_lock:
            producer = Producer(self.cfg.training_function, no_engine, self.cfg.policy, self._history())
            req = parse_requirements(job["requirements"]) if job["requirements"] else None
            try:
                prop = producer.propose(parse_model(job["model"]), req,
                                    shape=job_shape(job["kind"], job["raw"], job["requirements"]))
            except ConfigError as exc:  # a metric of the engine's own that the policy cannot judge
                raise MnSError(400, f"the producer cannot propose parameters for this request: {exc}; send them "
                               "(decidedBy consumer)", bad_attributes=["VsDataContainer/sluice-negotiation"]) from exc
        fit_proposal(prop.termination.model_dump(**_DUMP), job)
        return prop.termination.model_dump(**_DUMP), list(prop.rationale)

    def _new_process(self, tx: Tx, req: MOI, job: dict[str, Any], *, trigger: str, suspended: bool = False,
                     model: dict[str, Any] | None = None, last_report: str | None = None) -> MOI:
        n = len(req.internal.get("processes", [])) + 1
        pid = safe_id(f"{id_of(req.dn)}-{n}")
        while tx.get(f"{self.tf}/MLTrainingProcess={pid}") is not None:  # kept from a deleted request of this id
            n += 1
            pid = safe_id(f"{id_of(req.dn)}-{n}")
        ldn = f"{self.tf}/MLTrainingProcess={pid}"
        model = model or job["model"]
        decided = job["decided_by"]
        if trigger != "CONSUMER_REQUEST":
            decided = "agreed"
        neg: dict[str, Any] = {"decidedBy": job["decided_by"], "state": "AGREED"}
        termination = job["termination"]
        if decided in ("producer", "negotiated"):
            termination, rationale = self._propose(job)
            neg["proposal"] = termination
            neg["rationale"] = rationale
            if decided == "negotiated":
                neg["state"] = "PROPOSED"
        record = created(Created(negotiated=neg["state"] == "PROPOSED", suspended=bool(suspended), kind=job["kind"]))
        status = {"status": "NOT_STARTED", "progressPercentage": 0,
                  "progressStateInfo": "AWAITING_AGREEMENT" if record.phase is Phase.PROPOSED else "QUEUED",
                  "resultStateInfo": ""}
        if suspended and record.phase is Phase.QUEUED:
            status.update(status="SUSPENDED", progressStateInfo="SUSPENDED")
        attrs = {"priority": int(req.internal.get("priority", 0)),
                 "terminationConditions": brief(parse_termination(termination)) if termination else "",
                 "progressStatus": status, "cancelProcess": False, "suspendProcess": bool(suspended),
                 "trainingRequestRef": [ldn_to_dn(req.dn)]}
        vs = {"sluice-negotiation": neg, "sluice-status": {"state": status["status"], "iterations": 0}}
        if termination is not None:
            vs["sluice-termination"] = termination
        if job["requirements"]:
            vs["sluice-requirements"] = job["requirements"]
        internal = {"phase": record.phase.value, "request": req.dn, "kind": job["kind"], "raw": job["raw"],
                    "model": model, "trigger": trigger, "termination": termination,
                    "requirements": job["requirements"], "suspended": record.suspended, "queued_at": time.time(),
                    "last_report": last_report,
                    **inherited(req.internal)}
        proc = tx.create(ldn, "MLTrainingProcess", attrs, vs, internal)
        ri = dict(req.internal)
        ri["processes"] = [*ri.get("processes", []), ldn]
        ri["current"] = ldn
        tx.update(req, internal=ri, notify=False)
        return proc

    # ------------------------------------------------------------------ request status
    @staticmethod
    def _request_status(proc: MOI) -> str:
        return request_status(ProcessRecord.of(proc.internal), proc.attributes.get("progressStatus", {}).get("status"))

    def _sync_request(self, tx: Tx, proc: MOI) -> None:
        req = tx.get(proc.internal["request"])
        if req is None or req.internal.get("current") != proc.dn:
            return
        attrs = dict(req.attributes)
        attrs["requestStatus"] = self._request_status(proc)
        if attrs != req.attributes:
            tx.update(req, attributes=attrs)

    def _set_process(self, tx: Tx, proc: MOI, *, attrs: dict[str, Any] | None = None,
                     vs: dict[str, Any] | None = None, internal: dict[str, Any] | None = None) -> None:
        a = dict(proc.attributes)
        a.update(attrs or {})
        v = dict(proc.vs_data)
        v.update(vs or {})
        i = dict(proc.internal)
        i.update(internal or {})
        tx.update(proc, attributes=a, vs_data=v, internal=i)
        self._sync_request(tx, proc)

    # ------------------------------------------------------------------ requests: modify
    def modify_request(self, ldn: str, attrs_in: dict[str, Any], vs_in: dict[str, Any], *, replace: bool,
                       merge: bool = False) -> MOI:
        """Apply new attributes and VsData to a request: PUT replaces the writable attributes and
        containers, a merge patch merges them (``merge``). Cancel, suspend/resume, requirement and
        termination changes act on the current process; feedback may start a retraining."""
        req = self.get(ldn)
        old_attrs = {k: v for k, v in req.attributes.items() if k != "requestStatus"}
        old_vs = {k: v for k, v in req.vs_data.items() if k not in ("sluice-trigger",)}
        if merge:
            attrs = self._check_attrs("MLTrainingRequest", merge_patch(old_attrs, attrs_in) if isinstance(
                attrs_in, dict) else attrs_in, old=req.attributes)
            vs = dict(old_vs)
            for k, v in vs_in.items():
                if v is None:
                    vs.pop(k, None)
                elif k == "sluice-feedback":
                    vs[k] = v
                else:
                    vs[k] = merge_patch(old_vs.get(k), v) if isinstance(v, dict) else v
        else:
            attrs = self._check_attrs("MLTrainingRequest", attrs_in, old=req.attributes)
            vs = dict(vs_in)
        attrs.setdefault("cancelRequest", old_attrs.get("cancelRequest", False))
        attrs.setdefault("suspendRequest", old_attrs.get("suspendRequest", False))
        feedback = vs.pop("sluice-feedback", None)
        proc = self.get(req.internal["current"])
        ended = _phase(proc) is Phase.ENDED
        job_keys = ("sluice-job", "sluice-requirements", "sluice-termination", "sluice-negotiation")
        job_attrs = ("performanceRequirements", "aIMLInferenceName")
        job_changed = any(vs.get(k) != old_vs.get(k) for k in job_keys) or any(
            attrs.get(k) != old_attrs.get(k) for k in job_attrs)
        new_job = self._job_from(attrs, vs, id_of(ldn)) if job_changed else req.internal["job"]
        cancel = attrs["cancelRequest"] and not old_attrs.get("cancelRequest", False)
        suspend_change = attrs["suspendRequest"] != old_attrs.get("suspendRequest", False)
        if cancel and ended and proc.attributes["progressStatus"]["status"] != "CANCELLED":
            raise MnSError(409, f"the request has ended ({req.attributes.get('requestStatus')}); it cannot be "
                           "cancelled", bad_attributes=["cancelRequest"])
        if suspend_change and ended:
            raise MnSError(409, f"the request has ended ({req.attributes.get('requestStatus')}); it cannot be "
                           "suspended or resumed", bad_attributes=["suspendRequest"])
        if job_changed and not ended and _phase(proc).active:
            old_job = req.internal["job"]
            if (new_job["kind"], new_job["raw"], new_job["decided_by"]) != (
                    old_job["kind"], old_job["raw"], old_job["decided_by"]):
                raise MnSError(409, "the engine, its configuration or the negotiation mode cannot change while "
                               "the request trains; cancel it and create a new one",
                               bad_attributes=["VsDataContainer/sluice-job"])
            upd: dict[str, Any] = {"cmd": "update"}
            if new_job["requirements"] != old_job["requirements"]:
                upd["requirements"] = new_job["requirements"] or {}
            if new_job["termination"] != old_job["termination"] and new_job["termination"] is not None:
                upd["termination"] = new_job["termination"]
                upd["replace"] = True
            if len(upd) > 1:
                self._call(proc, upd, "VsDataContainer/sluice-termination")
        # write the request, then act on the process
        with self.store.write() as tx:
            cur = tx.get(ldn)
            assert cur is not None
            new_attrs = dict(attrs)
            new_attrs["requestStatus"] = cur.attributes.get("requestStatus", "NOT_STARTED")
            tx.update(cur, attributes=new_attrs, vs_data={**vs, **({"sluice-trigger": cur.vs_data["sluice-trigger"]}
                                                                   if "sluice-trigger" in cur.vs_data else {})},
                      internal={**cur.internal, "job": new_job})
            p = tx.get(proc.dn)
            assert p is not None
            if job_changed and _phase(p).pending:
                self._requeue_with(tx, cur, p, new_job)
                p = tx.get(proc.dn)
                assert p is not None
            elif job_changed and _phase(p).active:
                self._set_process(tx, p, vs={k: v for k, v in (
                    ("sluice-termination", new_job["termination"]), ("sluice-requirements", new_job["requirements"]))
                    if v is not None}, attrs={"terminationConditions": brief(parse_termination(
                        new_job["termination"])) if new_job["termination"] else p.attributes.get(
                        "terminationConditions", "")}, internal={"termination": new_job["termination"] or
                                                                 p.internal.get("termination"),
                                                                 "requirements": new_job["requirements"]})
        if suspend_change:
            self._suspend(proc.dn, attrs["suspendRequest"])
        if cancel:
            self._cancel(proc.dn)
        if feedback is not None:
            self.feedback(ldn, feedback)
        self.supervisor.wake()
        return self.get(ldn)

    def _requeue_with(self, tx: Tx, req: MOI, proc: MOI, job: dict[str, Any]) -> None:
        """A request changed before its process started: the process takes the new job (and a new proposal
        when the producer decides)."""
        neg = {"decidedBy": job["decided_by"], "state": "AGREED"}
        termination = job["termination"]
        if job["decided_by"] in ("producer", "negotiated"):
            termination, rationale = self._propose(job)
            neg.update(proposal=termination, rationale=rationale)
            if job["decided_by"] == "negotiated":
                neg["state"] = "PROPOSED"
        phase = Phase.PROPOSED if neg["state"] == "PROPOSED" else Phase.QUEUED
        status = dict(proc.attributes["progressStatus"])
        if not proc.internal.get("suspended"):
            status["progressStateInfo"] = "AWAITING_AGREEMENT" if phase is Phase.PROPOSED else "QUEUED"
        vs = {"sluice-negotiation": neg}
        if termination is not None:
            vs["sluice-termination"] = termination
        if job["requirements"]:
            vs["sluice-requirements"] = job["requirements"]
        v = {k: x for k, x in proc.vs_data.items() if k not in ("sluice-termination", "sluice-requirements")}
        v.update(vs)
        a = dict(proc.attributes)
        a.update(progressStatus=status,
                 terminationConditions=brief(parse_termination(termination)) if termination else "")
        i = dict(proc.internal)
        i.update(phase=phase.value, kind=job["kind"], raw=job["raw"], model=job["model"], termination=termination,
                 requirements=job["requirements"])
        tx.update(proc, attributes=a, vs_data=v, internal=i)
        self._sync_request(tx, proc)

    # ------------------------------------------------------------------ controls
    def _call(self, proc: MOI, cmd: dict[str, Any], attr: str) -> None:
        try:
            ack = self.supervisor.call(proc.dn, cmd)
        except WorkerGone as exc:
            raise MnSError(409, "the training process is not running any more", bad_attributes=[attr]) from exc
        if not ack.get("ok"):
            status = 503 if ack.get("timeout") else 400
            raise MnSError(status, f"the training process refused it: {ack.get('error')}", bad_attributes=[attr])

    @staticmethod
    def _ended_with(proc: MOI, end: EndWith) -> dict[str, Any]:
        """The report of a process ended without a worker (cancelled while proposed, queued, or waiting to
        resume after a restart: that one keeps the iterations of its last checkpoint)."""
        return {"cause": end.cause, "status": end.status, "detail": end.detail, "iterations": end.iterations,
                "model": proc.internal.get("model")}

    def _send(self, proc_ldn: str, effect: SendWorker) -> None:
        try:
            self.supervisor.send(proc_ldn, {"cmd": effect.cmd})
        except WorkerGone:
            pass  # it is ending anyway; its done message settles the state

    def _cancel_pending(self, tx: Tx, proc: MOI) -> None:
        """End a process that has no worker as CANCELLED, through CANCELLING."""
        before = ProcessRecord.of(proc.internal)
        after, effects = transition(before, Cancel())
        self._set_process(tx, proc, attrs={"cancelProcess": True}, internal=after.changes(before))
        for end in effects:
            if isinstance(end, EndWith):
                self._end_process(tx, proc, self._ended_with(proc, end), None, None)

    def _cancel(self, proc_ldn: str) -> None:
        with self.store.write() as tx:
            proc = tx.get(proc_ldn)
            assert proc is not None
            before = ProcessRecord.of(proc.internal)
            after, effects = transition(before, Cancel())
            if not effects:
                return  # it has ended
            attrs: dict[str, Any] = {"cancelProcess": True}
            if before.phase.active:
                attrs["progressStatus"] = {**proc.attributes["progressStatus"], "progressStateInfo": "CANCELLING"}
            self._set_process(tx, proc, attrs=attrs, internal=after.changes(before))
        for effect in effects:
            if isinstance(effect, EndWith):
                with self.store.write() as tx:  # a second transaction: CANCELLING, then CANCELLED
                    proc = tx.get(proc_ldn)
                    assert proc is not None
                    self._end_process(tx, proc, self._ended_with(proc, effect), None, None)
            elif isinstance(effect, SendWorker):
                self._send(proc_ldn, effect)

    def _suspend(self, proc_ldn: str, on: bool) -> None:
        with self.store.write() as tx:
            proc = tx.get(proc_ldn)
            assert proc is not None
            before = ProcessRecord.of(proc.internal)
            after, effects = transition(before, Suspend(on))
            for effect in effects:
                if isinstance(effect, Refused):
                    reason = (f"the process has ended ({proc.attributes['progressStatus']['status']})"
                              if before.phase is Phase.ENDED else effect.reason)
                    raise MnSError(effect.code, reason, bad_attributes=["suspendProcess"])
            attrs: dict[str, Any] = {"suspendProcess": on}
            if before.phase is Phase.QUEUED:
                status = dict(proc.attributes["progressStatus"])
                resuming = bool(proc.internal.get("resume"))  # it trained before the service restarted
                status.update(status="SUSPENDED" if on else ("RUNNING" if resuming else "NOT_STARTED"),
                              progressStateInfo="SUSPENDED" if on else ("RESUMING" if resuming else "QUEUED"))
                attrs["progressStatus"] = status
            self._set_process(tx, proc, attrs=attrs, internal={"suspended": after.suspended})
            req = tx.get(proc.internal["request"])
            if req is not None and req.attributes.get("suspendRequest") != on:
                tx.update(req, attributes={**req.attributes, "suspendRequest": on})
        for effect in effects:
            if isinstance(effect, SendWorker):
                self._send(proc_ldn, effect)

    def modify_process(self, ldn: str, attrs_in: dict[str, Any], vs_in: dict[str, Any], *, merge: bool) -> MOI:
        """PATCH/PUT of a process: cancel, suspend/resume, priority, termination conditions, the answer to
        a proposal, and training data."""
        proc = self.get(ldn)
        old = {k: v for k, v in proc.attributes.items() if k not in READ_ONLY["MLTrainingProcess"]}
        attrs = self._check_attrs("MLTrainingProcess", merge_patch(old, attrs_in) if merge else attrs_in,
                                  old=proc.attributes)
        for k in ("cancelProcess", "suspendProcess"):
            attrs.setdefault(k, old.get(k, False))
        record = ProcessRecord.of(proc.internal)
        phase = record.phase
        if "priority" in attrs and (not isinstance(attrs["priority"], int) or isinstance(attrs["priority"], bool)):
            raise MnSError(400, "priority must be an integer", bad_attributes=["priority"])
        data = vs_in.pop("sluice-data", None)
        neg = vs_in.pop("sluice-negotiation", None)
        term_patch = vs_in.pop("sluice-termination", None)
        req_patch = vs_in.pop("sluice-requirements", None)
        new_term: dict[str, Any] | None = None
        replace = False
        if attrs.get("terminationConditions", old.get("terminationConditions", "")) != old.get(
                "terminationConditions", ""):
            if not isinstance(attrs["terminationConditions"], str):
                raise MnSError(400, "terminationConditions must be text", bad_attributes=["terminationConditions"])
            new_term = parse_conditions(attrs["terminationConditions"])
            replace = True
        if term_patch is not None:
            if not isinstance(term_patch, dict):
                raise MnSError(400, "sluice-termination vsData must be an object",
                               bad_attributes=["VsDataContainer/sluice-termination"])
            base = proc.internal.get("termination") or {}
            new_term = merge_patch(base, term_patch) if merge else term_patch
            replace = True
        if new_term is not None:
            try:
                new_term = parse_termination(new_term).model_dump(**_DUMP)
            except ConfigError as exc:
                raise _config_error(exc, "terminationConditions") from exc
        new_req = None
        if req_patch is not None:
            try:
                merged = merge_patch(proc.internal.get("requirements") or {}, req_patch)
                new_req = parse_requirements(merged).model_dump(**_DUMP)
            except ConfigError as exc:
                raise _config_error(exc, "VsDataContainer/sluice-requirements") from exc
        cancel = attrs["cancelProcess"] and not old.get("cancelProcess", False)
        suspend_change = attrs["suspendProcess"] != old.get("suspendProcess", False)
        if phase is Phase.ENDED:
            if cancel and proc.attributes["progressStatus"]["status"] != "CANCELLED":
                raise MnSError(409, "the process has ended; it cannot be cancelled", bad_attributes=["cancelProcess"])
            if suspend_change:
                raise MnSError(409, "the process has ended; it cannot be suspended or resumed",
                               bad_attributes=["suspendProcess"])
            if new_term is not None or new_req is not None:
                raise MnSError(409, "the process has ended; its parameters cannot change",
                               bad_attributes=["terminationConditions"])
        for effect in transition(record, Agreed()).effects if neg is not None else ():
            if isinstance(effect, Refused):
                raise MnSError(effect.code, effect.reason, bad_attributes=["VsDataContainer/sluice-negotiation"])
        if data is not None:
            return self.upload(ldn, data)
        if phase is Phase.PROPOSED and (neg is not None or new_term is not None):
            self._answer_proposal(ldn, neg, new_term, new_req)
        elif phase.active and (new_term is not None or new_req is not None):
            cmd: dict[str, Any] = {"cmd": "update"}
            if new_term is not None:
                cmd.update(termination=new_term, replace=replace)
            if new_req is not None:
                cmd["requirements"] = new_req
            self._call(proc, cmd, "terminationConditions")
        with self.store.write() as tx:
            p = tx.get(ldn)
            assert p is not None
            a: dict[str, Any] = {}
            i: dict[str, Any] = {}
            v: dict[str, Any] = {}
            if "priority" in attrs and attrs["priority"] != p.attributes.get("priority"):
                a["priority"] = attrs["priority"]
            if new_term is not None and _phase(p) is not Phase.ENDED:
                a["terminationConditions"] = brief(parse_termination(new_term))
                v["sluice-termination"] = new_term
                i["termination"] = new_term
            if new_req is not None and _phase(p) is not Phase.ENDED:
                v["sluice-requirements"] = new_req
                i["requirements"] = new_req
            if a or v or i:
                self._set_process(tx, p, attrs=a, vs=v, internal=i)
        if suspend_change:
            self._suspend(ldn, attrs["suspendProcess"])
        if cancel:
            self._cancel(ldn)
        self.supervisor.wake()
        return self.get(ldn)

    def _answer_proposal(self, ldn: str, neg: Any, new_term: dict[str, Any] | None,
                         new_req: dict[str, Any] | None) -> None:
        if neg is not None and not isinstance(neg, dict):
            raise MnSError(400, "sluice-negotiation vsData must be an object",
                           bad_attributes=["VsDataContainer/sluice-negotiation"])
        neg = neg or {}
        if neg.get("accept") is False:
            raise MnSError(400, "to reject a proposal, cancel the request or the process (cancelProcess: true)",
                           bad_attributes=["VsDataContainer/sluice-negotiation"])
        if new_term is None and neg.get("accept") is not True:
            raise MnSError(400, "answer a proposal with {accept: true}, or modify it with sluice-termination or "
                           "terminationConditions", bad_attributes=["VsDataContainer/sluice-negotiation"])
        with self.store.write() as tx:
            p = tx.get(ldn)
            assert p is not None
            before = ProcessRecord.of(p.internal)
            after, effects = transition(before, Agreed())
            for effect in effects:  # agreed meanwhile
                if isinstance(effect, Refused):
                    raise MnSError(effect.code, effect.reason, bad_attributes=["VsDataContainer/sluice-negotiation"])
            state = dict(p.vs_data.get("sluice-negotiation") or {})
            agreed = new_term if new_term is not None else state.get("proposal")
            state.update(state="AGREED", modified=new_term is not None and new_term != state.get("proposal"),
                         agreedAt=now_iso())
            status = dict(p.attributes["progressStatus"])
            status.update(progressStateInfo="SUSPENDED" if p.internal.get("suspended") else "QUEUED")
            vs = {"sluice-negotiation": state, "sluice-termination": agreed}
            internal = {**after.changes(before), "termination": agreed, "queued_at": time.time()}
            if new_req is not None:
                vs["sluice-requirements"] = new_req
                internal["requirements"] = new_req
            self._set_process(tx, p, attrs={"progressStatus": status,
                                            "terminationConditions": brief(parse_termination(agreed))},
                              vs=vs, internal=internal)

    # ------------------------------------------------------------------ data (T6) and triggers (T7)
    def upload(self, proc_ldn: str, data: Any) -> MOI:
        """Training data for a process: a running one checks and takes it at once (a 400 says why it cannot);
        an ended one is retrained with it (updated training data, T7): a new process, the next version."""
        data = check_data(data)
        proc = self.get(proc_ldn)
        want, width = self._request_features(proc), len(data["X"][0])
        if want is not None and width != want:
            raise MnSError(400, f"sluice-data X has {width} features per sample; the training data this request "
                           f"took has {want}", bad_attributes=["VsDataContainer/sluice-data/X"])
        phase = _phase(proc)
        if phase is Phase.ENDED:
            if proc.internal.get("kind") == "split":
                raise MnSError(400, "split training takes no added data",
                               bad_attributes=["VsDataContainer/sluice-data"])
            self._retrain(proc.internal["request"], "DATA_UPDATED", "training data updated: retraining",
                          upload=(proc_ldn, data))
            return self.get(proc_ldn)
        if phase.active:
            self._call(proc, {"cmd": "data", "data": data}, "VsDataContainer/sluice-data")
        with self.store.write() as tx:
            p = tx.get(proc_ldn)
            assert p is not None
            self._store_upload(tx, p, data)
        return self.get(proc_ldn)

    def _request_features(self, proc: MOI) -> int | None:
        """Features per sample of the data the request of ``proc`` took so far (``sluice-data.features`` of
        its processes, the latest first), or None before its first accepted upload."""
        req = self.store.get(proc.internal.get("request", ""))
        for ldn in reversed(req.internal.get("processes", []) if req is not None else [proc.dn]):
            row = proc if ldn == proc.dn else self.store.get(ldn)
            features = ((row.vs_data.get("sluice-data") or {}) if row is not None else {}).get("features")
            if isinstance(features, int):
                return features
        return None

    def _store_upload(self, tx: Tx, proc: MOI, data: dict[str, Any]) -> None:
        tx.s.add(Upload(request_dn=proc.internal["request"], process_dn=proc.dn, payload=data,
                        samples=len(data["X"]), created_at=time.time()))
        st = dict(proc.vs_data.get("sluice-data") or {"uploads": 0, "samples": 0})
        st["uploads"] = int(st.get("uploads", 0)) + 1
        st["samples"] = int(st.get("samples", 0)) + len(data["X"])
        st["features"] = len(data["X"][0])
        st["last"] = now_iso()
        self._set_process(tx, proc, vs={"sluice-data": st})

    def feedback(self, req_ldn: str, fb: Any) -> None:
        """Consumer feedback on the model in use: retrain when the measured value is worse than the policy's
        threshold for the metric; the answer is the request's ``sluice-trigger``."""
        from sluice.control.params import resolve_metric, spec_of

        fb = read_feedback(fb)
        try:
            name = resolve_metric(fb.metric)
            higher = spec_of(name).higher_is_better
        except (ValueError, ConfigError) as exc:
            raise MnSError(400, str(exc), bad_attributes=["VsDataContainer/sluice-feedback"]) from exc
        thr = self.cfg.policy.retrain_below.get(name)
        value = fb.value
        req = self.get(req_ldn)
        proc = self.get(req.internal["current"])
        if thr is None:
            answer = {"accepted": False, "reason": f"no retraining threshold for {name}; the policy has "
                      f"{sorted(self.cfg.policy.retrain_below)}"}
        elif (value >= thr) if higher else (value <= thr):
            answer = {"accepted": False, "reason": f"{name} in use {value:g} meets threshold {thr:g}; no retraining"}
        elif _phase(proc) is not Phase.ENDED:
            answer = {"accepted": False, "reason": "the model is still in training"}
        else:
            self._retrain(req_ldn, "CONSUMER_FEEDBACK", f"{name} in use {value:g} is worse than {thr:g}: retraining")
            return
        with self.store.write() as tx:
            r = tx.get(req_ldn)
            assert r is not None
            tx.update(r, vs_data={**r.vs_data, "sluice-trigger": {"trigger": "CONSUMER_FEEDBACK", **answer,
                                                                  "at": now_iso()}})

    def _retrain(self, req_ldn: str, trigger: str, why: str,
                 upload: tuple[str, dict[str, Any]] | None = None) -> None:
        """A new process of the request, the next model version; ``upload`` (process LDN, data) is stored in
        the same transaction, so a refusal (409) leaves everything as it was."""
        from sluice.control.params import parse_model

        with self.store.write() as tx:
            req = tx.get(req_ldn)
            if req is None:
                raise MnSError(409, f"the request {ldn_to_dn(req_ldn)} was deleted; nothing retrains",
                               bad_objects=[ldn_to_dn(req_ldn)])
            last = tx.get(req.internal["current"])
            assert last is not None
            if _phase(last) is not Phase.ENDED:
                raise MnSError(409, "the request is still training; retraining starts once it ends")
            if upload is not None:
                target = tx.get(upload[0])
                assert target is not None
                self._store_upload(tx, target, upload[1])
            model = parse_model(last.internal["model"]).next_version().model_dump(mode="json")
            job = dict(req.internal["job"])
            job["termination"] = last.internal.get("termination")
            job["requirements"] = last.internal.get("requirements")
            job["decided_by"] = "consumer" if job["termination"] is not None else "producer"
            proc = self._new_process(tx, req, job, trigger=trigger, model=model,
                                     last_report=last.attributes.get("trainingReportRef"))
            tx.update(req, vs_data={**req.vs_data, "sluice-trigger": {
                "trigger": trigger, "accepted": True, "reason": why, "process": ldn_to_dn(proc.dn),
                "model": model, "at": now_iso()}})
            self._sync_request(tx, proc)
        self.supervisor.wake()

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

    # ------------------------------------------------------------------ the queue
    def _pick_next(self) -> dict[str, Any] | None:
        with self.store.write() as tx:
            queued = [p for p in tx.of_class("MLTrainingProcess")
                      if transition(ProcessRecord.of(p.internal), Started()).effects]  # queued, not held
            if not queued:
                return None
            queued.sort(key=lambda p: (-int(p.attributes.get("priority") or 0), p.internal.get("queued_at", 0),
                                       p.seq))
            proc = queued[0]
            import sqlalchemy as sa

            uploads = [u.payload for u in tx.s.scalars(
                sa.select(Upload).where(Upload.request_dn == proc.internal["request"]).order_by(Upload.id))]
            status = dict(proc.attributes["progressStatus"])
            status.update(progressStateInfo="STARTING")
            before = ProcessRecord.of(proc.internal)
            after, _ = transition(before, Started())  # StartWorker: the supervisor starts one with what follows
            self._set_process(tx, proc, attrs={"progressStatus": status},
                              internal={**after.changes(before), "started_at": time.time()})
            i = proc.internal
            resume = None
            ckpt = tx.s.get(Checkpoint, proc.dn) if i.get("resume") else None
            if ckpt is not None:
                resume = {"iteration": ckpt.iteration, "engine": ckpt.engine_state, "process": ckpt.process_state}
            raw = producer_job(i["raw"], self.cfg.tasks)  # a registered task: its factory, here only
            raw = {**raw, "model": {**(raw.get("model") or {}), **{k: v for k, v in i["model"].items()
                                                                    if v is not None}}}
            if i["kind"] == "chain":
                raw["endpoints"] = {n: self.cfg.producers[n].model_dump() for n in raw.get("producers", [])
                                    if n in self.cfg.producers}
                raw.update(self.chain_cancels.fields(proc))
            return {"process": proc.dn, "kind": i["kind"], "raw": raw,
                    "termination": i.get("termination"), "requirements": i.get("requirements"),
                    "uploads": uploads, "progress_interval_s": self.cfg.progress_interval_s,
                    "checkpoint_every": self.cfg.checkpoint_every, "resume": resume,
                    "work_dir": None if self.cfg.work_dir is None else f"{self.cfg.work_dir}/{id_of(proc.dn)}"}

    # ------------------------------------------------------------------ worker messages
    def _on_message(self, ldn: str, msg: dict[str, Any]) -> None:
        kind = msg.get("kind")
        if kind == "checkpoint":
            with self.store.write() as tx:
                proc = tx.get(ldn)
                if proc is None or not transition(ProcessRecord.of(proc.internal),
                                                  Checkpointed(int(msg["iteration"]))).effects:
                    return  # KeepCheckpoint
                tx.s.merge(Checkpoint(process_dn=ldn, iteration=int(msg["iteration"]), engine_state=msg["engine"],
                                      process_state=msg["process"], created_at=time.time()))
            return
        if kind == "progress":
            now = time.monotonic()
            status = msg["status"]
            pct = status.get("progressPercentage")
            with self.store.write() as tx:
                proc = tx.get(ldn)
                if proc is None or _phase(proc) is Phase.ENDED:
                    return
                if self._repeated(proc, status):
                    return
                old_pct = proc.attributes["progressStatus"].get("progressPercentage")
                if pct == old_pct and now - self._last_progress.get(ldn, 0.0) < self.cfg.progress_interval_s:
                    return
                self._last_progress[ldn] = now
                self._apply_status(tx, proc, status)
            return
        if kind == "state":
            with self.store.write() as tx:
                proc = tx.get(ldn)
                if proc is None or _phase(proc) is Phase.ENDED:
                    return
                if msg["state"] in ENDED:
                    return  # the done message carries the report and the model
                self._apply_status(tx, proc, msg["status"], interim=msg.get("report"))
            return
        if kind == "refused":
            with self.store.write() as tx:
                proc = tx.get(ldn)
                if proc is not None and _phase(proc) is not Phase.ENDED:
                    self._end_process(tx, proc, {"cause": Cause.CANCELLED.value, "status": "CANCELLED", "iterations": 0,
                                                 "detail": f"refused before training: {msg.get('error')}",
                                                 "model": proc.internal.get("model")}, None, None, refused=True)
            return
        if kind in ("failed", "died"):
            with self.store.write() as tx:
                proc = tx.get(ldn)
                if proc is None or _phase(proc) is Phase.ENDED:
                    return
                if kind == "died":  # killed, or crashed: as after a restart of the service
                    self._requeue_interrupted(tx, proc, f"its worker exited with code {msg.get('exitcode')}",
                                              self.cfg.worker_restarts)
                    return
                st = proc.vs_data.get("sluice-status") or {}
                detail = msg.get("error") or f"the worker exited with code {msg.get('exitcode')} before reporting"
                report = {"cause": Cause.ENGINE_FAILURE.value, "status": "FAILED", "detail": detail,
                          "iterations": st.get("iterations", 0), "performance": st.get("metrics", {}),
                          "duration_s": st.get("elapsed_s", 0.0), "model": proc.internal.get("model")}
                self._end_process(tx, proc, report, None, None, refused=bool(msg.get("before_training")))
            return
        if kind == "done":
            with self.store.write() as tx:
                proc = tx.get(ldn)
                if proc is None or _phase(proc) is Phase.ENDED:
                    return
                report = msg["report"]
                refused = report.get("iterations", 0) == 0 and report.get("cause") in (
                    Cause.INSUFFICIENT_TRAINING_SAMPLES.value, Cause.INSUFFICIENT_COMPUTE.value)
                self._end_process(tx, proc, report, msg.get("model"), msg.get("model_name"), refused=refused)
            self._last_progress.pop(ldn, None)

    @staticmethod
    def _repeated(proc: MOI, st: dict[str, Any]) -> bool:
        """Whether status ``st`` of a resumed process is of an iteration it repeats (one already reported
        before the service stopped)."""
        seen = (proc.internal.get("resume") or {}).get("seen", 0)
        return bool(seen) and int(st.get("iterations") or 0) <= seen

    def _apply_status(self, tx: Tx, proc: MOI, st: dict[str, Any], interim: dict[str, Any] | None = None) -> None:
        if self._repeated(proc, st):  # a resumed process: the state changes, the progress seen stays
            old = proc.vs_data.get("sluice-status") or {}
            st = {**st, **{k: old[k] for k in ("iterations", "elapsed_s", "metrics") if k in old},
                  "progressPercentage": proc.attributes["progressStatus"].get("progressPercentage")}
        state = st.get("status", "RUNNING")
        before = ProcessRecord.of(proc.internal)
        i = transition(before, Iteration(state)).record.changes(before)
        info = st.get("progressStateInfo") or state
        if proc.internal.get("cancelling"):
            info = "CANCELLING"
        result = st.get("resultStateInfo") or ""
        ps: dict[str, Any] = {"status": state, "progressStateInfo": info, "resultStateInfo": result}
        started = proc.attributes["progressStatus"].get("startTime")  # TS 28.623 ProcessMonitor times
        if started or state != "NOT_STARTED":
            ps["startTime"] = started or now_iso()
        if st.get("progressPercentage") is not None:
            ps["progressPercentage"] = max(0, min(100, int(st["progressPercentage"])))
        vs_status = {k: v for k, v in st.items() if k not in ("progressStateInfo", "resultStateInfo", "status",
                                                               "progressPercentage")}
        vs_status["state"] = state
        if interim is not None:
            vs_status["detail"] = interim.get("detail", "")
        self._set_process(tx, proc, attrs={"progressStatus": ps}, vs={"sluice-status": vs_status}, internal=i)

    def _end_process(self, tx: Tx, proc: MOI, report: dict[str, Any], model_bytes: bytes | None,
                     model_name: str | None, *, refused: bool = False) -> None:
        """One transaction: the report (and the model with its file) are created, the process ends, the
        request follows; the notifications of all of it are queued together."""
        pid = id_of(proc.dn)
        rep_ldn = f"{self.tf}/MLTrainingReport={pid}"
        model_ldn = None
        ident = report.get("model") or proc.internal.get("model") or {}
        if model_bytes:
            ident = report["model"] = stored_identity(tx, ident)
            model_ldn = self._store_model(tx, proc, ident, model_bytes, model_name, rep_ldn)
        perf = {k: v for k, v in (report.get("performance") or {}).items() if _finite(v)}
        model_perf = {k: v for k, v in perf.items() if k not in OPERATIONAL_METRICS}  # not the run's own counts
        rattrs: dict[str, Any] = {
            "modelPerformanceTraining": [{"performanceMetric": k, "performanceScore": v}
                                         for k, v in model_perf.items() if k.startswith("train")],
            "modelPerformanceValidation": [{"performanceMetric": k, "performanceScore": v}
                                           for k, v in model_perf.items() if not k.startswith("train")],
            "areNewTrainingDataUsed": bool(proc.vs_data.get("sluice-data")) or proc.internal.get(
                "trigger") == "DATA_UPDATED",
            "trainingProcessRef": ldn_to_dn(proc.dn),
        }
        ratio = self._train_ratio(proc)
        if ratio is not None:
            rattrs["dataRatioTrainingAndValidation"] = ratio
        if proc.internal.get("last_report"):
            rattrs["lastTrainingRef"] = proc.internal["last_report"]
        if model_ldn is not None:
            rattrs["mLModelGeneratedRef"] = ldn_to_dn(model_ldn)
        vs_report = {k: v for k, v in report.items() if k != "model_path"}
        vs_report["refused"] = refused
        vs_report["run_metrics"] = {k: v for k, v in perf.items() if k in OPERATIONAL_METRICS}
        if tx.get(rep_ldn) is None:
            tx.create(rep_ldn, "MLTrainingReport", rattrs, {"sluice-report": vs_report}, inherited(proc.internal))
        status = report.get("status", "FAILED")
        if status not in ENDED:
            status = "FAILED"
        ps: dict[str, Any] = {"status": status, "progressStateInfo": status, "resultStateInfo": report.get("cause", "")}
        pct = 100 if status == "FINISHED" else report.get("progress_percent")  # a finished process did it all
        old_ps = proc.attributes.get("progressStatus", {})
        if pct is not None:
            ps["progressPercentage"] = max(0, min(100, int(pct)))
        elif "progressPercentage" in old_ps:
            ps["progressPercentage"] = old_ps["progressPercentage"]
        ps.update({k: old_ps[k] for k in ("startTime",) if k in old_ps}, endTime=now_iso())
        attrs = {"progressStatus": ps, "trainingReportRef": ldn_to_dn(rep_ldn)}
        if model_ldn is not None:
            attrs["mLModelRef"] = ldn_to_dn(model_ldn)
        st = dict(proc.vs_data.get("sluice-status") or {})
        st.update(state=status, iterations=report.get("iterations", st.get("iterations", 0)),
                  cause=report.get("cause"), detail=report.get("detail", ""),
                  estimated_remaining_iterations=report.get("estimated_remaining_iterations"),
                  estimated_remaining_s=report.get("estimated_remaining_s"),
                  bytes_up=report.get("bytes_up", st.get("bytes_up", 0)),
                  bytes_down=report.get("bytes_down", st.get("bytes_down", 0)))
        if "performance" in report:  # the status shows what the report says, not the last progress stored
            st.update(metrics=perf, elapsed_s=report.get("duration_s", st.get("elapsed_s")))
        if "progressPercentage" in ps:
            st["progress_percent"] = ps["progressPercentage"]
        before = ProcessRecord.of(proc.internal)
        after, effects = transition(before, Ended(refused))
        self._set_process(tx, proc, attrs=attrs, vs={"sluice-status": st},
                          internal={"phase": after.phase.value, "refused": after.refused, "ended_at": time.time(),
                                    "model": ident or proc.internal.get("model")})
        ckpt = tx.s.get(Checkpoint, proc.dn) if effects else None  # DropCheckpoint
        if ckpt is not None:
            tx.s.delete(ckpt)

    def _store_model(self, tx: Tx, proc: MOI, ident: dict[str, Any], model_bytes: bytes, model_name: str | None,
                     rep_ldn: str) -> str:
        """The ``MLModel`` of a process that trained one, with its file; its LDN."""
        pid = id_of(proc.dn)
        base = safe_id(f"{ident.get('id', 'model')}-v{ident.get('version', '1')}")
        model_ldn = f"{self.repo}/MLModel={base}"
        if tx.get(model_ldn) is not None:
            model_ldn = f"{self.repo}/MLModel={base}-{pid}"
        req = tx.get(proc.internal["request"])
        mattrs: dict[str, Any] = {"mLModelId": str(ident.get("id", "model")),
                                  "mLModelVersion": str(ident.get("version", "1")),
                                  "mLTrainingType": "INITIAL_TRAINING" if proc.internal.get(
                                      "trigger") == "CONSUMER_REQUEST" else "RE_TRAINING"}
        if req is not None and req.attributes.get("aIMLInferenceName"):
            mattrs["aIMLInferenceName"] = req.attributes["aIMLInferenceName"]
        elif ident.get("type"):
            mattrs["aIMLInferenceName"] = ident["type"]
        digest = hashlib.sha256(model_bytes).hexdigest()
        tx.create(model_ldn, "MLModel", mattrs, {"sluice-model": {
            "engine": proc.internal.get("kind"), "file": model_name or "model.pt", "bytes": len(model_bytes),
            "sha256": digest, "mediaType": "application/octet-stream",
            "download": "GET this resource with Accept: application/octet-stream",
            "trainingReportRef": ldn_to_dn(rep_ldn), "type": ident.get("type")}}, inherited(proc.internal))
        tx.s.add(Artifact(dn=model_ldn, content=model_bytes, sha256=digest, size=len(model_bytes)))
        return model_ldn

    @staticmethod
    def _train_ratio(proc: MOI) -> int | None:
        """Percent of the held data that trains (the rest validates), where the job's configuration says."""
        data = (proc.internal.get("raw") or {}).get("data") or {}
        for key in ("test_fraction", "test_size"):
            v = data.get(key)
            if _finite(v) and 0 < v < 1:
                return int(round((1 - v) * 100))
        if proc.internal.get("kind") == "local":
            return 80
        return None
