"""The ProvMnS OpenAPI bundle: rebuilt from the official 3GPP files without a diff, self-contained, a valid
OpenAPI document, every deviation of its header really applied, and the request/response checks built on it."""

from __future__ import annotations

import copy
import difflib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.service.schema import SchemaViolation, check_response, check_write, load_bundle

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT.parent / "shared" / "reference" / "3gpp"
SCRIPT = ROOT / "scripts" / "build_openapi_bundle.py"
COMMITTED = ROOT / "src" / "sluice" / "service" / "openapi" / "bundle.json"
SCHEMAS = "#/components/schemas/"

R1 = {
    "id": "R1",
    "attributes": {
        "aIMLInferenceName": "COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS",
        "performanceRequirements": [{"performanceMetric": "RMSE", "performanceScore": 0.05}],
    },
}
"""Conformance check #1: the body of the first PUT of an MLTrainingRequest."""


def _violation(fn, *args, **kwargs) -> SchemaViolation:
    with pytest.raises(SchemaViolation) as info:
        fn(*args, **kwargs)
    assert str(info.value) == info.value.message
    return info.value


def _valid(schema: str, value) -> bool:
    try:
        check_response(schema, value)
    except SchemaViolation:
        return False
    return True


@pytest.fixture(scope="module")
def bundle() -> dict:
    return load_bundle()


# ---------------------------------------------------------------------------------------------------------------
# The bundle as a document


def test_bundle_regenerates_without_diff(tmp_path):
    if not SOURCE.is_dir():
        pytest.skip(f"official 3GPP files not found at {SOURCE}: the bundle cannot be rebuilt here")
    out = tmp_path / "bundle.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--source", str(SOURCE), "--output", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    fresh, committed = out.read_text(encoding="utf-8"), COMMITTED.read_text(encoding="utf-8")
    if fresh != committed:
        diff = "".join(list(difflib.unified_diff(
            committed.splitlines(keepends=True), fresh.splitlines(keepends=True), "committed", "rebuilt"
        ))[:60])
        pytest.fail(f"the committed bundle differs from a rebuild; run scripts/build_openapi_bundle.py\n{diff}")
    check = subprocess.run(
        [sys.executable, str(SCRIPT), "--source", str(SOURCE), "--output", str(COMMITTED), "--check"],
        capture_output=True, text=True, timeout=120,
    )
    assert check.returncode == 0, check.stderr


def test_build_fails_on_a_changed_source(tmp_path):
    """A source that no longer has a defect the bundle works around must stop the build, not pass silently."""
    if not SOURCE.is_dir():
        pytest.skip(f"official 3GPP files not found at {SOURCE}")
    src = tmp_path / "3gpp"
    src.mkdir()
    for f in SOURCE.glob("*.yaml"):
        (src / f.name).write_bytes(f.read_bytes())
    aiml = src / "TS28105_AiMlNrm.yaml"
    text = aiml.read_text(encoding="utf-8")
    aiml.write_text(text.replace("    AIMLInferenceName:\n      oneOf:", "    AIMLInferenceName:\n      anyOf:", 1))
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--source", str(src), "--output", str(tmp_path / "b.json")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert "AIMLInferenceName" in done.stderr and not (tmp_path / "b.json").exists()


def test_bundle_is_deterministic_json(bundle):
    text = COMMITTED.read_text(encoding="utf-8")
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    assert load_bundle() is bundle


