#!/usr/bin/env python3
"""Build the pruned, self-contained OpenAPI bundle that Sluice's ProvMnS service validates against and serves.

The official 3GPP files (TS 28.105 AI/ML NRM, TS 28.532 ProvMnS, TS 28.623 generic NRM fragments, TS 28.104 MDA NRM)
refer to each other and to many files that are not needed for ML training management. Generating models or running
fuzzers on their full closure fails or explodes, and several of their schemas cannot validate any value at all under
a strict validator (``oneOf`` branches that every value matches). This script therefore

1. reads the official YAML files (never modifying them),
2. applies the deviations listed in ``DEVIATIONS`` to an in-memory copy, each for a stated reason,
3. walks the ``$ref`` closure from the schemas the service uses plus the ``paths`` it exposes,
4. renames every reached schema to a local ``#/components/schemas/<name>`` (names of other TS files get their
   TS number as a prefix where two files define the same name), stubs references into files that are not present,
5. writes one deterministic JSON document (sorted keys) whose ``info`` lists every deviation and stub.

The bundle is rebuilt by a test and must not differ from the committed file, so any change of the sources or of
this script shows up as a diff.

Usage: ``python scripts/build_openapi_bundle.py [--source DIR] [--output FILE] [--check]``
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO.parent / "shared" / "reference" / "3gpp"
DEFAULT_OUTPUT = REPO / "src" / "sluice" / "service" / "openapi" / "bundle.json"
BUNDLE_VERSION = "1.0.0"

AIML = "TS28105_AiMlNrm.yaml"
PROV = "TS28532_ProvMnS.yaml"
COMDEFS = "TS28623_ComDefs.yaml"
GENERIC = "TS28623_GenericNrm.yaml"
SUBSCR = "TS28623_SubscriptionControlNrm.yaml"
THRESH = "TS28623_ThresholdMonitorNrm.yaml"

SCHEMAS_PREFIX = "#/components/schemas/"

ROOTS: list[tuple[str, str]] = [
    (AIML, "MLTrainingRequest-Single"),
    (AIML, "MLTrainingProcess-Single"),
    (AIML, "MLTrainingReport-Single"),
    (AIML, "MLModel-Single"),
    (AIML, "MLModelRepository-Single"),
    (AIML, "MLTrainingFunction-Single"),
    (AIML, "RequestStatus"),
    (SUBSCR, "NtfSubscriptionControl-Single"),
    (PROV, "NotifyMoiCreation"),
    (PROV, "NotifyMoiAttributeValueChanges"),
    (PROV, "NotifyMoiDeletion"),
    (COMDEFS, "NotificationHeader"),
    (PROV, "PatchItem"),
    (PROV, "PatchDocument"),
    (PROV, "Scope"),
    (PROV, "CmNotificationTypes"),
    (COMDEFS, "ErrorResponseDefault"),
    (COMDEFS, "ErrorResponseGet"),
    (COMDEFS, "ErrorResponsePatch"),
    (COMDEFS, "ErrorResponse"),
    (PROV, "PatchErrorResponse"),
    (PROV, "Resource"),
    (GENERIC, "VsDataContainer-Single"),
    (GENERIC, "VsDataContainer-Multiple"),
]
"""Schemas the service uses directly; everything they reference is pulled in by the walk."""

WRITABLE_CLASSES: dict[str, str] = {
    "MLTrainingRequest": AIML,
    "MLTrainingProcess": AIML,
    "MLTrainingReport": AIML,
    "MLModel": AIML,
    "NtfSubscriptionControl": SUBSCR,
}
"""Leaf classes whose representations the service reads or writes, with the file that defines them."""

CLASS_CHILDREN: dict[str, tuple[str, ...]] = {"NtfSubscriptionControl": ("HeartbeatControl",)}
"""Name-contained children a leaf representation may carry besides the ``Top`` members."""

ID_PATTERN = r"^[^/,=\s]+$"
"""A non-empty RDN value without the characters that separate URI segments or DN parts (TS 32.158 4.4)."""


class BuildError(Exception):
    """The sources are not what the deviations expect, or the result is not self-contained."""


@dataclass(frozen=True)
class Deviation:
    """One change of the official definitions: what, where, and why."""

    id: str
    kind: str  # "defect-fix" | "tightening" | "addition" | "restructure"
    target: str
    change: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "kind": self.kind, "target": self.target, "change": self.change, "reason": self.reason}


# --------------------------------------------------------------------------------------------------------------
# Sources


class Sources:
    """The official YAML files of one directory, loaded on first use; remembers the SHA-256 of each file read."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.docs: dict[str, dict[str, Any]] = {}
        self.sha256: dict[str, str] = {}

    def has(self, name: str) -> bool:
        return name in self.docs or (self.directory / name).is_file()

    def doc(self, name: str) -> dict[str, Any]:
        if name not in self.docs:
            raw = (self.directory / name).read_bytes()
            self.sha256[name] = hashlib.sha256(raw).hexdigest()
            self.docs[name] = yaml.safe_load(raw)
        return self.docs[name]

    def schemas(self, name: str) -> dict[str, Any]:
        return self.doc(name)["components"]["schemas"]

    def schema(self, name: str, schema: str) -> dict[str, Any]:
        try:
            return self.schemas(name)[schema]
        except KeyError:
            raise BuildError(f"{name} defines no schema {schema!r}") from None


