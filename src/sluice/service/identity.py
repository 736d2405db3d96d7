"""The identity (``mLModelId``, ``mLModelVersion``) of the models a service trains.

* ``mLModelId`` is the consumer's ``[model] id`` in the request's ``sluice-job``; a request that names none
  gets one derived from the request: the engine's default id followed by the request id
  (``local-digits-mlp-R1``), so that two requests for the same kind of job never share an identity.
* ``mLModelVersion`` counts per identity, across requests: a model is stored with the version its training
  asked for (``[model] version``, ``1`` by default, the next one for a retraining) unless a model of the
  same id already has it; then it takes the next version after the highest of that id. The report and the
  process show the version the model was stored with.
"""

from __future__ import annotations

from typing import Any

from sluice.service.nrm import safe_id
from sluice.service.store import Tx


def request_model(model: dict[str, Any], named: dict[str, Any], rid: str) -> dict[str, Any]:
    """The identity of request ``rid``'s model: ``model`` as parsed, its id derived from the request when the
    consumer's ``[model]`` section (``named``) gives none."""
    if "id" in named:
        return model
    return {**model, "id": safe_id(f"{model['id']}-{rid}")}


def _next(version: str, taken: set[str]) -> str:
    numbers = [int(v) for v in taken if v.isdigit()]
    if version.isdigit() or not version:
        return str(max([*numbers, int(version or 0)]) + 1)
    n = 1
    while f"{version}.{n}" in taken:
        n += 1
    return f"{version}.{n}"


def stored_identity(tx: Tx, ident: dict[str, Any]) -> dict[str, Any]:
    """``ident`` with a version no stored model of its id has yet (see the module docstring)."""
    mid, version = str(ident.get("id", "model")), str(ident.get("version", "1"))
    taken = {str(m.attributes.get("mLModelVersion")) for m in tx.of_class("MLModel")
             if m.attributes.get("mLModelId") == mid}
    if version in taken:
        version = _next(version, taken)
    return {**ident, "id": mid, "version": version}
