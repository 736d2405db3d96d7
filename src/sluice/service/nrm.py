"""Names, errors and representations of the service's NRM (TS 28.105 classes in TS 28.532 ProvMnS form).

LDNs and DNs. A resource is addressed by its LDN, the URI path after ``{MnSRoot}/ProvMnS/{MnSVersion}``
(``SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingRequest=R1``); ``*Ref`` attributes and ``systemDN``
hold DNs, the same RDNs joined by commas (TS 32.300): ``SubNetwork=SN1,MLTrainingFunction=TF1,...``.
:func:`dn_to_ldn` turns one into the other, so every DN the service writes resolves with a GET.

Errors. :class:`MnSError` carries the HTTP status, the ``type`` (the values ONAP CPS uses:
``VALIDATION_ERROR``, ``IE_NOT_FOUND``, ``APPLICATION_LAYER_ERROR``, ``SERVER_LIMITATION``) and what was
wrong (``badAttributes``, ``badQueryParams``, ``badObjects``); :func:`error_body` renders it as the
3GPP error body of the request's method: ``ErrorResponseGet`` for GET, ``ErrorResponseDefault``
otherwise (for PATCH the ``ErrorResponseDefault`` branch of its ``oneOf``: no ``badOp``, so the body
matches exactly one branch).

Sluice's own fields travel in ``VsDataContainer`` entries ``{"id", "attributes": {"vsDataType",
"vsDataFormatVersion", "vsData"}}``; a consumer writes only ``vsData``, the producer stamps the type
(:data:`VS_TYPES`) and :data:`VS_FORMAT_VERSION`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

VS_FORMAT_VERSION = "1"

#: VsDataContainer ids Sluice knows, with the ``vsDataType`` the producer stamps on each.
VS_TYPES: dict[str, str] = {
    "sluice-job": "sluice.Job",
    "sluice-requirements": "sluice.Requirements",
    "sluice-termination": "sluice.Termination",
    "sluice-negotiation": "sluice.Negotiation",
    "sluice-status": "sluice.ProcessStatus",
    "sluice-report": "sluice.TrainingReport",
    "sluice-data": "sluice.TrainingData",
    "sluice-feedback": "sluice.Feedback",
    "sluice-trigger": "sluice.TriggerAnswer",
    "sluice-model": "sluice.ModelArtifact",
}

#: Which VsDataContainer ids a consumer may write, per class.
VS_WRITABLE: dict[str, frozenset[str]] = {
    "MLTrainingRequest": frozenset({"sluice-job", "sluice-requirements", "sluice-termination",
                                    "sluice-negotiation", "sluice-feedback"}),
    "MLTrainingProcess": frozenset({"sluice-termination", "sluice-requirements", "sluice-negotiation",
                                    "sluice-data"}),
    "NtfSubscriptionControl": frozenset(),
}

#: Attributes a consumer may write, per class (TS 28.105 / TS 28.623); any other known one is read-only.
WRITABLE: dict[str, frozenset[str]] = {
    "MLTrainingRequest": frozenset({
        "aIMLInferenceName", "fLRequirement", "candidateTrainingDataSource", "trainingDataQualityScore",
        "trainingRequestSource", "performanceRequirements", "rLRequirement", "cancelRequest", "suspendRequest",
        "trainingDataStatisticalProperties", "distributedTrainingExpectation", "mLKnowledgeName",
        "mLTrainingType", "expectedInferenceScope", "clusteringInfo", "mLModelRef", "mLModelCoordinationGroupRef",
    }),
    "MLTrainingProcess": frozenset({"priority", "terminationConditions", "cancelProcess", "suspendProcess"}),
    "NtfSubscriptionControl": frozenset({"notificationRecipientAddress", "notificationTypes", "scope",
                                         "notificationFilter"}),
}
READ_ONLY: dict[str, frozenset[str]] = {
    "MLTrainingRequest": frozenset({"requestStatus"}),
    "MLTrainingProcess": frozenset({"progressStatus", "trainingRequestRef", "participatingFLClientRefList",
                                    "trainingReportRef", "mLModelRef", "mLModelCoordinationGroupRef"}),
    "NtfSubscriptionControl": frozenset(),
}

PRODUCER_ONLY = frozenset({"MLTrainingReport", "MLModel", "MLTrainingFunction", "MLModelRepository",
                           "SubNetwork"})
CM_NOTIFICATION_TYPES = ("notifyMOICreation", "notifyMOIDeletion", "notifyMOIAttributeValueChanges")

_CLASS = re.compile(r"^[A-Za-z][A-Za-z0-9]*$")
_ID = re.compile(r"^[A-Za-z0-9_.\-~:]+$")

STATUS_TYPE = {400: "VALIDATION_ERROR", 404: "IE_NOT_FOUND", 405: "APPLICATION_LAYER_ERROR",
               406: "APPLICATION_LAYER_ERROR", 409: "APPLICATION_LAYER_ERROR", 413: "SERVER_LIMITATION",
               415: "APPLICATION_LAYER_ERROR", 422: "SERVER_LIMITATION", 500: "APPLICATION_LAYER_ERROR",
               503: "APPLICATION_LAYER_ERROR", 504: "APPLICATION_LAYER_ERROR"}
TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
          406: "Not Acceptable",
          409: "Conflict", 413: "Payload Too Large", 415: "Unsupported Media Type", 422: "Unprocessable Entity",
          500: "Internal Server Error", 503: "Service Unavailable", 504: "Gateway Timeout"}


@dataclass
class MnSError(Exception):
    """An error answered with a 3GPP error body."""

    status: int
    reason: str
    bad_attributes: list[str] = field(default_factory=list)
    bad_query_params: list[str] = field(default_factory=list)
    bad_objects: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.status}: {self.reason}"


def error_body(err: MnSError, method: str) -> dict[str, Any]:
    """The 3GPP error body of ``err`` for a request with HTTP ``method``."""
    body: dict[str, Any] = {
        "status": str(err.status),
        "type": STATUS_TYPE.get(err.status, "APPLICATION_LAYER_ERROR"),
        "title": TITLES.get(err.status, "Error"),
        "reason": err.reason,
    }
    if method.upper() == "GET":
        if err.bad_query_params:
            body["badQueryParams"] = list(err.bad_query_params)
    else:
        if err.bad_attributes:
            body["badAttributes"] = list(err.bad_attributes)
        if err.bad_objects:
            body["badObjects"] = list(err.bad_objects)
    return body


# ------------------------------------------------------------------------------------------------- names


@dataclass(frozen=True)
class Rdn:
    cls: str
    id: str


def parse_ldn(ldn: str) -> list[Rdn]:
    """The RDNs of an LDN ``Class=id/Class=id``; a malformed one is a 400 naming the bad segment."""
    if not ldn or ldn.startswith("/") or ldn.endswith("/"):
        raise MnSError(400, f"malformed LDN {ldn!r}: expected Class=id segments joined by '/'",
                       bad_objects=[ldn])
    out = []
    for seg in ldn.split("/"):
        cls, eq, rid = seg.partition("=")
        if not eq or not _CLASS.fullmatch(cls) or not _ID.fullmatch(rid):
            raise MnSError(400, f"malformed LDN segment {seg!r} in {ldn!r}: expected Class=id with a class "
                           "name of letters and digits and an id of letters, digits and _.-~:",
                           bad_objects=[ldn])
        out.append(Rdn(cls, rid))
    return out


def join_ldn(rdns: list[Rdn]) -> str:
    return "/".join(f"{r.cls}={r.id}" for r in rdns)


def ldn_to_dn(ldn: str) -> str:
    """The DN (comma form) of an LDN."""
    return ldn.replace("/", ",")


def dn_to_ldn(dn: str) -> str:
    """The LDN (URI path form) of a DN."""
    return ",".join(p.strip() for p in dn.split(",")).replace(",", "/")


def parent_of(ldn: str) -> str | None:
    head, sep, _ = ldn.rpartition("/")
    return head if sep else None


def class_of(ldn: str) -> str:
    return ldn.rpartition("/")[2].partition("=")[0]


def id_of(ldn: str) -> str:
    return ldn.rpartition("/")[2].partition("=")[2]


def check_id(rid: str, what: str = "id") -> str:
    if not isinstance(rid, str) or not _ID.fullmatch(rid):
        raise MnSError(400, f"{what} must be letters, digits and _.-~: only, got {rid!r}", bad_attributes=["id"])
    return rid


def safe_id(text: str) -> str:
    """``text`` with every character an RDN id cannot hold replaced by ``_``."""
    return re.sub(r"[^A-Za-z0-9_.\-~:]", "_", text) or "_"


def now_iso(t: float | None = None) -> str:
    """RFC 3339 time with milliseconds and an explicit offset."""
    return datetime.fromtimestamp(time.time() if t is None else t, UTC).isoformat(timespec="milliseconds")


# ------------------------------------------------------------------------------------------ VsData


def vs_container(cid: str, data: Any) -> dict[str, Any]:
    """One ``VsDataContainer`` entry as the producer shows it."""
    return {"id": cid, "attributes": {"vsDataType": VS_TYPES.get(cid, "sluice.Data"),
                                      "vsDataFormatVersion": VS_FORMAT_VERSION, "vsData": data}}


def read_vs(body: dict[str, Any], cls: str) -> dict[str, Any]:
    """The ``vsData`` a consumer sent, by container id; unknown ids, read-only fields and bad shapes are
    400s naming ``VsDataContainer/<id>``."""
    raw = body.get("VsDataContainer")
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise MnSError(400, "VsDataContainer must be a list of {id, attributes: {vsData}}",
                       bad_attributes=["VsDataContainer"])
    out: dict[str, Any] = {}
    allowed = VS_WRITABLE.get(cls, frozenset())
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            raise MnSError(400, f"VsDataContainer[{i}] needs a string id", bad_attributes=[f"VsDataContainer/{i}"])
        cid = entry["id"]
        where = f"VsDataContainer/{cid}"
        if cid not in allowed:
            raise MnSError(400, f"{cls} takes no VsDataContainer {cid!r}; writable ones: "
                           f"{', '.join(sorted(allowed)) or 'none'}", bad_attributes=[where])
        attrs = entry.get("attributes")
        if not isinstance(attrs, dict):
            raise MnSError(400, f"{where} needs attributes: {{vsData: ...}}", bad_attributes=[where])
        ro = sorted(set(attrs) & {"vsDataType", "vsDataFormatVersion"})
        if ro:
            raise MnSError(400, f"{where}: {', '.join(ro)} are read-only (the producer stamps them)",
                           bad_attributes=[f"{where}/{k}" for k in ro])
        extra = sorted(set(attrs) - {"vsData"})
        if extra:
            raise MnSError(400, f"{where}: unknown attributes {extra}", bad_attributes=[f"{where}/{k}" for k in extra])
        if cid in out:
            raise MnSError(400, f"VsDataContainer {cid!r} given twice", bad_attributes=[where])
        out[cid] = attrs.get("vsData")
    return out


def representation(row: Any, *, attributes: list[str] | None = None) -> dict[str, Any]:
    """The ``<Class>-Single`` JSON of a stored MOI (``attributes`` limits the attributes shown)."""
    attrs = dict(row.attributes)
    if attributes is not None:
        attrs = {k: v for k, v in attrs.items() if k in attributes}
    out: dict[str, Any] = {"id": id_of(row.dn), "objectClass": row.object_class,
                           "objectInstance": ldn_to_dn(row.dn), "attributes": attrs}
    if row.vs_data and (attributes is None or "VsDataContainer" in attributes):
        out["VsDataContainer"] = [vs_container(k, v) for k, v in row.vs_data.items()]
    return out


def select_fields(doc: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """Only the parts of ``doc`` named by ``fields`` (paths such as ``attributes/progressStatus/status``);
    ``id`` is always kept."""
    out: dict[str, Any] = {"id": doc["id"]}
    for path in fields:
        parts = [p for p in path.strip("/").split("/") if p]
        src: Any = doc
        ok = True
        for p in parts:
            if isinstance(src, dict) and p in src:
                src = src[p]
            else:
                ok = False
                break
        if not ok or not parts:
            continue
        dst = out
        for p in parts[:-1]:
            dst = dst.setdefault(p, {})
        dst[parts[-1]] = src
    return out