def _node(root: Any, path: tuple[Any, ...], where: str) -> Any:
    node = root
    for step in path:
        try:
            node = node[step]
        except (KeyError, IndexError, TypeError):
            missing = "/".join(map(str, path))
            raise BuildError(f"{where}: no {missing} - the source changed, review the deviation") from None
    return node


def _one_of_to_any_of(node: dict[str, Any], where: str) -> None:
    if "oneOf" not in node:
        raise BuildError(f"{where}: expected a oneOf - the source changed, review the deviation")
    node["anyOf"] = node.pop("oneOf")


# --------------------------------------------------------------------------------------------------------------
# Deviations applied to the in-memory copy of the sources (each function checks that the source still has the
# defect it fixes, so a corrected source makes the build fail instead of silently carrying a stale deviation)

Patch = Callable[[Sources], None]
DEVIATIONS: list[tuple[Deviation, Patch]] = []


def deviation(id_: str, kind: str, target: str, change: str, reason: str) -> Callable[[Patch], Patch]:
    def register(fn: Patch) -> Patch:
        DEVIATIONS.append((Deviation(id_, kind, target, change, reason), fn))
        return fn

    return register


def _to_any_of(file: str, schema: str, *path: Any) -> Patch:
    def patch(src: Sources) -> None:
        _one_of_to_any_of(_node(src.schema(file, schema), path, f"{file}#{schema}"), f"{file}#{schema}")

    return patch


def _register_any_of(id_: str, file: str, schema: str, path: tuple[Any, ...], reason: str) -> None:
    target = f"{file}#/components/schemas/{schema}" + "".join(f"/{p}" for p in path)
    deviation(id_, "defect-fix", target, "oneOf -> anyOf", reason)(_to_any_of(file, schema, *path))


_OVERLAP = "every valid value matches several branches, so a strict validator rejects every value under oneOf"
_register_any_of(
    "D01", AIML, "AIMLInferenceName", (),
    "AIMLInferenceName = oneOf[MDAType, NwdafAnalyticsType, NgRanInferenceType, VSExtensionType(string)]: every "
    "enumerated value also matches the plain string VSExtensionType, so a strict validator rejects every value "
    "(e.g. COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS). The enumerations remain the documented names.",
)
_REQ_ATTR = ("allOf", 1, "properties", "attributes", "allOf", 0, "properties")
_register_any_of(
    "D02", AIML, "MLTrainingRequest-Single", _REQ_ATTR + ("trainingRequestSource",),
    "trainingRequestSource = oneOf[string, Dn(string)]: " + _OVERLAP + ".",
)
_register_any_of(
    "D03", THRESH, "ThresholdInfo", ("properties", "thresholdValue"),
    "thresholdValue = oneOf[integer, Float(number)]: every integer is also a number, so integers are rejected.",
)
_register_any_of(
    "D04", THRESH, "ThresholdInfo", ("properties", "hysteresis"),
    "hysteresis = oneOf[integer >= 0, number]: every non-negative integer is also a number, so it is rejected.",
)
def _any_of_required(file: str, schema: str, path: tuple[Any, ...], members: list[str]) -> Patch:
    def patch(src: Sources) -> None:
        where = f"{file}#{schema}"
        node = _node(src.schema(file, schema), path, where)
        _one_of_to_any_of(node, where)
        if len(node["anyOf"]) != len(members):
            raise BuildError(f"{where}: the number of branches changed - review the deviation")
        for branch, member in zip(node["anyOf"], members, strict=True):
            if member not in branch.get("properties", {}) or "required" in branch:
                raise BuildError(f"{where}: branch without {member!r} or with required - review the deviation")
            branch["required"] = [member]

    return patch


def _register_choice(id_: str, file: str, schema: str, members: list[str], reason: str) -> None:
    deviation(
        id_, "defect-fix", f"{file}#/components/schemas/{schema}",
        f"oneOf -> anyOf, and each branch requires its own member ({' / '.join(members)})",
        reason + " Without the required members every object (even a wrong one) would match the anyOf.",
    )(_any_of_required(file, schema, (), members))