def _walk(node, where=""):
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from _walk(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{where}/{i}")


def test_bundle_is_self_contained(bundle):
    schemas = bundle["components"]["schemas"]
    refs = [(w, n["$ref"]) for w, n in _walk(bundle) if isinstance(n.get("$ref"), str)]
    assert len(refs) > 100
    for where, ref in refs:
        assert ref.startswith(SCHEMAS), f"external $ref {ref} at {where}"
        assert ref[len(SCHEMAS):].split("/")[0] in schemas, f"dangling $ref {ref} at {where}"
    assert not [w for w, n in _walk(bundle) if "oneOf" in n]
    # every schema is used: reachable from the paths or one of the schemas the service names
    assert 80 <= len(schemas) <= 150


def test_bundle_is_valid_openapi(bundle):
    try:
        from openapi_spec_validator import validate
    except ImportError:  # structural checks only
        assert bundle["openapi"].startswith("3.0.")
        for path, item in bundle["paths"].items():
            for method in ("get", "put", "post", "patch", "delete"):
                if method in item:
                    assert item[method]["responses"], (path, method)
        return
    validate(copy.deepcopy(bundle))


def test_paths_and_servers(bundle):
    ops = {(p, m) for p, item in bundle["paths"].items() for m in item if m != "parameters"}
    tf = "/SubNetwork={sn}/MLTrainingFunction={tf}"
    assert ops == {
        (tf, "post"),
        *((f"{tf}/MLTrainingRequest={{id}}", m) for m in ("put", "get", "patch", "delete")),
        (f"{tf}/MLTrainingProcess={{id}}", "get"),
        (f"{tf}/MLTrainingProcess={{id}}", "patch"),
        (f"{tf}/MLTrainingReport={{id}}", "get"),
        ("/SubNetwork={sn}/MLModelRepository={r}/MLModel={m}", "get"),
        *(("/SubNetwork={sn}/NtfSubscriptionControl={s}", m) for m in ("put", "get", "delete")),
    }
    patch = bundle["paths"][f"{tf}/MLTrainingRequest={{id}}"]["patch"]
    assert set(patch["requestBody"]["content"]) == {"application/merge-patch+json", "application/json-patch+json"}
    assert patch["responses"]["default"]["content"]["application/json"]["schema"] == {
        "$ref": SCHEMAS + "PatchErrorResponse"
    }
    put = bundle["paths"][f"{tf}/MLTrainingRequest={{id}}"]["put"]
    assert set(put["responses"]) == {"200", "201", "204", "default"}
    get = bundle["paths"][f"{tf}/MLTrainingProcess={{id}}"]["get"]
    assert get["responses"]["default"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorResponseGet")
    assert {p["name"] for p in get["parameters"]} >= {"attributes", "fields", "scope", "filter"}
    server = bundle["servers"][0]
    assert server["url"] == "{MnSRoot}/ProvMnS/{MnSVersion}"
    assert set(server["variables"]) == {"MnSRoot", "MnSVersion"}


def test_header_lists_deviations_stubs_and_sources(bundle):
    info = bundle["info"]
    devs = info["x-sluice-deviations"]
    assert len({d["id"] for d in devs}) == len(devs) >= 20
    for d in devs:
        assert d["kind"] in {"defect-fix", "tightening", "addition", "restructure"}
        assert d["reason"] and d["change"] and f"{d['id']} [{d['kind']}]" in info["description"]
    stubs = info["x-sluice-stubs"]
    assert {s["ref"].split("#")[0] for s in stubs} >= {"TS29520_Nnwdaf_EventsSubscription.yaml",
                                                       "TS28111_FaultNrm.yaml"}
    for s in stubs:
        assert bundle["components"]["schemas"][s["schema"]]["x-sluice-stub"] == s["ref"]
        assert s["ref"] in info["description"]
        assert not (SOURCE / s["ref"].split("#")[0]).exists()
    assert set(info["x-sluice-source-sha256"]) >= {"TS28105_AiMlNrm.yaml", "TS28532_ProvMnS.yaml"}


# ---------------------------------------------------------------------------------------------------------------
# Each deviation is applied (one check per id; a new deviation without a check fails test_every_deviation_checked)


def _schema(bundle, name):
    return bundle["components"]["schemas"][name]


def _d01(b):
    for value in ("COVERAGE_ANALYTICS_COVERAGE_PROBLEM_ANALYSIS", "NG_RAN_NETWORK_ENERGY_SAVING", "MY_VENDOR_TYPE"):
        assert _valid("AIMLInferenceName", value)
    assert not _valid("AIMLInferenceName", 5)
    assert "anyOf" in _schema(b, "AIMLInferenceName")


def _d02(b):
    check_write("MLTrainingRequest", {"id": "R", "attributes": {"trainingRequestSource": "SubNetwork=SN1"}})


def _d03(b):
    assert _valid("ThresholdInfo", {"thresholdValue": 5}) and _valid("ThresholdInfo", {"thresholdValue": 5.5})


def _d04(b):
    assert _valid("ThresholdInfo", {"hysteresis": 1}) and _valid("ThresholdInfo", {"hysteresis": 0.5})
    assert not _valid("ThresholdInfo", {"hysteresis": "x"})


def _d05(b):
    assert _valid("EnvironmentScope", {"managedEntitiesScope": ["SubNetwork=SN1"]})


def _d06(b):
    circle = {"geoCircle": {"referenceLocation": {"latitude": 1.0, "longitude": 2.0}, "distanceRadius": 10}}
    assert _valid("GeoArea", circle)
    assert not _valid("GeoArea", "somewhere")


def _d07(b):
    assert _valid("TS28623_Scope", {"scopeType": "BASE_SUBTREE", "scopeLevel": 2})
    assert not _valid("TS28623_Scope", {"scopeType": "EVERYTHING"})


def _d08(b):
    assert _valid("TS28623_Scope", {"dataNodeSelector": "/SubNetwork"})


def _d09(b):
    assert _valid("NotificationType", "notifyMOICreation")


def _d10(b):
    assert _valid("Resource", {"id": "x", "attributes": {}})
    assert not _valid("Resource", {"attributes": {}})


def _d11(b):
    for bad in (None, "", "a/b", "a=b"):
        assert not _valid("Top", {"id": bad}), bad
    assert _valid("Top", {"id": "R-1_x"})


def _d12(b):
    assert _schema(b, "MLTestingReport-Multiple")["items"] == {"$ref": SCHEMAS + "MLTestingReport-Single"}


def _d13(b):
    v = _violation(check_write, "MLTrainingProcess", {"attributes": {"progressStatus": {"status": "FINISHED"}}},
                   partial=True)
    assert v.bad_attributes == ["progressStatus"]


def _d14(b):
    v = _violation(check_write, "MLTrainingProcess", {"attributes": {"trainingRequestRef": []}}, partial=True)
    assert v.bad_attributes == ["trainingRequestRef"]


def _d15(b):
    for cls in ("MLTrainingRequest", "MLTrainingProcess", "MLTrainingReport", "MLModel", "NtfSubscriptionControl"):
        single = json.dumps(_schema(b, f"{cls}-Single"))
        assert f'"{SCHEMAS}{cls}-Attr"' in single


def _d16(b):
    assert _violation(check_write, "MLTrainingRequest", {"id": "R", "attributes": {"colour": 1}}).bad_attributes == [
        "colour"
    ]
    assert _violation(check_write, "MLTrainingRequest", {"id": "R", "MLModel": []}).bad_attributes == ["MLModel"]
    assert _violation(
        check_write, "MLTrainingRequest", {"id": "R", "objectClass": "MLModel"}
    ).bad_attributes == ["objectClass"]
    check_write("NtfSubscriptionControl", {"id": "S", "HeartbeatControl": {"id": "H"}})


def _d17(b):
    check_write("MLTrainingRequest", {"attributes": {"suspendRequest": True}}, partial=True)
    assert "required" not in _schema(b, "MLTrainingRequest-MergePatch")


def _d18(b):
    create = {"objectClass": "MLTrainingRequest", "attributes": {"cancelRequest": False}}
    assert _valid("MLTrainingRequest-Create", create)
    # priority belongs to MLTrainingProcess
    assert not _valid("MLTrainingRequest-Create", {**create, "attributes": {"priority": 1}})
    assert not _valid("MLTrainingRequest-Create", {"attributes": {}})


def _d19(b):
    assert _valid("PatchErrorResponse", {"type": "VALIDATION_ERROR", "badOp": "0", "status": "400"})
    assert _valid("PatchErrorResponse", {"type": "VALIDATION_ERROR", "badAttributes": ["trainingReportRef"]})
    assert not _valid("PatchErrorResponse", {"status": "415"})
    assert _valid("PatchDocument", [{"op": "replace", "path": "/attributes/suspendRequest", "value": True}])


def _d20(b):
    put = b["paths"]["/SubNetwork={sn}/NtfSubscriptionControl={s}"]["put"]
    assert set(put["callbacks"]) == {"notifyMOICreation", "notifyMOIDeletion", "notifyMOIAttributeValueChanges"}
    for cb in put["callbacks"].values():
        assert list(cb) == ["{$request.body#/attributes/notificationRecipientAddress}"]
    assert "callbacks" not in b["paths"]["/SubNetwork={sn}/MLTrainingFunction={tf}/MLTrainingRequest={id}"]["put"]


def _d21(b):
    get = b["paths"]["/SubNetwork={sn}/MLTrainingFunction={tf}/MLTrainingRequest={id}"]["get"]
    selector = next(p for p in get["parameters"] if p["name"] == "dataNodeSelector")
    assert "anyOf" in selector["schema"]


def _d22(b):
    assert not [p for p in b["paths"] if "{className}" in p or "URI-LDN" in p]
    post = b["paths"]["/SubNetwork={sn}/MLTrainingFunction={tf}"]["post"]
    body = post["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": SCHEMAS + "MLTrainingRequest-Create"}


def _d23(b):
    put = b["paths"]["/SubNetwork={sn}/MLTrainingFunction={tf}/MLTrainingRequest={id}"]["put"]
    assert put["responses"]["201"]["headers"]["Location"]["required"] is True
    assert put["responses"]["201"]["links"]["GetMLTrainingRequest"]["operationId"] == "getMLTrainingRequest"


DEVIATION_CHECKS = {f"D{i:02d}": fn for i, fn in enumerate(
    [_d01, _d02, _d03, _d04, _d05, _d06, _d07, _d08, _d09, _d10, _d11, _d12, _d13, _d14, _d15, _d16, _d17, _d18,
     _d19, _d20, _d21, _d22, _d23], start=1)}


def test_every_deviation_checked(bundle):
    assert {d["id"] for d in bundle["info"]["x-sluice-deviations"]} == set(DEVIATION_CHECKS)


@pytest.mark.parametrize("dev_id", sorted(DEVIATION_CHECKS))
def test_deviation_applied(bundle, dev_id):
    DEVIATION_CHECKS[dev_id](bundle)


# ---------------------------------------------------------------------------------------------------------------
# check_write / check_response


def test_conformance_bodies_accepted():
    check_write("MLTrainingRequest", R1)
    second = copy.deepcopy(R1)  # conformance check #2: same PUT with changed requirements
    second["attributes"]["performanceRequirements"] = [{"performanceMetric": "ACCURACY", "performanceScore": 0.9}]
    check_write("MLTrainingRequest", second)
    check_write("MLTrainingRequest", {**R1, "VsDataContainer": [{"id": "sluice-termination",
                                                                  "attributes": {"vsData": {"maxRounds": 5}}}]})
    check_write("NtfSubscriptionControl", {"id": "S1", "attributes": {
        "notificationRecipientAddress": "http://127.0.0.1:9999/notify",
        "notificationTypes": ["notifyMOICreation", "notifyMOIAttributeValueChanges", "notifyMOIDeletion"],
        "scope": {"scopeType": "BASE_SUBTREE", "scopeLevel": 3},
        "notificationFilter": "$.attributes.requestStatus",
    }})


@pytest.mark.parametrize(("body", "bad"), [
    ({"id": "R3", "attributes": {"requestStatus": "FINISHED"}}, ["requestStatus"]),
    ({"id": "R3", "attributes": {}, "VsDataContainer": [{"id": "v", "attributes": {"vsDataType": "x"}}]},
     ["vsDataType"]),
    ({"id": "R3", "attributes": {}, "VsDataContainer": [{"id": "v", "attributes": {"vsDataFormatVersion": "1"}}]},
     ["vsDataFormatVersion"]),
    ({"id": "R3", "attributes": {"performanceRequirements": [{"performanceScore": "high"}]}},
     ["performanceRequirements"]),
    ({"id": None, "attributes": {}}, ["id"]),
    ({"attributes": {}}, ["id"]),
    ({"id": "R3", "attributes": {"aIMLInferenceName": 7, "cancelRequest": "yes"}},
     ["aIMLInferenceName", "cancelRequest"]),
])
def test_invalid_writes_refused(body, bad):
    assert _violation(check_write, "MLTrainingRequest", body).bad_attributes == bad


@pytest.mark.parametrize(("cls", "patch"), [
    ("MLTrainingRequest", {"attributes": {"cancelRequest": True}}),
    ("MLTrainingRequest", {"attributes": {"suspendRequest": False}}),
    ("MLTrainingProcess", {"attributes": {"suspendProcess": True}}),
    ("MLTrainingProcess", {"attributes": {"suspendProcess": False}}),
    ("MLTrainingProcess", {"attributes": {"priority": 7}}),
    ("MLTrainingProcess", {"attributes": {"cancelProcess": True, "terminationConditions": "accuracy >= 0.9"}}),
    ("MLTrainingProcess", {"id": "P1", "attributes": {}}),
])
def test_merge_patches_accepted(cls, patch):
    check_write(cls, patch, partial=True)


@pytest.mark.parametrize(("cls", "patch", "bad"), [
    ("MLTrainingProcess", {"attributes": {"trainingReportRef": "SubNetwork=SN1/MLTrainingFunction=TF1"}},
     ["trainingReportRef"]),
    ("MLTrainingRequest", {"attributes": {"trainingReportRef": "SubNetwork=SN1"}}, ["trainingReportRef"]),
    ("MLTrainingRequest", {"attributes": {"requestStatus": "CANCELLED"}}, ["requestStatus"]),
    ("MLTrainingProcess", {"attributes": {"priority": "high"}}, ["priority"]),
    ("MLTrainingProcess", {"attributes": {"cancelProcess": None}}, ["cancelProcess"]),
    ("MLModel", {"attributes": {"mLModelVersion": "2"}}, ["mLModelVersion"]),
    ("MLTrainingReport", {"attributes": {"areNewTrainingDataUsed": True}}, ["areNewTrainingDataUsed"]),
])
def test_merge_patches_refused(cls, patch, bad):
    assert _violation(check_write, cls, patch, partial=True).bad_attributes == bad


def test_check_write_arguments():
    with pytest.raises(ValueError, match="unknown class"):
        check_write("MLTestingRequest", {})
    assert _violation(check_write, "MLTrainingRequest", [1, 2]).bad_attributes == []


def test_error_bodies():
    check_response("ErrorResponseDefault", {"type": "VALIDATION_ERROR", "status": "400", "title": "bad",
                                            "badAttributes": ["requestStatus"]})
    check_response("ErrorResponseGet", {"type": "IE_NOT_FOUND", "status": "404", "badQueryParams": []})
    check_response("ErrorResponsePatch", {"type": "VALIDATION_ERROR", "badOp": "0"})
    check_response("PatchErrorResponse", {"type": "APPLICATION_LAYER_ERROR", "status": "415"})
    check_response("ErrorResponse", {"error": {"errorInfo": "receiver busy"}})
    for name in ("ErrorResponseDefault", "ErrorResponseGet", "PatchErrorResponse"):
        assert _violation(check_response, name, {"status": "400", "title": "no type"}).bad_attributes == ["$.type"]
    assert _violation(check_response, "ErrorResponseDefault", {"type": "X", "status": 400}).bad_attributes == [
        "$.status"
    ]


def test_responses_and_notifications():
    check_response("MLTrainingRequest-Single", {**R1, "objectClass": "MLTrainingRequest",
                                                "attributes": {**R1["attributes"], "requestStatus": "NOT_STARTED"}})
    check_response("MLTrainingProcess-Single", {"id": "P1", "attributes": {
        "priority": 0, "progressStatus": {"status": "RUNNING", "progressPercentage": 40},
        "trainingRequestRef": ["SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingRequest=R1"],
        "trainingReportRef": "SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingReport=T1"}})
    bad = _violation(check_response, "MLTrainingProcess-Single",
                     {"id": "P1", "attributes": {"progressStatus": {"progressPercentage": 140}}})
    assert bad.bad_attributes == ["$.attributes.progressStatus.progressPercentage"]
    assert _violation(check_response, "MLTrainingRequest-Single",
                      {"id": "R1", "attributes": {"requestStatus": "DONE"}}).bad_attributes == [
        "$.attributes.requestStatus"]
    header = {"href": "http://127.0.0.1/ProvMnS/v1920/SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingRequest=R1",
              "notificationId": 1, "eventTime": "2026-11-23T14:00:00.5+01:00", "systemDN": "SubNetwork=SN1"}
    check_response("NotifyMoiCreation", {**header, "notificationType": "notifyMOICreation",
                                         "attributeList": {"requestStatus": "NOT_STARTED"}})
    check_response("NotifyMoiAttributeValueChanges", {**header, "notificationType": "notifyMOIAttributeValueChanges",
                                                      "attributeListValueChanges": [{"requestStatus": "CANCELLED"}]})
    check_response("NotifyMoiDeletion", {**header, "notificationType": "notifyMOIDeletion"})
    assert _violation(check_response, "NotifyMoiAttributeValueChanges",
                      {**header, "notificationType": "notifyMOIAttributeValueChanges"}
                      ).bad_attributes == ["$.attributeListValueChanges"]
    assert _violation(check_response, "NotifyMoiDeletion", {**header, "notificationType": "notifyMOIDeletion",
                                                            "eventTime": "23/11/2026"}).bad_attributes == [
        "$.eventTime"]
    assert "$.notificationId" in _violation(check_response, "NotifyMoiCreation", {
        k: v for k, v in header.items() if k != "notificationId"} | {"notificationType": "notifyMOICreation"}
    ).bad_attributes
    with pytest.raises(KeyError):
        check_response("NoSuchSchema", {})


def test_write_only_members_not_returned():
    check_write("NtfSubscriptionControl", {"id": "S", "HeartbeatControl": {"id": "H", "attributes": {
        "triggerHeartbeatNtf": True}}})
    bad = _violation(check_response, "NtfSubscriptionControl-Single",
                     {"id": "S", "HeartbeatControl": {"id": "H", "attributes": {"triggerHeartbeatNtf": True}}})
    assert bad.bad_attributes == ["$.HeartbeatControl.attributes.triggerHeartbeatNtf"]


def test_schema_module_needs_no_web_framework():
    code = ("import sys, sluice.service.schema as s; s.check_write('MLTrainingRequest', {'id': 'R'}); "
            "assert not {'fastapi', 'starlette', 'yaml', 'sqlalchemy'} & set(sys.modules), sorted(sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# ---------------------------------------------------------------------------------------------------------------
# Fuzz: whatever a consumer sends, check_write answers with a pass or a SchemaViolation, never a crash

_ATTRS = ["aIMLInferenceName", "requestStatus", "performanceRequirements", "cancelRequest", "suspendRequest",
          "priority", "progressStatus", "trainingReportRef", "trainingRequestRef", "expectedInferenceScope",
          "fLRequirement", "rLRequirement", "notificationTypes", "scope", "mLModelId", "fLReportPerClient",
          "candidateTrainingDataSource", "trainingDataQualityScore", "clusteringInfo", "vsDataType"]
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6) | st.sampled_from(_ATTRS),
                                                                inner, max_size=3),
    max_leaves=12,
)
_classes = st.sampled_from(["MLTrainingRequest", "MLTrainingProcess", "NtfSubscriptionControl", "MLTrainingReport",
                            "MLModel"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cls=_classes, attrs=st.dictionaries(st.sampled_from(_ATTRS) | st.text(max_size=10), _json_values,
                                           max_size=5),
       ident=st.none() | st.text(max_size=5), extra=st.dictionaries(st.text(max_size=6), _json_values, max_size=2),
       partial=st.booleans())
def test_fuzz_check_write_never_crashes(cls, attrs, ident, extra, partial):
    body = {**extra, "attributes": attrs}
    if ident is not None:
        body["id"] = ident
    try:
        check_write(cls, body, partial=partial)
    except SchemaViolation as exc:
        assert isinstance(exc.bad_attributes, list) and all(isinstance(a, str) for a in exc.bad_attributes)
        assert exc.message


@settings(max_examples=60, deadline=None)
@given(body=_json_values)
def test_fuzz_check_write_any_json(body):
    try:
        check_write("MLTrainingRequest", body)
    except SchemaViolation:
        pass
