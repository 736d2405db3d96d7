"""Property-based fuzzing of the ProvMnS interface: schemathesis against the OpenAPI bundle a real ``sluice serve``
serves at ``{base}/openapi.json`` (its own port and SQLite file).

All four phases run (examples, coverage — boundary and schema-violating values of every parameter and body —,
fuzzing, and stateful sequences along the bundle's PUT→GET/PATCH/DELETE links) within a fixed time budget and
with a fixed seed. The path ids of the containers are pinned to the producer's (``SubNetwork=SN1``,
``MLTrainingFunction=TF1``, ``MLModelRepository=MR1``) so that cases reach the handlers rather than the 404 of
an unknown SubNetwork; the ids of requests, processes and subscriptions are generated.

Checks: no 5xx (``not_a_server_error``); every response conforms — its status code is documented, its media
type and headers are the documented ones and its body validates against the documented schema (the 3GPP error
bodies included); schema-invalid requests are refused with a 4xx (``negative_data_rejection``); a deleted
resource is gone and a created one is there (``use_after_free``, ``ensure_resource_availability``).

Not checked, by design: ``positive_data_acceptance`` (the bundle admits bodies that Sluice's own rules refuse,
such as a job that cannot be built or a recipient address that is not http(s)) and ``unsupported_method`` /
``allow_header_conformance`` (the bundle lists Sluice's principal operations, while the service also answers
the generic ProvMnS operations of TS 28.532 on every MOI — GET of the SubNetwork or MLTrainingFunction, PUT of
an MLTrainingProcess, PATCH of a subscription).

Run alone with ``pytest -m fuzz``; ``SLUICE_FUZZ_EXAMPLES`` sets the examples per operation and phase (default
10: about 4,000 cases, half a minute on an idle machine; a count rather than a time, so a loaded machine runs
the same cases, only slower).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_service_support import BASE, running_server

pytestmark = [pytest.mark.fuzz, pytest.mark.timeout(600)]

CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance",
          "response_headers_conformance", "response_schema_conformance", "negative_data_rejection",
          "use_after_free", "ensure_resource_availability")
SEED = 28105
FUZZ_EXAMPLES = int(os.environ.get("SLUICE_FUZZ_EXAMPLES", "10"))  # per operation and phase: a count, not a time
CONFIG = '[parameters]\n"path.sn" = "SN1"\n"path.tf" = "TF1"\n"path.r" = "MR1"\n'


def _failures(report: dict) -> str:
    lines = []
    for f in report.get("failures", [])[:10]:
        lines.append(json.dumps(f)[:1500])
    for e in report.get("errors", [])[:10]:
        lines.append(json.dumps(e)[:1500])
    return "\n".join(lines)


def test_fuzzing_finds_no_server_error_and_no_nonconformant_response(tmp_path):
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG, encoding="utf-8")
    report_path = tmp_path / "schemathesis.json"
    extra = ("--set", "max_concurrent=1", "--set", "policy.default_iterations=2")
    with running_server(tmp_path, name="fuzz", extra=extra) as srv:
        bundle = srv.http.get(f"{srv.root}{BASE}/openapi.json").json()
        operations = sum(1 for item in bundle["paths"].values() for m in item if m != "parameters")
        cmd = [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
               f"{srv.root}{BASE}/openapi.json", "--checks", ",".join(CHECKS), "--seed", str(SEED),
               "--max-examples", str(FUZZ_EXAMPLES), "--generation-database", "none", "--workers", "1",
               "--request-timeout", "30", "--no-color", "--report", "json", "--report-json-path", str(report_path)]
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=540)
        assert report_path.is_file(), f"schemathesis wrote no report (exit {run.returncode}):\n{run.stdout[-4000:]}"
        report = json.loads(report_path.read_text(encoding="utf-8"))
        cases = report["test_cases"]
        print(f"\nschemathesis {report['schemathesis_version']}, seed {report['seed']}: "
              f"{report['operations']['tested']}/{report['operations']['total']} operations, "
              f"{cases['generated']} cases in {report['running_time']:.1f} s, "
              f"{cases['unique_failures']} unique failures, {len(report['errors'])} errors")
        assert run.returncode == 0 and not report["failures"] and not report["errors"], (
            f"{_failures(report)}\n{run.stdout[-6000:]}")
        assert report["operations"]["tested"] == report["operations"]["total"] == operations
        phases = {name: p["status"] for name, p in report["phases"].items()}
        assert all(phases[name] == "success" for name in ("coverage", "fuzzing", "stateful")), phases
        assert cases["generated"] >= 200
        # the server survived all of it: it answers, and it never hit an unhandled exception
        assert srv.http.get(srv.uri("SubNetwork=SN1")).status_code == 200
        assert "Exception in ASGI application" not in srv.log.read_text(encoding="utf-8")
