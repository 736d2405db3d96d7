"""Requests: create, replace, modify and delete an ``MLTrainingRequest``; the request's status follows its latest
process."""

from __future__ import annotations

import uuid
from typing import Any

from sluice.config import merge_patch
from sluice.control.lifecycle import Phase
from sluice.control.params import parse_termination
from sluice.control.report import brief
from sluice.errors import SluiceError
from sluice.service.auth import Actor, tag
from sluice.service.base import Shared, _phase, call_worker, check_attrs, set_process, sync_request
from sluice.service.capabilities import Prober, chain_capabilities, fit_job, inference_type
from sluice.service.cascade import delete_request_tree
from sluice.service.db import MOI
from sluice.service.identity import request_model
from sluice.service.nrm import (
    MnSError,
    check_id,
    id_of,
    ldn_to_dn,
    read_vs,
)
from sluice.service.processes import Processes
from sluice.service.proposals import Proposals
from sluice.service.retraining import Retraining
from sluice.service.store import Tx
from sluice.service.tasks import check_args, producer_job, producer_task
from sluice.service.validate import config_error as _config_error
from sluice.service.vsdata import StoredJob, request_vs
from sluice.service.worker import Supervisor


class Requests:
    """The consumer's requests: each is created with its first process (``proposals``), and a change of one
    acts on its latest process (``processes``) or starts a retraining (``retraining``); ``prober`` says what
    an engine reports, ``supervisor`` is woken for what may start."""

    def __init__(self, shared: Shared, supervisor: Supervisor, prober: Prober, proposals: Proposals,
                 processes: Processes, retraining: Retraining) -> None:
        self.shared = shared
        self.cfg = shared.cfg
        self.supervisor = supervisor
        self.prober = prober
        self.proposals = proposals
        self.processes = processes
        self.retraining = retraining

    # ------------------------------------------------------------------ requests: create / replace
    def _job_from(self, attrs: dict[str, Any], vs: dict[str, Any], rid: str) -> StoredJob:
        """The job a request asks for, validated without building an engine: ``kind``, ``raw`` (engine
        configuration + model identity), ``model``, ``requirements``, ``termination``, ``decided_by``."""
        from sluice.runtimes.jobs import ENGINE_KINDS

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
        federation = self._federation_of(job.pop("federation", None), kind, job)
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
        out = StoredJob(
            kind=kind, raw={k: v for k, v in doc.items() if k not in ("requirements", "termination")},
            model=request_model(parsed.model.model_dump(mode="json"), model, rid),
            requirements=None if parsed.requirements is None else parsed.requirements.model_dump(
                mode="json", exclude_none=True, exclude_defaults=True),
            termination=None if parsed.termination is None else parsed.termination.model_dump(
                mode="json", exclude_none=True, exclude_defaults=True),
            decided_by=decided, federation=federation)
        return fit_job(out, attrs, self._capabilities(kind, out.raw))

    def _capabilities(self, kind: str, raw: dict[str, Any]) -> Any:
        """What the engine of job ``raw`` reports (a chain: what each of its producers' jobs reports)."""
        def probe(k: str, job: dict[str, Any]) -> Any:
            return self.prober.of(k, producer_job(job, self.cfg.tasks))

        return chain_capabilities(raw, probe) if kind == "chain" else probe(kind, raw)

    def _parse_job(self, kind: str, doc: dict[str, Any]) -> Any:
        """``doc`` validated as this producer trains it: the task it names is a built-in or a registered one
        (never an import path; :mod:`sluice.service.tasks`), with arguments that fit its function."""
        from sluice.runtimes.jobs import ENGINE_KINDS, job_from_dict
        from sluice.tasks.config import TaskConfig

        section = doc.get("task")
        checked = doc if section is None else {**doc, "task": producer_task(section, self.cfg.tasks, kind)}
        followers = doc.get("follower_tasks")
        if isinstance(followers, dict):  # a split job's other parties: tasks of this service too
            checked = {**checked, "follower_tasks": {k: producer_task(v, self.cfg.tasks, kind)
                                                     for k, v in followers.items()}}
        try:
            parsed = job_from_dict(kind, checked)
        except (SluiceError, ValueError) as exc:
            raise _config_error(exc, "VsDataContainer/sluice-job") from exc
        if section is None:
            return parsed
        name = section.get("name") or getattr(getattr(parsed.config, "data", None), "dataset", None)
        if name is not None and (section.get("args") or name in self.cfg.tasks):
            check_args(name, section.get("args") or {}, self.cfg.tasks, kind)  # built-ins without args: no torch here
        if name in self.cfg.tasks and "id" not in (doc.get("model") or {}):  # named as the consumer named it
            config = parsed.config.model_copy(update={"task": TaskConfig.model_construct(name=name)})
            parsed.model = parsed.model.model_copy(update={"id": ENGINE_KINDS[kind].default_model_id(config)})
        return parsed

    def _federation_of(self, asked: Any, kind: str, job: dict[str, Any]) -> str | None:
        """The configured federation a job names (``"default"``: the service's default), checked against the
        job's engine and task; None for a job without one."""
        if asked is None:
            return None
        bad = ["VsDataContainer/sluice-job"]
        feds = self.cfg.federations
        name = self.cfg.default_federation if asked == "default" else asked
        if not isinstance(name, str) or name not in feds:
            known = ", ".join(sorted(feds)) or "none"
            raise MnSError(400, f"federation {asked!r} is not one of this producer's federations ({known})"
                           + ("" if asked != "default" else "; it has no default_federation"), bad_attributes=bad)
        if kind != "hfl":
            raise MnSError(400, f"federation {name!r}: only horizontal FL jobs (engine hfl) train on a "
                           f"federation, this job's engine is {kind}", bad_attributes=bad)
        task = (job.get("task") or {}).get("name") if isinstance(job.get("task"), dict) else None
        if feds[name].task is not None and task != feds[name].task:
            raise MnSError(400, f"federation {name!r}: its nodes serve task {feds[name].task!r}, the job names "
                           f"{task!r}", bad_attributes=bad)
        return name

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

    def put(self, ldn: str, body: dict[str, Any], actor: Actor | None = None) -> tuple[MOI, bool]:
        """Create (True, owned by ``actor``) or replace (False; 404 when ``actor`` may not see it) the request."""
        if self.shared.store.get(ldn) is None:
            return self.create(ldn, body, actor), True
        self.shared.get(ldn, actor)
        return self.modify(ldn, body.get("attributes") or {}, read_vs(body, "MLTrainingRequest"),
                           replace=True), False

    @staticmethod
    def new_id() -> str:
        """An id for a request the consumer did not name."""
        return f"R{uuid.uuid4().hex[:12]}"

    def create(self, ldn: str, body: dict[str, Any], actor: Actor | None = None) -> MOI:
        """The request at ``ldn`` (owned by ``actor``) with its first process; 409 when it exists."""
        check_id(id_of(ldn))
        attrs = check_attrs("MLTrainingRequest", body.get("attributes") or {})
        vs = read_vs(body, "MLTrainingRequest")
        job = self._job_from(attrs, vs, id_of(ldn))
        attrs.setdefault("cancelRequest", False)
        attrs.setdefault("suspendRequest", False)
        attrs["requestStatus"] = "NOT_STARTED"
        with self.shared.store.write() as tx:
            if tx.get(ldn) is not None:
                raise MnSError(409, f"{ldn_to_dn(ldn)} exists")
            req = tx.create(ldn, "MLTrainingRequest", attrs, vs, {"processes": [], "job": job.stored(), **tag(actor)})
            proc = self.proposals.new_process(tx, req, job, trigger="CONSUMER_REQUEST",
                                              suspended=attrs["suspendRequest"])
            if attrs["cancelRequest"]:
                self.processes.cancel_pending(tx, proc)
            sync_request(tx, proc)
        self.supervisor.wake()
        return self.shared.get(ldn)

    def delete(self, ldn: str) -> None:
        """Delete a request that is not training, with its processes and reports (its models stay); 409 while
        its latest process is starting or running. A pending one is cancelled first."""
        req = self.shared.get(ldn)
        proc = self.shared.store.get(req.internal.get("current", ""))
        if proc is not None and _phase(proc).active:
            raise MnSError(409, f"the request is {req.attributes.get('requestStatus')}: cancel it "
                           "(cancelRequest: true) and delete it once it has ended")
        if proc is not None and _phase(proc).pending:
            self.processes.cancel(proc.dn)
        with self.shared.store.write() as tx:
            cur = tx.get(ldn)
            if cur is not None:
                delete_request_tree(tx, cur)  # its processes and reports go with it, its models stay

    # ------------------------------------------------------------------ requests: modify
    def modify(self, ldn: str, attrs_in: dict[str, Any], vs_in: dict[str, Any], *, replace: bool,
               merge: bool = False) -> MOI:
        """Apply new attributes and VsData to a request: PUT replaces the writable attributes and
        containers, a merge patch merges them (``merge``). Cancel, suspend/resume, requirement and
        termination changes act on the current process; feedback may start a retraining."""
        req = self.shared.get(ldn)
        old_attrs, old_vs, attrs, vs = self._merged_request(req, attrs_in, vs_in, merge)
        attrs.setdefault("cancelRequest", old_attrs.get("cancelRequest", False))
        attrs.setdefault("suspendRequest", old_attrs.get("suspendRequest", False))
        feedback = vs.pop("sluice-feedback", None)
        proc = self.shared.get(req.internal["current"])
        ended = _phase(proc) is Phase.ENDED
        job_keys = ("sluice-job", "sluice-requirements", "sluice-termination", "sluice-negotiation")
        job_attrs = ("performanceRequirements", "aIMLInferenceName")
        job_changed = any(vs.get(k) != old_vs.get(k) for k in job_keys) or any(
            attrs.get(k) != old_attrs.get(k) for k in job_attrs)
        old_job = StoredJob.of(req.internal["job"])
        new_job = self._job_from(attrs, vs, id_of(ldn)) if job_changed else old_job
        cancel = attrs["cancelRequest"] and not old_attrs.get("cancelRequest", False)
        suspend_change = attrs["suspendRequest"] != old_attrs.get("suspendRequest", False)
        if ended:
            _refuse_on_ended(req, proc, cancel, suspend_change)
        sent = not ended and job_changed and _phase(proc).active
        if sent:
            self._update_running(proc, old_job, new_job)
        self._store_request(ldn, proc.dn, attrs, vs, new_job, job_changed, sent=sent)
        if suspend_change:
            self.processes.suspend(proc.dn, attrs["suspendRequest"])
        if cancel:
            self.processes.cancel(proc.dn)
        if feedback is not None:
            self.retraining.feedback(ldn, feedback)
        self.supervisor.wake()
        return self.shared.get(ldn)

    def _store_request(self, ldn: str, proc_ldn: str, attrs: dict[str, Any], vs: dict[str, Any], job: StoredJob,
                       job_changed: bool, *, sent: bool) -> None:
        """Write the request's new attributes, vsData and job; a changed job requeues a pending process with it or
        records the termination parameters and requirements a running one took (``sent``: also when they ended
        its run meanwhile)."""
        with self.shared.store.write() as tx:
            cur = tx.get(ldn)
            assert cur is not None
            new_attrs = dict(attrs)
            new_attrs["requestStatus"] = cur.attributes.get("requestStatus", "NOT_STARTED")
            tx.update(cur, attributes=new_attrs, vs_data={**vs, **({"sluice-trigger": cur.vs_data["sluice-trigger"]}
                                                                   if "sluice-trigger" in cur.vs_data else {})},
                      internal={**cur.internal, "job": job.stored()})
            p = tx.get(proc_ldn)
            assert p is not None
            if job_changed and _phase(p).pending:
                self._requeue_with(tx, cur, p, job)
            elif job_changed and (sent or _phase(p).active):
                term = job.termination
                set_process(tx, p, vs={k: v for k, v in (
                    ("sluice-termination", term), ("sluice-requirements", job.requirements)) if v is not None},
                    attrs={"terminationConditions": brief(parse_termination(term)) if term else p.attributes.get(
                        "terminationConditions", "")},
                    internal={"termination": term or p.internal.get("termination"),
                              "requirements": job.requirements})

    def _merged_request(self, req: MOI, attrs_in: Any, vs_in: dict[str, Any], merge: bool) -> tuple[
            dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The request's writable attributes and vsData before (``old_attrs``, ``old_vs``) and after a PUT
        (replaced) or a merge patch (``merge``): ``(old_attrs, old_vs, attrs, vs)``."""
        old_attrs = {k: v for k, v in req.attributes.items() if k != "requestStatus"}
        old_vs = {k: v for k, v in req.vs_data.items() if k not in ("sluice-trigger",)}
        if not merge:
            return old_attrs, old_vs, check_attrs("MLTrainingRequest", attrs_in, old=req.attributes), dict(vs_in)
        attrs = check_attrs("MLTrainingRequest", merge_patch(old_attrs, attrs_in) if isinstance(
            attrs_in, dict) else attrs_in, old=req.attributes)
        vs = dict(old_vs)
        for k, v in vs_in.items():
            if v is None:
                vs.pop(k, None)
            elif k == "sluice-feedback":
                vs[k] = v
            else:
                vs[k] = merge_patch(old_vs.get(k), v) if isinstance(v, dict) else v
        return old_attrs, old_vs, attrs, vs

    def _update_running(self, proc: MOI, old_job: StoredJob, new_job: StoredJob) -> None:
        """A request changed while its process trains: its worker takes the new requirements and termination
        parameters at the next iteration; the engine, its configuration, the federation and the negotiation mode
        stay (409)."""
        fixed = ("kind", "raw", "decided_by", "federation")
        if [getattr(new_job, k) for k in fixed] != [getattr(old_job, k) for k in fixed]:
            raise MnSError(409, "the engine, its configuration, its federation or the negotiation mode cannot "
                           "change while the request trains; cancel it and create a new one",
                           bad_attributes=["VsDataContainer/sluice-job"])
        upd: dict[str, Any] = {"cmd": "update"}
        if new_job.requirements != old_job.requirements:
            upd["requirements"] = new_job.requirements or {}
        if new_job.termination != old_job.termination and new_job.termination is not None:
            upd["termination"] = new_job.termination
            upd["replace"] = True
        if len(upd) > 1:
            call_worker(self.supervisor, proc, upd, "VsDataContainer/sluice-termination")

    def _requeue_with(self, tx: Tx, req: MOI, proc: MOI, job: StoredJob) -> None:
        """A request changed before its process started: the process takes the new job (and a new proposal
        when the producer decides)."""
        neg = {"decidedBy": job.decided_by, "state": "AGREED"}
        termination = job.termination
        if job.decided_by in ("producer", "negotiated"):
            termination, rationale = self.proposals.propose(job)
            neg.update(proposal=termination, rationale=rationale)
            if job.decided_by == "negotiated":
                neg["state"] = "PROPOSED"
        phase = Phase.PROPOSED if neg["state"] == "PROPOSED" else Phase.QUEUED
        status = dict(proc.attributes["progressStatus"])
        if not proc.internal.get("suspended"):
            status["progressStateInfo"] = "AWAITING_AGREEMENT" if phase is Phase.PROPOSED else "QUEUED"
        vs = {"sluice-negotiation": neg}
        if termination is not None:
            vs["sluice-termination"] = termination
        if job.requirements:
            vs["sluice-requirements"] = job.requirements
        v = {k: x for k, x in proc.vs_data.items() if k not in ("sluice-termination", "sluice-requirements")}
        v.update(vs)
        a = dict(proc.attributes)
        a.update(progressStatus=status,
                 terminationConditions=brief(parse_termination(termination)) if termination else "")
        i = dict(proc.internal)
        i.update(phase=phase.value, kind=job.kind, raw=job.raw, model=job.model, termination=termination,
                 requirements=job.requirements, federation=job.federation)
        tx.update(proc, attributes=a, vs_data=v, internal=i)
        sync_request(tx, proc)


def _refuse_on_ended(req: MOI, proc: MOI, cancel: bool, suspend_change: bool) -> None:
    """409 for a change an ended request cannot take (cancelling a cancelled one again is a no-op)."""
    if cancel and proc.attributes["progressStatus"]["status"] != "CANCELLED":
        raise MnSError(409, f"the request has ended ({req.attributes.get('requestStatus')}); it cannot be "
                       "cancelled", bad_attributes=["cancelRequest"])
    if suspend_change:
        raise MnSError(409, f"the request has ended ({req.attributes.get('requestStatus')}); it cannot be "
                       "suspended or resumed", bad_attributes=["suspendRequest"])