_register_choice(
    "D05", AIML, "EnvironmentScope", ["managedEntitiesScope", "areaScope", "timeWindow"],
    "the branches are objects without required members: " + _OVERLAP + ".",
)
_register_choice(
    "D06", COMDEFS, "GeoArea", ["geoPolygon", "geoCircle"],
    "the branches are objects without required members: " + _OVERLAP + ".",
)
_register_choice(
    "D07", SUBSCR, "Scope", ["scopeType", "dataNodeSelector"],
    "the branches (scopeType/scopeLevel or dataNodeSelector) are objects without required members: " + _OVERLAP
    + " (e.g. {scopeType: BASE_SUBTREE}).",
)
_register_any_of(
    "D08", SUBSCR, "Scope", ("anyOf", 1, "properties", "dataNodeSelector"),
    "dataNodeSelector = oneOf[JexNodeSelectionBasic, JexNodeSelectionAdvanced], both plain strings: " + _OVERLAP + ".",
)
_register_any_of(
    "D09", COMDEFS, "NotificationType", (),
    "four of the five branches lie in files that are not present and are stubbed as strings (see x-sluice-stubs): "
    + _OVERLAP + ". The ProvMnS notification types stay enumerated in CmNotificationTypes.",
)


@deviation(
    "D10", "defect-fix", f"{PROV}#/components/schemas/Resource",
    "oneOf[object, TS28623_FeatureNrm.yaml#resources-feature] -> the object branch alone",
    "TS28623_FeatureNrm.yaml is not among the sources; a stub for it would accept every object, and every object "
    "would then match both branches of the oneOf.",
)
def _resource(src: Sources) -> None:
    res = src.schema(PROV, "Resource")
    branches = _node(res, ("oneOf",), f"{PROV}#Resource")
    if len(branches) != 2 or branches[1] != {"$ref": "TS28623_FeatureNrm.yaml#/components/schemas/resources-feature"}:
        raise BuildError(f"{PROV}#Resource: unexpected oneOf - the source changed, review deviation D10")
    src.schemas(PROV)["Resource"] = branches[0]


@deviation(
    "D11", "defect-fix", f"{GENERIC}#/components/schemas/Top/properties/id",
    f"nullable string -> non-null string with minLength 1 and pattern {ID_PATTERN}",
    "id is the RDN value of the resource and is required; a null or empty id cannot name a resource, and "
    "schema-based fuzzers otherwise send id: null on PUT and flag the producer's 400 as a conformance failure. "
    "The pattern excludes the characters that would change the URI or DN structure.",
)
def _top_id(src: Sources) -> None:
    ident = _node(src.schema(GENERIC, "Top"), ("properties", "id"), f"{GENERIC}#Top")
    if ident.get("nullable") is not True:
        raise BuildError(f"{GENERIC}#Top.id is no longer nullable - review deviation D11")
    del ident["nullable"]
    ident.update({"minLength": 1, "pattern": ID_PATTERN})


@deviation(
    "D12", "defect-fix", f"{AIML}#/components/schemas/MLTestingReport-Multiple/items",
    "$ref MLTestingRequest-Single -> $ref MLTestingReport-Single",
    "copy-paste error: the list of MLTestingReport children pointed to the MLTestingRequest class.",
)
def _testing_report(src: Sources) -> None:
    items = _node(src.schema(AIML, "MLTestingReport-Multiple"), ("items",), f"{AIML}#MLTestingReport-Multiple")
    if items != {"$ref": "#/components/schemas/MLTestingRequest-Single"}:
        raise BuildError(f"{AIML}#MLTestingReport-Multiple.items changed - review deviation D12")
    items["$ref"] = "#/components/schemas/MLTestingReport-Single"


@deviation(
    "D13", "defect-fix", f"{AIML}#/components/schemas/ProcessMonitor",
    "readOnly: true on the data type and on each of its members",
    "progress is reported by the producer: the generic ProcessMonitor of TS28623_GenericNrm.yaml marks every member "
    "readOnly and the TS 28.105 specialisation only lost the markers, which would let a consumer write "
    "progressStatus of an MLTrainingProcess.",
)
def _process_monitor(src: Sources) -> None:
    pm = src.schema(AIML, "ProcessMonitor")
    props = _node(pm, ("properties",), f"{AIML}#ProcessMonitor")
    if pm.get("readOnly") or any(p.get("readOnly") for p in props.values()):
        raise BuildError(f"{AIML}#ProcessMonitor already has readOnly markers - review deviation D13")
    pm["readOnly"] = True
    for p in props.values():
        p["readOnly"] = True


@deviation(
    "D14", "defect-fix", f"{COMDEFS}#/components/schemas/DnListRo",
    "readOnly: true on the list (it was only on the items)",
    "the data type is documented as 'used for readOnly attribute'; without the marker on the list a write of an "
    "empty list to a read-only DN list attribute passes.",
)
def _dn_list_ro(src: Sources) -> None:
    dl = src.schema(COMDEFS, "DnListRo")
    if dl.get("readOnly"):
        raise BuildError(f"{COMDEFS}#DnListRo already readOnly - review deviation D14")
    dl["readOnly"] = True


def _attribute_object(single: dict[str, Any], where: str) -> tuple[dict[str, Any], Callable[[dict[str, Any]], None]]:
    """The schema of ``attributes`` of a leaf class and a setter that replaces it."""
    branches = _node(single, ("allOf",), where)
    holder = next((b for b in branches if "attributes" in b.get("properties", {})), None)
    if holder is None:
        raise BuildError(f"{where}: no attributes member")
    attrs = holder["properties"]["attributes"]
    if "allOf" in attrs:
        if len(attrs["allOf"]) != 1 or "$ref" in attrs["allOf"][0]:
            raise BuildError(f"{where}: attributes is not one inline object - review deviation D15")
        attrs = attrs["allOf"][0]
    if attrs.get("type") != "object" or "properties" not in attrs:
        raise BuildError(f"{where}: attributes is not an object with properties")

    def replace(new: dict[str, Any]) -> None:
        holder["properties"]["attributes"] = new

    return attrs, replace


