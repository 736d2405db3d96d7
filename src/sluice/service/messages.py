"""The queue and the worker's messages: a process starts, reports progress and checkpoints, and ends with its
``MLTrainingReport`` and ``MLModel``; a process that lost its worker goes back to the queue or ends."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

from sluice.control.clients import ClientReport
from sluice.control.lifecycle import (
    Checkpointed,
    Ended,
    EndWith,
    Interrupted,
    Iteration,
    Phase,
    ProcessRecord,
    Started,
    transition,
)
from sluice.control.params import Cause
from sluice.metrics import OPERATIONAL_METRICS
from sluice.roles.threegpp import fl_client_dn, fl_report_per_client, participating_fl_clients
from sluice.service.auth import inherited
from sluice.service.base import ENDED, Shared, _phase, set_process
from sluice.service.chain_cancels import ChainCancels
from sluice.service.db import MOI, Artifact, Checkpoint, Upload
from sluice.service.identity import stored_identity
from sluice.service.nrm import (
    id_of,
    ldn_to_dn,
    now_iso,
    safe_id,
)
from sluice.service.store import Tx
from sluice.service.tasks import producer_job
from sluice.service.validate import finite as _finite


class WorkerMessages:
    """The supervisor's side of one producer: the next queued process's worker spec (``next_spec``), what its
    workers report (``on_message``), and the end of a process (``end_process``) or of its worker
    (``requeue_interrupted``). ``history`` gives the store's past runs and each process's job shape."""

    def __init__(self, shared: Shared, chain_cancels: ChainCancels,
                 history: Callable[[], tuple[Any, dict[str, str]]]) -> None:
        self.shared = shared
        self.chain_cancels = chain_cancels
        self.history = history
        self._last_progress: dict[str, float] = {}

    # ------------------------------------------------------------------ the queue
    def next_spec(self) -> dict[str, Any] | None:
        """The next queued process's worker spec, with the runs of its job shape that the store remembers
        (``history``, ``history_shape``): its estimate of the remaining iterations learns from them."""
        spec = self._pick_next()
        if spec is None:
            return None
        try:
            hist, shapes = self.history()
        except Exception:  # noqa: BLE001 - the history is a help; a process starts without it
            return spec
        shape = shapes.get(id_of(spec["process"]))
        spec["history_shape"] = shape
        spec["history"] = [r.model_dump(mode="json") for r in hist.records if shape is not None and r.shape == shape]
        return spec

    def _pick_next(self) -> dict[str, Any] | None:
        cfg = self.shared.cfg
        with self.shared.store.write() as tx:
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
            set_process(tx, proc, attrs={"progressStatus": status},
                        internal={**after.changes(before), "started_at": time.time()})
            i = proc.internal
            resume = None
            ckpt = tx.s.get(Checkpoint, proc.dn) if i.get("resume") else None
            if ckpt is not None:
                resume = {"iteration": ckpt.iteration, "engine": ckpt.engine_state, "process": ckpt.process_state}
            raw = producer_job(i["raw"], cfg.tasks)  # a registered task: its factory, here only
            raw = {**raw, "model": {**(raw.get("model") or {}), **{k: v for k, v in i["model"].items()
                                                                    if v is not None}}}
            if i["kind"] == "chain":
                raw["endpoints"] = {n: cfg.producers[n].model_dump() for n in raw.get("producers", [])
                                    if n in cfg.producers}
                raw.update(self.chain_cancels.fields(proc))
            fed = i.get("federation")
            return {"process": proc.dn, "kind": i["kind"], "raw": raw,
                    "federation": None if fed is None else {"name": fed, "config": (
                        cfg.federations[fed].model_dump() if fed in cfg.federations else None)},
                    "termination": i.get("termination"), "requirements": i.get("requirements"),
                    "uploads": uploads, "progress_interval_s": cfg.progress_interval_s,
                    "checkpoint_every": cfg.checkpoint_every, "resume": resume,
                    "work_dir": None if cfg.work_dir is None else f"{cfg.work_dir}/{id_of(proc.dn)}"}

    # ------------------------------------------------------------------ worker messages
    def on_message(self, ldn: str, msg: dict[str, Any]) -> None:
        """Take one message of the worker of process ``ldn`` (checkpoint, progress, state, refused, failed,
        died, done); one about a process that is gone or has ended changes nothing."""
        kind = msg.get("kind")
        if kind == "checkpoint":
            with self.shared.store.write() as tx:
                proc = tx.get(ldn)
                if proc is None or not transition(ProcessRecord.of(proc.internal),
                                                  Checkpointed(int(msg["iteration"]))).effects:
                    return  # KeepCheckpoint
                tx.s.merge(Checkpoint(process_dn=ldn, iteration=int(msg["iteration"]), engine_state=msg["engine"],
                                      process_state=msg["process"], created_at=time.time()))
            return
        if kind == "progress":
            self._on_progress(ldn, msg["status"])
            return
        if kind == "state":
            with self.shared.store.write() as tx:
                proc = tx.get(ldn)
                if proc is None or _phase(proc) is Phase.ENDED:
                    return
                if msg["state"] in ENDED:
                    return  # the done message carries the report and the model
                self._apply_status(tx, proc, msg["status"], interim=msg.get("report"))
            return
        if kind == "refused":
            with self.shared.store.write() as tx:
                proc = tx.get(ldn)
                if proc is not None and _phase(proc) is not Phase.ENDED:
                    self.end_process(tx, proc, {"cause": Cause.CANCELLED.value, "status": "CANCELLED", "iterations": 0,
                                                "detail": f"refused before training: {msg.get('error')}",
                                                "model": proc.internal.get("model")}, None, None, refused=True)
            return
        if kind in ("failed", "died"):
            self._on_failure(ldn, msg)
            return
        if kind == "done":
            with self.shared.store.write() as tx:
                proc = tx.get(ldn)
                if proc is None or _phase(proc) is Phase.ENDED:
                    return
                report = msg["report"]
                refused = report.get("iterations", 0) == 0 and report.get("cause") in (
                    Cause.INSUFFICIENT_TRAINING_SAMPLES.value, Cause.INSUFFICIENT_COMPUTE.value)
                self.end_process(tx, proc, report, msg.get("model"), msg.get("model_name"), refused=refused)
            self._last_progress.pop(ldn, None)

    def _on_progress(self, ldn: str, status: dict[str, Any]) -> None:
        """Store a running process's status, at most every ``progress_interval_s`` unless its percentage moved."""
        now = time.monotonic()
        with self.shared.store.write() as tx:
            proc = tx.get(ldn)
            if proc is None or _phase(proc) is Phase.ENDED or self._repeated(proc, status):
                return
            old_pct = proc.attributes["progressStatus"].get("progressPercentage")
            if (status.get("progressPercentage") == old_pct
                    and now - self._last_progress.get(ldn, 0.0) < self.shared.cfg.progress_interval_s):
                return
            self._last_progress[ldn] = now
            self._apply_status(tx, proc, status)

    def _on_failure(self, ldn: str, msg: dict[str, Any]) -> None:
        """A worker that failed ends its process (ENGINE_FAILURE); one that died has it queued again."""
        with self.shared.store.write() as tx:
            proc = tx.get(ldn)
            if proc is None or _phase(proc) is Phase.ENDED:
                return
            if msg.get("kind") == "died":  # killed, or crashed: as after a restart of the service
                self.requeue_interrupted(tx, proc, f"its worker exited with code {msg.get('exitcode')}",
                                         self.shared.cfg.worker_restarts)
                return
            st = proc.vs_data.get("sluice-status") or {}
            detail = msg.get("error") or f"the worker exited with code {msg.get('exitcode')} before reporting"
            report = {"cause": Cause.ENGINE_FAILURE.value, "status": "FAILED", "detail": detail,
                      "iterations": st.get("iterations", 0), "performance": st.get("metrics", {}),
                      "duration_s": st.get("elapsed_s", 0.0), "model": proc.internal.get("model")}
            self.end_process(tx, proc, report, None, None, refused=bool(msg.get("before_training")))

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
        attrs: dict[str, Any] = {"progressStatus": ps}
        if st.get("participating_clients") and proc.internal.get("kind") == "hfl":
            tf = ldn_to_dn(self.shared.tf)
            attrs["participatingFLClientRefList"] = [fl_client_dn(c, tf) for c in st["participating_clients"]]
        set_process(tx, proc, attrs=attrs, vs={"sluice-status": vs_status}, internal=i)

    def requeue_interrupted(self, tx: Tx, row: MOI, why: str, limit: int | None = None) -> None:
        """A process that lost its worker (``why``: the service stopped, or the worker died) goes back to the
        queue (before anything queued later) to resume from its last checkpoint, or from scratch when it has
        none and its engine trains here; one that can do neither, was being cancelled, or already lost ``limit``
        workers, ends (FAILED with the reason, or CANCELLED): :class:`~sluice.control.lifecycle.Interrupted`.
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
                self.end_process(tx, row, report, None, None)
                return
        status = dict(row.attributes["progressStatus"])
        if status.get("status") != "SUSPENDED":
            status["progressStateInfo"] = "RESUMING"
        set_process(tx, row, attrs={"progressStatus": status}, internal=after.changes(before))

    def end_process(self, tx: Tx, proc: MOI, report: dict[str, Any], model_bytes: bytes | None,
                     model_name: str | None, *, refused: bool = False) -> None:
        """One transaction: the report (and the model with its file) are created, the process ends, the
        request follows; the notifications of all of it are queued together."""
        pid = id_of(proc.dn)
        rep_ldn = f"{self.shared.tf}/MLTrainingReport={pid}"
        model_ldn = None
        ident = report.get("model") or proc.internal.get("model") or {}
        if model_bytes:
            ident = report["model"] = stored_identity(tx, ident)
            model_ldn = self._store_model(tx, proc, ident, model_bytes, model_name, rep_ldn)
        perf = {k: v for k, v in (report.get("performance") or {}).items() if _finite(v)}
        clients = [ClientReport.model_validate(c) for c in report.get("clients") or []]
        if tx.get(rep_ldn) is None:
            vs_report = {k: v for k, v in report.items() if k != "model_path"}
            vs_report.update(refused=refused, run_metrics={k: v for k, v in perf.items() if k in OPERATIONAL_METRICS})
            tx.create(rep_ldn, "MLTrainingReport", self._report_attributes(proc, perf, clients, model_ldn),
                      {"sluice-report": vs_report}, inherited(proc.internal))
        ps = _ended_progress(proc, report)
        attrs = {"progressStatus": ps, "trainingReportRef": ldn_to_dn(rep_ldn)}
        if clients:
            attrs["participatingFLClientRefList"] = participating_fl_clients(clients, ldn_to_dn(self.shared.tf))
        if model_ldn is not None:
            attrs["mLModelRef"] = ldn_to_dn(model_ldn)
        st = _ended_status(proc, report, perf, ps)
        before = ProcessRecord.of(proc.internal)
        after, effects = transition(before, Ended(refused))
        set_process(tx, proc, attrs=attrs, vs={"sluice-status": st},
                    internal={"phase": after.phase.value, "refused": after.refused, "ended_at": time.time(),
                              "model": ident or proc.internal.get("model")})
        ckpt = tx.s.get(Checkpoint, proc.dn) if effects else None  # DropCheckpoint
        if ckpt is not None:
            tx.s.delete(ckpt)

    def _report_attributes(self, proc: MOI, perf: dict[str, float], clients: list[ClientReport],
                           model_ldn: str | None) -> dict[str, Any]:
        """The 3GPP attributes of an ended process's ``MLTrainingReport``."""
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
        if clients:
            rattrs["fLReportPerClient"] = fl_report_per_client(clients, ldn_to_dn(self.shared.tf))
        if proc.internal.get("last_report"):
            rattrs["lastTrainingRef"] = proc.internal["last_report"]
        if model_ldn is not None:
            rattrs["mLModelGeneratedRef"] = ldn_to_dn(model_ldn)
        return rattrs

    def _store_model(self, tx: Tx, proc: MOI, ident: dict[str, Any], model_bytes: bytes, model_name: str | None,
                     rep_ldn: str) -> str:
        """The ``MLModel`` of a process that trained one, with its file; its LDN."""
        pid = id_of(proc.dn)
        base = safe_id(f"{ident.get('id', 'model')}-v{ident.get('version', '1')}")
        repo = self.shared.repo
        model_ldn = f"{repo}/MLModel={base}"
        if tx.get(model_ldn) is not None:
            model_ldn = f"{repo}/MLModel={base}-{pid}"
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


def _ended_progress(proc: MOI, report: dict[str, Any]) -> dict[str, Any]:
    """The ``progressStatus`` of a process ending with ``report`` (a status other than an end one is FAILED)."""
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
    return ps


def _ended_status(proc: MOI, report: dict[str, Any], perf: dict[str, float], ps: dict[str, Any]) -> dict[str, Any]:
    """The ``sluice-status`` of a process ending with ``report``: what the report says, not the last progress."""
    st = dict(proc.vs_data.get("sluice-status") or {})
    st.update(state=ps["status"], iterations=report.get("iterations", st.get("iterations", 0)),
              cause=report.get("cause"), detail=report.get("detail", ""),
              estimated_remaining_iterations=report.get("estimated_remaining_iterations"),
              estimated_remaining_s=report.get("estimated_remaining_s"),
              bytes_up=report.get("bytes_up", st.get("bytes_up", 0)),
              bytes_down=report.get("bytes_down", st.get("bytes_down", 0)))
    if "performance" in report:
        st.update(metrics=perf, elapsed_s=report.get("duration_s", st.get("elapsed_s")))
    if "progressPercentage" in ps:
        st["progress_percent"] = ps["progressPercentage"]
    return st
