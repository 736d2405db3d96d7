"""Training data (T6) and retraining (T7): uploads, consumer feedback, and the new process either starts."""

from __future__ import annotations

import time
from typing import Any, Protocol

from sluice.control.lifecycle import (
    Phase,
)
from sluice.errors import ConfigError
from sluice.service.base import Shared, _phase, call_worker, set_process, sync_request
from sluice.service.db import MOI, Upload
from sluice.service.nrm import (
    MnSError,
    ldn_to_dn,
    now_iso,
)
from sluice.service.store import Tx
from sluice.service.validate import check_data
from sluice.service.vsdata import StoredJob
from sluice.service.vsdata import feedback as read_feedback
from sluice.service.worker import Supervisor


class NewProcess(Protocol):
    """What creates a request's next process (:meth:`sluice.service.proposals.Proposals.new_process`)."""

    def __call__(self, tx: Tx, req: MOI, job: StoredJob, *, trigger: str, suspended: bool = False,
                 model: dict[str, Any] | None = None, last_report: str | None = None) -> MOI: ...


class Retraining:
    """Training data for a process (T6), consumer feedback, and the retraining either starts (T7): a new
    process of the request (``new_process``), which the ``supervisor`` is woken for."""

    def __init__(self, shared: Shared, supervisor: Supervisor, new_process: NewProcess) -> None:
        self.shared = shared
        self.supervisor = supervisor
        self.new_process = new_process

    # ------------------------------------------------------------------ data (T6) and triggers (T7)
    def upload(self, proc_ldn: str, data: Any) -> MOI:
        """Training data for a process: a running one checks and takes it at once (a 400 says why it cannot);
        an ended one is retrained with it (updated training data, T7): a new process, the next version."""
        data = check_data(data)
        proc = self.shared.get(proc_ldn)
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
            return self.shared.get(proc_ldn)
        if phase.active:
            call_worker(self.supervisor, proc, {"cmd": "data", "data": data}, "VsDataContainer/sluice-data")
        with self.shared.store.write() as tx:
            p = tx.get(proc_ldn)
            assert p is not None
            self._store_upload(tx, p, data)
        return self.shared.get(proc_ldn)

    def _request_features(self, proc: MOI) -> int | None:
        """Features per sample of the data the request of ``proc`` took so far (``sluice-data.features`` of
        its processes, the latest first), or None before its first accepted upload."""
        req = self.shared.store.get(proc.internal.get("request", ""))
        for ldn in reversed(req.internal.get("processes", []) if req is not None else [proc.dn]):
            row = proc if ldn == proc.dn else self.shared.store.get(ldn)
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
        set_process(tx, proc, vs={"sluice-data": st})

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
        policy = self.shared.cfg.policy
        thr = policy.retrain_below.get(name)
        value = fb.value
        req = self.shared.get(req_ldn)
        proc = self.shared.get(req.internal["current"])
        if thr is None:
            answer = {"accepted": False, "reason": f"no retraining threshold for {name}; the policy has "
                      f"{sorted(policy.retrain_below)}"}
        elif (value >= thr) if higher else (value <= thr):
            answer = {"accepted": False, "reason": f"{name} in use {value:g} meets threshold {thr:g}; no retraining"}
        elif _phase(proc) is not Phase.ENDED:
            answer = {"accepted": False, "reason": "the model is still in training"}
        else:
            self._retrain(req_ldn, "CONSUMER_FEEDBACK", f"{name} in use {value:g} is worse than {thr:g}: retraining")
            return
        with self.shared.store.write() as tx:
            r = tx.get(req_ldn)
            assert r is not None
            tx.update(r, vs_data={**r.vs_data, "sluice-trigger": {"trigger": "CONSUMER_FEEDBACK", **answer,
                                                                  "at": now_iso()}})

    def _retrain(self, req_ldn: str, trigger: str, why: str,
                 upload: tuple[str, dict[str, Any]] | None = None) -> None:
        """A new process of the request, the next model version; ``upload`` (process LDN, data) is stored in
        the same transaction, so a refusal (409) leaves everything as it was."""
        from sluice.control.params import parse_model

        with self.shared.store.write() as tx:
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
            termination = last.internal.get("termination")
            job = StoredJob.of(req.internal["job"]).model_copy(update={
                "termination": termination, "requirements": last.internal.get("requirements"),
                "decided_by": "consumer" if termination is not None else "producer"})
            proc = self.new_process(tx, req, job, trigger=trigger, model=model,
                                    last_report=last.attributes.get("trainingReportRef"))
            tx.update(req, vs_data={**req.vs_data, "sluice-trigger": {
                "trigger": trigger, "accepted": True, "reason": why, "process": ldn_to_dn(proc.dn),
                "model": model, "at": now_iso()}})
            sync_request(tx, proc)
        self.supervisor.wake()