@deviation(
    "D15", "restructure", ", ".join(f"{c}-Single" for c in WRITABLE_CLASSES),
    "the inline schema of 'attributes' is hoisted into a named component <Class>-Attr",
    "the merge-patch and create bodies (D17, D18) and the per-attribute checks of the service refer to it; the "
    "validated content is unchanged.",
)
def _hoist_attrs(src: Sources) -> None:
    for cls, file in WRITABLE_CLASSES.items():
        attrs, replace = _attribute_object(src.schema(file, f"{cls}-Single"), f"{file}#{cls}-Single")
        src.schemas(file)[f"{cls}-Attr"] = attrs
        replace({"$ref": f"{SCHEMAS_PREFIX}{cls}-Attr"})


@deviation(
    "D16", "tightening", ", ".join(f"{c}-Single, {c}-Attr" for c in WRITABLE_CLASSES),
    "additionalProperties: false on <Class>-Attr; a third allOf branch on <Class>-Single admits only id, "
    "objectClass (= the class name), objectInstance, attributes, VsDataContainer and the class's name-contained "
    "children",
    "the NRM defines no other attributes or children for these leaf classes; Sluice refuses unknown names with "
    "400 and badAttributes (TS 28.532 error body) instead of storing or dropping them silently, and the schema "
    "says so, so that schema-derived tests send only what the producer accepts. Vendor data goes in "
    "VsDataContainer.",
)
def _close(src: Sources) -> None:
    for cls, file in WRITABLE_CLASSES.items():
        schemas = src.schemas(file)
        schemas[f"{cls}-Attr"]["additionalProperties"] = False
        members: dict[str, Any] = {
            "id": {},
            "objectClass": {"type": "string", "enum": [cls]},
            "objectInstance": {},
            "attributes": {},
            "VsDataContainer": {},
        }
        members.update({child: {} for child in CLASS_CHILDREN.get(cls, ())})
        schemas[f"{cls}-Single"]["allOf"].append(
            {"type": "object", "properties": members, "additionalProperties": False}
        )


@deviation(
    "D17", "addition", ", ".join(f"{c}-MergePatch" for c in WRITABLE_CLASSES),
    "new schema per class: {id?, objectClass?, objectInstance?, attributes?: <Class>-Attr, VsDataContainer?}, "
    "no required member; used for application/merge-patch+json PATCH bodies",
    "TS28532_ProvMnS.yaml gives the generic Resource (id required) as merge-patch body, although an RFC 7396 patch "
    "of one resource names only what changes ({\"attributes\": {\"cancelRequest\": true}}). Null members (RFC 7396 "
    "removal) are not offered: every writable attribute of these classes has a value or default.",
)
def _merge_patch(src: Sources) -> None:
    for cls, file in WRITABLE_CLASSES.items():
        top_ref = f"{GENERIC}#/components/schemas/Top/properties/"
        src.schemas(file)[f"{cls}-MergePatch"] = {
            "type": "object",
            "properties": {
                "id": {"$ref": top_ref + "id"},
                "objectClass": {"type": "string", "enum": [cls]},
                "objectInstance": {"$ref": f"{COMDEFS}#/components/schemas/Dn"},
                "attributes": {"$ref": f"{SCHEMAS_PREFIX}{cls}-Attr"},
                "VsDataContainer": {"$ref": f"{GENERIC}#/components/schemas/VsDataContainer-Multiple"},
                **{child: {} for child in CLASS_CHILDREN.get(cls, ())},
            },
            "additionalProperties": False,
        }


@deviation(
    "D18", "addition", f"{AIML}#/components/schemas/MLTrainingRequest-Create",
    "new schema for POST bodies: like MLTrainingRequest-MergePatch but objectClass required and no id",
    "TS28532_ProvMnS.yaml gives the generic Resource (id required) as POST body, although with POST the MnS producer "
    "assigns the id (TS 32.158); the class of the new resource is then named by objectClass.",
)
def _create(src: Sources) -> None:
    body = copy.deepcopy(src.schemas(AIML)["MLTrainingRequest-MergePatch"])
    del body["properties"]["id"]
    body["required"] = ["objectClass"]
    src.schemas(AIML)["MLTrainingRequest-Create"] = body


