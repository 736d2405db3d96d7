"""Processes: the consumer's controls (cancel, suspend/resume, parameters, the answer to a proposal, training
data), as the transitions of :mod:`sluice.control.lifecycle`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from sluice.config import merge_patch
from sluice.control.lifecycle import (
    Agreed,
    Cancel,
    EndWith,
    Phase,
    ProcessRecord,
    Refused,
    SendWorker,
    Suspend,
    transition,
)
from sluice.control.params import parse_requirements, parse_termination
from sluice.control.report import brief
from sluice.errors import ConfigError
from sluice.service.base import _DUMP, Shared, _phase, call_worker, check_attrs, set_process
from sluice.service.db import MOI
from sluice.service.nrm import (
    READ_ONLY,
    MnSError,
    now_iso,
)
from sluice.service.store import Tx
from sluice.service.validate import config_error as _config_error
from sluice.service.validate import parse_conditions
from sluice.service.worker import Supervisor, WorkerGone


class EndProcess(Protocol):
    """What ends a process with its report and model (:meth:`sluice.service.messages.WorkerMessages.end_process`)."""

    def __call__(self, tx: Tx, proc: MOI, report: dict[str, Any], model_bytes: bytes | None,
                 model_name: str | None, *, refused: bool = False) -> None: ...


class Processes:
    """The consumer's controls of a process, each a transition of :mod:`sluice.control.lifecycle` whose
    effects are carried out here: a worker told (``supervisor``), or the process ended without one
    (``end_process``); training data for a process goes to ``upload``."""

    def __init__(self, shared: Shared, supervisor: Supervisor, end_process: EndProcess,
                 upload: Callable[[str, Any], MOI]) -> None:
        self.shared = shared
        self.supervisor = supervisor
        self.end_process = end_process
        self.upload = upload

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

    def cancel_pending(self, tx: Tx, proc: MOI) -> None:
        """End a process that has no worker as CANCELLED, through CANCELLING."""
        before = ProcessRecord.of(proc.internal)
        after, effects = transition(before, Cancel())
        set_process(tx, proc, attrs={"cancelProcess": True}, internal=after.changes(before))
        for end in effects:
            if isinstance(end, EndWith):
                self.end_process(tx, proc, self._ended_with(proc, end), None, None)

    def cancel(self, proc_ldn: str) -> None:
        with self.shared.store.write() as tx:
            proc = tx.get(proc_ldn)
            assert proc is not None
            before = ProcessRecord.of(proc.internal)
            after, effects = transition(before, Cancel())
            if not effects:
                return  # it has ended
            attrs: dict[str, Any] = {"cancelProcess": True}
            if before.phase.active:
                attrs["progressStatus"] = {**proc.attributes["progressStatus"], "progressStateInfo": "CANCELLING"}
            set_process(tx, proc, attrs=attrs, internal=after.changes(before))
        for effect in effects:
            if isinstance(effect, EndWith):
                with self.shared.store.write() as tx:  # a second transaction: CANCELLING, then CANCELLED
                    proc = tx.get(proc_ldn)
                    assert proc is not None
                    self.end_process(tx, proc, self._ended_with(proc, effect), None, None)
            elif isinstance(effect, SendWorker):
                self._send(proc_ldn, effect)

    def suspend(self, proc_ldn: str, on: bool) -> None:
        with self.shared.store.write() as tx:
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
            set_process(tx, proc, attrs=attrs, internal={"suspended": after.suspended})
            req = tx.get(proc.internal["request"])
            if req is not None and req.attributes.get("suspendRequest") != on:
                tx.update(req, attributes={**req.attributes, "suspendRequest": on})
        for effect in effects:
            if isinstance(effect, SendWorker):
                self._send(proc_ldn, effect)

    def modify(self, ldn: str, attrs_in: dict[str, Any], vs_in: dict[str, Any], *, merge: bool) -> MOI:
        """PATCH/PUT of a process: cancel, suspend/resume, priority, termination conditions, the answer to
        a proposal, and training data."""
        proc = self.shared.get(ldn)
        old, attrs = _process_attrs(proc, attrs_in, merge)
        record = ProcessRecord.of(proc.internal)
        phase = record.phase
        data = vs_in.pop("sluice-data", None)
        neg = vs_in.pop("sluice-negotiation", None)
        new_term, replace = self._new_termination(proc, attrs, old, vs_in.pop("sluice-termination", None), merge)
        new_req = self._new_requirements(proc, vs_in.pop("sluice-requirements", None))
        cancel = attrs["cancelProcess"] and not old.get("cancelProcess", False)
        suspend_change = attrs["suspendProcess"] != old.get("suspendProcess", False)
        if phase is Phase.ENDED:
            _refuse_on_ended(proc, cancel, suspend_change, new_term is not None or new_req is not None)
        for effect in transition(record, Agreed()).effects if neg is not None else ():
            if isinstance(effect, Refused):
                raise MnSError(effect.code, effect.reason, bad_attributes=["VsDataContainer/sluice-negotiation"])
        if data is not None:
            return self.upload(ldn, data)
        if phase is Phase.PROPOSED and (neg is not None or new_term is not None):
            self._answer_proposal(ldn, neg, new_term, new_req)
        sent = phase.active and (new_term is not None or new_req is not None)
        if sent:
            self._send_parameters(proc, new_term, replace, new_req)
        self._store_parameters(ldn, attrs.get("priority"), new_term, new_req, sent=sent)
        if suspend_change:
            self.suspend(ldn, attrs["suspendProcess"])
        if cancel:
            self.cancel(ldn)
        self.supervisor.wake()
        return self.shared.get(ldn)

    def _send_parameters(self, proc: MOI, new_term: dict[str, Any] | None, replace: bool,
                         new_req: dict[str, Any] | None) -> None:
        """Send a running process's worker its new termination parameters and/or requirements."""
        cmd: dict[str, Any] = {"cmd": "update"}
        if new_term is not None:
            cmd.update(termination=new_term, replace=replace)
        if new_req is not None:
            cmd["requirements"] = new_req
        call_worker(self.supervisor, proc, cmd, "terminationConditions")

    def _store_parameters(self, ldn: str, priority: int | None, new_term: dict[str, Any] | None,
                          new_req: dict[str, Any] | None, *, sent: bool) -> None:
        """Record a changed priority, and new termination parameters or requirements: those the worker took
        (``sent``) even when they ended its run meanwhile, the others unless the process ended."""
        with self.shared.store.write() as tx:
            p = tx.get(ldn)
            assert p is not None
            a: dict[str, Any] = {}
            i: dict[str, Any] = {}
            v: dict[str, Any] = {}
            keep = sent or _phase(p) is not Phase.ENDED
            if priority is not None and priority != p.attributes.get("priority"):
                a["priority"] = priority
            if new_term is not None and keep:
                a["terminationConditions"] = brief(parse_termination(new_term))
                v["sluice-termination"] = new_term
                i["termination"] = new_term
            if new_req is not None and keep:
                v["sluice-requirements"] = new_req
                i["requirements"] = new_req
            if a or v or i:
                set_process(tx, p, attrs=a, vs=v, internal=i)

    @staticmethod
    def _new_termination(proc: MOI, attrs: dict[str, Any], old: dict[str, Any], term_patch: Any,
                         merge: bool) -> tuple[dict[str, Any] | None, bool]:
        """The termination parameters a PATCH/PUT of a process sets (None: unchanged), checked; and whether
        they replace the old ones."""
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
        return new_term, replace

    @staticmethod
    def _new_requirements(proc: MOI, req_patch: Any) -> dict[str, Any] | None:
        """The requirements a PATCH/PUT of a process merges in (None: unchanged), checked."""
        if req_patch is None:
            return None
        try:
            merged = merge_patch(proc.internal.get("requirements") or {}, req_patch)
            return parse_requirements(merged).model_dump(**_DUMP)
        except ConfigError as exc:
            raise _config_error(exc, "VsDataContainer/sluice-requirements") from exc

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
        with self.shared.store.write() as tx:
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
            set_process(tx, p, attrs={"progressStatus": status,
                                      "terminationConditions": brief(parse_termination(agreed))},
                        vs=vs, internal=internal)


