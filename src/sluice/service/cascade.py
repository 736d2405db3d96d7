"""What deleting a request removes: the request's training records go with it, its models stay.

``DELETE`` of an ended ``MLTrainingRequest`` removes, in the same transaction (so the deletions are notified
together, ``notifyMOIDeletion`` for each), the request, every ``MLTrainingProcess`` it had (one per training),
their ``MLTrainingReport`` s, their checkpoints and the training data uploaded for them. These are records of
the request's trainings: without the request they would hold a ``trainingRequestRef`` to nothing.

The ``MLModel`` s the trainings produced stay in the ``MLModelRepository``: a model outlives the request that
trained it (it may be deployed and is still downloadable). Their reference to the deleted report
(``sluice-model.trainingReportRef``) is removed and ``sluice-model.trainingRequest`` says the request was
deleted, so that no DN the service shows points at a resource that is gone.
"""

from __future__ import annotations

import sqlalchemy as sa

from sluice.service.db import MOI, Checkpoint, Upload
from sluice.service.nrm import dn_to_ldn, ldn_to_dn, now_iso
from sluice.service.store import Tx


def delete_request_tree(tx: Tx, req: MOI) -> None:
    """Delete request ``req`` with its processes, reports, checkpoints and uploads; detach its models."""
    for proc_ldn in req.internal.get("processes", []):
        proc = tx.get(proc_ldn)
        if proc is None:
            continue
        report_dn = proc.attributes.get("trainingReportRef")
        model_dn = proc.attributes.get("mLModelRef")
        if isinstance(model_dn, str):
            _detach_model(tx, dn_to_ldn(model_dn), ldn_to_dn(req.dn))
        if isinstance(report_dn, str) and (report := tx.get(dn_to_ldn(report_dn))) is not None:
            tx.delete(report)
        ckpt = tx.s.get(Checkpoint, proc.dn)
        if ckpt is not None:
            tx.s.delete(ckpt)
        tx.delete(proc)
    tx.s.execute(sa.delete(Upload).where(Upload.request_dn == req.dn))
    tx.delete(req)


def _detach_model(tx: Tx, model_ldn: str, request_dn: str) -> None:
    model = tx.get(model_ldn)
    if model is None:
        return
    vs = dict(model.vs_data)
    info = {k: v for k, v in (vs.get("sluice-model") or {}).items() if k != "trainingReportRef"}
    info["trainingRequest"] = {"dn": request_dn, "deleted": now_iso()}
    vs["sluice-model"] = info
    tx.update(model, vs_data=vs)