@deviation(
    "D19", "addition", f"{PROV}#/components/schemas/PatchDocument, PatchErrorResponse",
    "named schemas for the inline JSON Patch body (array of PatchItem) and the inline PATCH error body; the latter "
    "as anyOf[ErrorResponseDefault, ErrorResponsePatch] instead of oneOf",
    "the PATCH error oneOf fails for every body carrying badOp, because ErrorResponseDefault admits extra members "
    "and so matches too (TS 28.532 PATCH 'default' response). Named so that the service can validate its own "
    "bodies against them.",
)
def _patch_doc(src: Sources) -> None:
    official = _node(src.doc(PROV), ("paths", "/{className}={id}", "patch"), PROV)
    errors = official["responses"]["default"]["content"]["application/json"]["schema"]
    if "oneOf" not in errors:
        raise BuildError(f"{PROV}: PATCH error schema changed - review deviation D19")
    schemas = src.schemas(PROV)
    json_patch = official["requestBody"]["content"]["application/json-patch+json"]["schema"]
    schemas["PatchDocument"] = copy.deepcopy(json_patch)
    schemas["PatchErrorResponse"] = {"anyOf": copy.deepcopy(errors["oneOf"])}


# Deviations of the paths part (applied in _paths below; listed here so that the header names them)
PATH_DEVIATIONS = [
    Deviation(
        "D20", "defect-fix", f"{PROV}#/paths/~1{{className}}={{id}}/put/callbacks",
        "the notification callbacks sit on PUT of NtfSubscriptionControl with the runtime expression "
        "{$request.body#/attributes/notificationRecipientAddress}; only the three notifications Sluice sends",
        "the official expression {request.body#/notificationRecipientAddress} lacks the '$' of an OpenAPI runtime "
        "expression and points at a member that NtfSubscriptionControl-Single keeps under 'attributes'; the "
        "callbacks were attached to every PUT, whose body is not a subscription.",
    ),
    Deviation(
        "D21", "defect-fix", f"{PROV}#/paths/~1{{className}}={{id}}/get/parameters/dataNodeSelector",
        "oneOf -> anyOf",
        "both branches (JexNodeSelectionBasic / JexNodeSelectionAdvanced) are plain strings: " + _OVERLAP + ".",
    ),
    Deviation(
        "D22", "restructure", "paths",
        "the generic /{className}={id} and /{URI-LDN-first-part} paths are spelled out per class with the "
        "operations Sluice serves; bodies and responses use the class schemas (<Class>-Single, -MergePatch, "
        "MLTrainingRequest-Create) instead of Resource; PATCH offers application/merge-patch+json and "
        "application/json-patch+json (not the 3gpp-* variants); the server URL drops {URI-LDN-first-part}",
        "a fuzzer or client can only exercise what a producer implements when the document names it; the class "
        "schemas carry the attribute definitions the generic Resource hides.",
    ),
    Deviation(
        "D23", "addition", "paths: 201 responses, links",
        "Location header on 201 responses; OpenAPI links from PUT/POST to GET, PATCH and DELETE of the same resource",
        "TS 32.158 returns the URI of a created resource in Location; links let stateful tests chain operations.",
    ),
]


# --------------------------------------------------------------------------------------------------------------
# Stubs for references into files that are not among the sources

STUB_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("TS29520_Nnwdaf_EventsSubscription.yaml", "NwdafEvent"): {"type": "string"},
    ("TS28111_FaultNrm.yaml", "AlarmNotificationTypes"): {"type": "string"},
    ("TS28532_PerfMnS.yaml", "PerfNotificationTypes"): {"type": "string"},
    ("TS28532_HeartbeatNtf.yaml", "HeartbeatNotificationTypes"): {"type": "string"},
    ("TS28532_FileDataReportingMnS.yaml", "FileNotificationTypes"): {"type": "string"},
}
"""Stubs that keep the known shape of an absent schema (NWDAF events and notification types are strings)."""


def _stub(file: str, name: str) -> tuple[dict[str, Any], str]:
    ref = f"{file}#/components/schemas/{name}"
    if (file, name) in STUB_SCHEMAS:
        body = dict(STUB_SCHEMAS[(file, name)])
        shape = f"any {body['type']}"
    elif name.endswith("-Multiple"):
        body = {"type": "array", "items": {"type": "object"}}
        shape = "any list of objects (name-contained children Sluice never creates)"
    else:
        body = {}
        shape = "any value"
    body["description"] = f"Stub: {ref} is not among the source files; accepts {shape}."
    body["x-sluice-stub"] = ref
    return body, shape


# --------------------------------------------------------------------------------------------------------------
# Walking and renaming


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


_REF = re.compile(r"^(?P<file>[^#]*)#/components/schemas/(?P<name>[^/]+)(?P<rest>(/.*)?)$")


def _parse_ref(ref: str, context: str) -> tuple[str, str, str]:
    m = _REF.match(ref)
    if m is None:
        raise BuildError(f"unsupported $ref {ref!r} in {context}")
    return m["file"] or context, m["name"], m["rest"]


