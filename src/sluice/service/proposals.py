"""Proposals and new processes: the producer's history of runs, the termination parameters it proposes from
it, and a request's new ``MLTrainingProcess`` (``proposed`` or ``queued``, as
:func:`~sluice.control.lifecycle.created` says)."""

from __future__ import annotations

import time
from typing import Any

from sluice.control.lifecycle import Created, Phase, created
from sluice.control.params import parse_requirements, parse_termination
from sluice.control.report import brief
from sluice.errors import ConfigError
from sluice.service.auth import inherited
from sluice.service.base import _DUMP, Shared
from sluice.service.capabilities import fit_proposal
from sluice.service.db import MOI
from sluice.service.nrm import MnSError, id_of, ldn_to_dn, safe_id
from sluice.service.store import Tx
from sluice.service.validate import finite as _finite
from sluice.service.vsdata import StoredJob


class Proposals:
    """The store's past runs, the producer's proposals made from them, and new processes."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def history_and_shapes(self) -> tuple[Any, dict[str, str]]:
        """The store's past runs (a :class:`~sluice.control.history.RunHistory`) and each process's job shape."""
        from sluice.control.history import RunHistory, RunRecord, job_shape, reached_of

        hist = RunHistory()
        with self.shared.store.read() as s:
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
        return hist, shapes

    def propose(self, job: StoredJob) -> tuple[dict[str, Any], list[str]]:
        """The termination parameters the producer's policy proposes for ``job`` and why
        (:func:`sluice.control.policy.propose`); 400 when it cannot."""
        from sluice.control.history import job_shape
        from sluice.control.params import parse_model
        from sluice.control.policy import propose

        req = parse_requirements(job.requirements) if job.requirements else None
        try:
            prop = propose(self.shared.cfg.policy, self.history_and_shapes()[0], parse_model(job.model), req,
                           shape=job_shape(job.kind, job.raw, job.requirements))
        except ConfigError as exc:  # a metric of the engine's own that the policy cannot judge
            raise MnSError(400, f"the producer cannot propose parameters for this request: {exc}; send them "
                           "(decidedBy consumer)", bad_attributes=["VsDataContainer/sluice-negotiation"]) from exc
        fit_proposal(prop.termination.model_dump(**_DUMP), job)
        return prop.termination.model_dump(**_DUMP), list(prop.rationale)

    def new_process(self, tx: Tx, req: MOI, job: StoredJob, *, trigger: str, suspended: bool = False,
                    model: dict[str, Any] | None = None, last_report: str | None = None) -> MOI:
        """The next process of request ``req`` training ``job``, created in ``tx``; the request points to it."""
        tf = self.shared.tf
        n = len(req.internal.get("processes", [])) + 1
        pid = safe_id(f"{id_of(req.dn)}-{n}")
        while tx.get(f"{tf}/MLTrainingProcess={pid}") is not None:  # kept from a deleted request of this id
            n += 1
            pid = safe_id(f"{id_of(req.dn)}-{n}")
        ldn = f"{tf}/MLTrainingProcess={pid}"
        model = model or job.model
        decided = job.decided_by if trigger == "CONSUMER_REQUEST" else "agreed"
        neg: dict[str, Any] = {"decidedBy": job.decided_by, "state": "AGREED"}
        termination = job.termination
        if decided in ("producer", "negotiated"):
            termination, rationale = self.propose(job)
            neg["proposal"] = termination
            neg["rationale"] = rationale
            if decided == "negotiated":
                neg["state"] = "PROPOSED"
        record = created(Created(negotiated=neg["state"] == "PROPOSED", suspended=bool(suspended), kind=job.kind))
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
        if job.requirements:
            vs["sluice-requirements"] = job.requirements
        internal = {"phase": record.phase.value, "request": req.dn, "kind": job.kind, "raw": job.raw,
                    "model": model, "trigger": trigger, "termination": termination,
                    "requirements": job.requirements, "suspended": record.suspended, "queued_at": time.time(),
                    "last_report": last_report, "federation": job.federation,
                    **inherited(req.internal)}
        proc = tx.create(ldn, "MLTrainingProcess", attrs, vs, internal)
        ri = dict(req.internal)
        ri["processes"] = [*ri.get("processes", []), ldn]
        ri["current"] = ldn
        tx.update(req, internal=ri, notify=False)
        return proc