def _process_attrs(proc: MOI, attrs_in: dict[str, Any], merge: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """A process's writable attributes before and after a PUT (``attrs_in`` replaces them) or a merge patch
    (``merge``), checked; the controls keep their old values unless given."""
    old = {k: v for k, v in proc.attributes.items() if k not in READ_ONLY["MLTrainingProcess"]}
    attrs = check_attrs("MLTrainingProcess", merge_patch(old, attrs_in) if merge else attrs_in, old=proc.attributes)
    for k in ("cancelProcess", "suspendProcess"):
        attrs.setdefault(k, old.get(k, False))
    if "priority" in attrs and (not isinstance(attrs["priority"], int) or isinstance(attrs["priority"], bool)):
        raise MnSError(400, "priority must be an integer", bad_attributes=["priority"])
    return old, attrs


def _refuse_on_ended(proc: MOI, cancel: bool, suspend_change: bool, parameters: bool) -> None:
    """409 for a change an ended process cannot take (cancelling a cancelled one again is a no-op)."""
    if cancel and proc.attributes["progressStatus"]["status"] != "CANCELLED":
        raise MnSError(409, "the process has ended; it cannot be cancelled", bad_attributes=["cancelProcess"])
    if suspend_change:
        raise MnSError(409, "the process has ended; it cannot be suspended or resumed",
                       bad_attributes=["suspendProcess"])
    if parameters:
        raise MnSError(409, "the process has ended; its parameters cannot change",
                       bad_attributes=["terminationConditions"])