def _walk(src: Sources, starts: list[tuple[str, Any]]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Schemas reached from ``starts`` ((file, node) pairs): present ones and missing ones, in sorted order."""
    present: set[tuple[str, str]] = set()
    missing: set[tuple[str, str]] = set()
    queue: list[tuple[str, Any]] = list(starts)
    while queue:
        file, node = queue.pop()
        for ref in _refs(node):
            target, name, _ = _parse_ref(ref, file)
            if not src.has(target):
                missing.add((target, name))
            elif (target, name) not in present:
                present.add((target, name))
                queue.append((target, src.schema(target, name)))
    return sorted(present), sorted(missing)


def _ts_number(file: str) -> str:
    return file.split("_", 1)[0]


def _names(keys: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Local names: the schema name, prefixed with the TS number (or the whole file stem) where names collide.
    TS 28.105 schemas keep their names."""
    by_name: dict[str, list[str]] = {}
    for file, name in keys:
        by_name.setdefault(name, []).append(file)
    out: dict[tuple[str, str], str] = {}
    for name, files in by_name.items():
        if len(files) == 1:
            out[(files[0], name)] = name
            continue
        numbers = [_ts_number(f) for f in files]
        for file in files:
            if file == AIML:
                out[(file, name)] = name
            elif numbers.count(_ts_number(file)) == 1:
                out[(file, name)] = f"{_ts_number(file)}_{name}"
            else:
                out[(file, name)] = f"{Path(file).stem}_{name}"
    if len(set(out.values())) != len(out):
        raise BuildError("schema names still collide after prefixing")
    return out


def _rewrite(node: Any, file: str, names: dict[tuple[str, str], str]) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                target, name, rest = _parse_ref(value, file)
                out[key] = f"{SCHEMAS_PREFIX}{names[(target, name)]}{rest}"
            else:
                out[key] = _rewrite(value, file, names)
        return out
    if isinstance(node, list):
        return [_rewrite(v, file, names) for v in node]
    return node


# --------------------------------------------------------------------------------------------------------------
# Paths (written in the context of TS28532_ProvMnS.yaml: '#/...' means that file)


def _schema_ref(file: str, name: str) -> dict[str, str]:
    return {"$ref": f"{file}#/components/schemas/{name}"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _error(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": _json(schema)}


def _paths(src: Sources) -> dict[str, Any]:
    generic = _node(src.doc(PROV), ("paths", "/{className}={id}"), PROV)
    post_official = _node(src.doc(PROV), ("paths", "/{URI-LDN-first-part}", "post"), PROV)
    desc = {m: generic[m]["responses"] for m in ("put", "get", "patch", "delete")}
    desc["post"] = post_official["responses"]

    get_params = copy.deepcopy(generic["get"]["parameters"])
    selector = next(p for p in get_params if p["name"] == "dataNodeSelector")
    _one_of_to_any_of(selector["schema"], f"{PROV} GET dataNodeSelector")  # D21

    err_default = _error("Error case.", _schema_ref(COMDEFS, "ErrorResponseDefault"))
    err_get = _error("Error case.", _schema_ref(COMDEFS, "ErrorResponseGet"))
    err_patch = _error("Error case.", _schema_ref(PROV, "PatchErrorResponse"))
    location = {
        "Location": {
            "description": "URI of the created resource (TS 32.158).",
            "required": True,
            "schema": {"type": "string"},
        }
    }

    def rdn(name: str, description: str) -> dict[str, Any]:
        return {
            "name": name,
            "in": "path",
            "required": True,
            "description": description,
            "schema": {"type": "string", "minLength": 1, "pattern": ID_PATTERN},
        }

    sn, tf = rdn("sn", "id of the SubNetwork"), rdn("tf", "id of the MLTrainingFunction")

    def single(cls: str) -> dict[str, Any]:
        return _schema_ref(WRITABLE_CLASSES[cls], f"{cls}-Single")

    def links(cls: str, params: dict[str, str], ops: tuple[str, ...]) -> dict[str, Any]:
        return {
            f"{op.capitalize()}{cls}": {"operationId": f"{op}{cls}", "parameters": dict(params)} for op in ops
        }

    def get_op(cls: str) -> dict[str, Any]:
        return {
            "operationId": f"get{cls}",
            "summary": f"Reads an {cls}" if cls[0] in "AEIOU" else f"Reads a {cls}",
            "description": generic["get"]["description"],
            "parameters": copy.deepcopy(get_params),
            "responses": {
                "200": {
                    "description": desc["get"]["200"]["description"],
                    "content": {
                        "application/json": {"schema": single(cls)},
                        "application/vnd.3gpp.object-tree-hierarchical+json": {"schema": single(cls)},
                        "application/vnd.3gpp.object-tree-flat+json": {
                            "schema": {"type": "array", "items": single(cls)}
                        },
                    },
                },
                "default": err_get,
            },
        }

    def put_op(cls: str, link_params: dict[str, str], link_ops: tuple[str, ...]) -> dict[str, Any]:
        return {
            "operationId": f"put{cls}",
            "summary": generic["put"]["summary"],
            "description": generic["put"]["description"],
            "requestBody": {"required": True, "content": _json(single(cls))},
            "responses": {
                "200": {"description": desc["put"]["200"]["description"], "content": _json(single(cls))},
                "201": {
                    "description": desc["put"]["201"]["description"],
                    "headers": location,
                    "content": _json(single(cls)),
                    "links": links(cls, link_params, link_ops),
                },
                "204": {"description": desc["put"]["204"]["description"]},
                "default": err_default,
            },
        }

    def patch_op(cls: str) -> dict[str, Any]:
        return {
            "operationId": f"patch{cls}",
            "summary": f"Modifies attributes of the {cls}",
            "description": generic["patch"]["description"],
            "requestBody": {
                "required": True,
                "description": "RFC 7396 merge patch of the resource, or RFC 6902 JSON Patch relative to it.",
                "content": {
                    "application/merge-patch+json": {"schema": _schema_ref(WRITABLE_CLASSES[cls], f"{cls}-MergePatch")},
                    "application/json-patch+json": {"schema": _schema_ref(PROV, "PatchDocument")},
                },
            },
            "responses": {
                "200": {"description": desc["patch"]["200"]["description"], "content": _json(single(cls))},
                "204": {"description": desc["patch"]["204"]["description"]},
                "default": err_patch,
            },
        }

    def delete_op(cls: str) -> dict[str, Any]:
        return {
            "operationId": f"delete{cls}",
            "summary": generic["delete"]["summary"],
            "description": generic["delete"]["description"],
            "responses": {"204": {"description": desc["delete"]["204"]["description"]}, "default": err_default},
        }

    def callback(schema: str) -> dict[str, Any]:
        return {
            "{$request.body#/attributes/notificationRecipientAddress}": {
                "post": {
                    "requestBody": {"required": True, "content": _json(_schema_ref(PROV, schema))},
                    "responses": {
                        "204": {"description": 'Success case ("204 No Content"). The notification is delivered.'},
                        "default": _error("Error case.", _schema_ref(COMDEFS, "ErrorResponse")),
                    },
                }
            }
        }

    req_params = {"sn": "$request.path.sn", "tf": "$request.path.tf", "id": "$request.path.id"}
    base = "/SubNetwork={sn}/MLTrainingFunction={tf}"
    put_sub = put_op("NtfSubscriptionControl", {"sn": "$request.path.sn", "s": "$request.path.s"}, ("get", "delete"))
    put_sub["callbacks"] = {
        "notifyMOICreation": callback("NotifyMoiCreation"),
        "notifyMOIDeletion": callback("NotifyMoiDeletion"),
        "notifyMOIAttributeValueChanges": callback("NotifyMoiAttributeValueChanges"),
    }
    post = {
        "operationId": "postMLTrainingRequest",
        "summary": post_official["summary"],
        "description": post_official["description"],
        "requestBody": {"required": True, "content": _json(_schema_ref(AIML, "MLTrainingRequest-Create"))},
        "responses": {
            "201": {
                "description": desc["post"]["201"]["description"],
                "headers": location,
                "content": _json(single("MLTrainingRequest")),
                "links": links(
                    "MLTrainingRequest",
                    {"sn": "$request.path.sn", "tf": "$request.path.tf", "id": "$response.body#/id"},
                    ("get", "patch", "delete"),
                ),
            },
            "default": err_default,
        },
    }
    return {
        base: {"parameters": [sn, tf], "post": post},
        f"{base}/MLTrainingRequest={{id}}": {
            "parameters": [sn, tf, rdn("id", "id of the MLTrainingRequest")],
            "put": put_op("MLTrainingRequest", req_params, ("get", "patch", "delete")),
            "get": get_op("MLTrainingRequest"),
            "patch": patch_op("MLTrainingRequest"),
            "delete": delete_op("MLTrainingRequest"),
        },
        f"{base}/MLTrainingProcess={{id}}": {
            "parameters": [sn, tf, rdn("id", "id of the MLTrainingProcess")],
            "get": get_op("MLTrainingProcess"),
            "patch": patch_op("MLTrainingProcess"),
        },
        f"{base}/MLTrainingReport={{id}}": {
            "parameters": [sn, tf, rdn("id", "id of the MLTrainingReport")],
            "get": get_op("MLTrainingReport"),
        },
        "/SubNetwork={sn}/MLModelRepository={r}/MLModel={m}": {
            "parameters": [sn, rdn("r", "id of the MLModelRepository"), rdn("m", "id of the MLModel")],
            "get": get_op("MLModel"),
        },
        "/SubNetwork={sn}/NtfSubscriptionControl={s}": {
            "parameters": [sn, rdn("s", "id of the NtfSubscriptionControl")],
            "put": put_sub,
            "get": get_op("NtfSubscriptionControl"),
            "delete": delete_op("NtfSubscriptionControl"),
        },
    }


# --------------------------------------------------------------------------------------------------------------
# Checks of the result


def _check(bundle: dict[str, Any]) -> None:
    """Self-contained, every $ref resolves, no oneOf left unreviewed, string enums hold strings only."""
    schemas = bundle["components"]["schemas"]

    def visit(node: Any, where: str) -> None:
        if isinstance(node, list):
            for i, value in enumerate(node):
                visit(value, f"{where}/{i}")
            return
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str):
            if not ref.startswith(SCHEMAS_PREFIX):
                raise BuildError(f"external $ref {ref!r} left at {where}")
            if ref[len(SCHEMAS_PREFIX) :].split("/", 1)[0] not in schemas:
                raise BuildError(f"dangling $ref {ref!r} at {where}")
        if "oneOf" in node:
            raise BuildError(f"oneOf left at {where}: review whether its branches exclude each other")
        enum = node.get("enum")
        if node.get("type") == "string" and isinstance(enum, list) and not all(isinstance(v, str) for v in enum):
            raise BuildError(f"non-string value in the string enum at {where} (a YAML 1.1 boolean?)")
        for key, value in node.items():
            visit(value, f"{where}/{key}")

    visit(bundle, "")


# --------------------------------------------------------------------------------------------------------------


def build(source: Path) -> dict[str, Any]:
    """The bundle built from the official files in ``source``."""
    src = Sources(source)
    for file in {f for f, _ in ROOTS} | set(WRITABLE_CLASSES.values()):
        if not src.has(file):
            raise BuildError(f"{source / file} is missing")
    applied = []
    for dev, patch in DEVIATIONS:
        patch(src)
        applied.append(dev)
    paths = _paths(src)
    applied.extend(PATH_DEVIATIONS)

    starts: list[tuple[str, Any]] = [(f, {"$ref": f"#/components/schemas/{n}"}) for f, n in ROOTS]
    starts += [(f, {"$ref": f"#/components/schemas/{c}-MergePatch"}) for c, f in WRITABLE_CLASSES.items()]
    starts.append((PROV, paths))
    present, missing = _walk(src, starts)
    names = _names(present + missing)

    schemas: dict[str, Any] = {}
    for file, name in present:
        schemas[names[(file, name)]] = _rewrite(src.schema(file, name), file, names)
    stubs = []
    for file, name in missing:
        body, shape = _stub(file, name)
        schemas[names[(file, name)]] = body
        stubs.append(
            {"ref": f"{file}#/components/schemas/{name}", "schema": names[(file, name)], "accepts": shape,
             "reason": f"{file} is not among the source files"}
        )

    versions = {f: str(src.doc(f)["info"]["version"]) for f in sorted(src.docs)}
    info = {
        "title": "Sluice ProvMnS - ML training management (TS 28.105 over TS 28.532)",
        "version": BUNDLE_VERSION,
        "description": _description(versions, applied, stubs),
        "x-sluice-deviations": [d.as_dict() for d in applied],
        "x-sluice-stubs": stubs,
        "x-sluice-source-sha256": dict(sorted(src.sha256.items())),
        "x-sluice-source-versions": versions,
        "x-sluice-generator": "scripts/build_openapi_bundle.py",
    }
    prov = src.doc(PROV)
    root = prov["servers"][0]["variables"]
    bundle = {
        "openapi": "3.0.3",
        "info": info,
        "externalDocs": prov["externalDocs"],
        "servers": [
            {
                "url": "{MnSRoot}/ProvMnS/{MnSVersion}",
                "variables": {
                    "MnSRoot": root["MnSRoot"],
                    "MnSVersion": {
                        "description": root["MnSVersion"]["description"] + " (TS 28.532 19.2.0 -> v1920)",
                        "default": "v1920",
                    },
                },
            }
        ],
        "paths": _rewrite(paths, PROV, names),
        "components": {"schemas": schemas},
    }
    _check(bundle)
    return bundle


def _description(versions: dict[str, str], applied: list[Deviation], stubs: list[dict[str, str]]) -> str:
    lines = [
        "Pruned, self-contained bundle of the 3GPP OpenAPI definitions that Sluice's provisioning management "
        "service (ML training management of TS 28.105 over the ProvMnS of TS 28.532) validates requests and "
        "responses against. Generated by scripts/build_openapi_bundle.py from the official files:",
        "",
        *(f"- {file} {version}" for file, version in versions.items()),
        "",
        "Deviations from the official files (also in x-sluice-deviations):",
        "",
        *(f"- {d.id} [{d.kind}] {d.target}: {d.change}. Reason: {d.reason}" for d in applied),
        "",
        "Stubs for references into files that are not present (also in x-sluice-stubs):",
        "",
        *(f"- {s['ref']} -> {s['schema']}: accepts {s['accepts']}" for s in stubs),
    ]
    return "\n".join(lines)


def render(bundle: dict[str, Any]) -> str:
    """The bundle as written to disk: sorted keys, two-space indent, trailing newline."""
    return json.dumps(bundle, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="directory of the official YAML files")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="bundle file to write")
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if --output differs")
    args = parser.parse_args(argv)
    try:
        text = render(build(args.source))
    except (BuildError, OSError, yaml.YAMLError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.is_file() else ""
        if current != text:
            print(f"{args.output} is out of date; run scripts/build_openapi_bundle.py", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    count = len(json.loads(text)["components"]["schemas"])
    print(f"wrote {args.output} ({count} schemas, {len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
