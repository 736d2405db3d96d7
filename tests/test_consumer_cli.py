"""``sluice consumer`` and :class:`sluice.service.client.ProvMnSClient` against real services on loopback
ports: create from a TOML file, watch, show, list, cancel, report, model download, and one request sent to
two producers with their reports gathered into one table (R4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_service_support import running_server

JOB = """\
engine = "local"
seed = 0
[train]
iterations = 3
batch_size = 64
[model]
hidden = [16]
id = "digits-mlp"
[termination]
iterations = 3
[request]
aIMLInferenceName = "MDA_ASSISTED_FAULT_MANAGEMENT_FAILURE_PREDICTION"
"""


@pytest.fixture(scope="module")
def two(tmp_path_factory, service):
    tmp = Path(tmp_path_factory.mktemp("consumer"))
    with running_server(tmp, name="b") as b:
        yield tmp, service, b


def consumer(url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "sluice", "consumer", "--producer", url, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_create_watch_show_report_and_model(two):
    tmp, a, _ = two
    job = tmp / "job.toml"
    job.write_text(JOB, encoding="utf-8")
    done = consumer(a.function, "create", str(job), "--id", "CLI1", "--watch")
    assert done.returncode == 0, done.stderr
    assert "created request CLI1" in done.stdout and "FINISHED" in done.stdout and "CRITERION_MET" in done.stdout
    shown = consumer(a.function, "show", "CLI1", "--json")
    doc = json.loads(shown.stdout)
    assert doc["request"]["attributes"]["requestStatus"] == "FINISHED"
    assert doc["process"]["attributes"]["progressStatus"]["resultStateInfo"] == "CRITERION_MET"
    listed = consumer(a.function, "list")
    assert "CLI1" in listed.stdout and "FINISHED" in listed.stdout
    rep = json.loads(consumer(a.function, "report", "CLI1", "--json").stdout)
    assert rep["objectClass"] == "MLTrainingReport"
    out = tmp / "m.pt"
    got = consumer(a.function, "model", "CLI1", "-o", str(out))
    assert got.returncode == 0 and out.stat().st_size > 1000
    import torch

    assert "state_dict" in torch.load(out, weights_only=False)
    # an error of the producer is shown with its reason, exit status 2
    bad = consumer(a.function, "cancel", "CLI1")
    assert bad.returncode == 2 and "409" in bad.stderr


def test_client_class_verbs(two):
    from sluice.service.client import ProvMnSClient, vs_of

    _, a, _ = two
    with ProvMnSClient(a.function) as c:
        doc = {"engine": "local", "train": {"batch_size": 64}, "model": {"hidden": [16]},
               "termination": {"iterations": 400}}
        rid = c.create(doc)["id"]
        snaps = []
        for proc in c.watch(rid, interval=0.2, timeout=120):
            snaps.append(proc)
            st = vs_of(proc, "sluice-status") or {}
            if st.get("iterations", 0) >= 2:
                c.suspend(rid)
                break
        c.wait  # noqa: B018 - the verb exists
        proc = c.process(rid)
        c.resume(rid)
        c.set_priority(rid, 3)
        c.modify(rid, termination={"iterations": 3})
        final = c.wait(rid, timeout=120)
        assert final["attributes"]["priority"] == 3
        assert (vs_of(c.report(rid), "sluice-report") or {})["criterion"]["rule"] == "iterations"
        assert proc["id"] == final["id"]


def test_fanout_gathers_reports_from_several_producers(two):
    tmp, a, b = two
    job = tmp / "fan.toml"
    job.write_text(JOB.replace('id = "digits-mlp"', 'id = "fan"'), encoding="utf-8")
    out = tmp / "fan.json"
    done = consumer(a.function, "fanout", str(job), "--to", a.function, "--to", b.function, "--id", "FAN",
                    "--json", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(out.read_text(encoding="utf-8"))
    assert [g["producer"] for g in got] == [a.function, b.function]
    assert all(g["report"]["objectClass"] == "MLTrainingReport" for g in got)
    causes = [next(c for c in g["report"]["VsDataContainer"] if c["id"] == "sluice-report")["attributes"]["vsData"]
              ["cause"] for g in got]
    assert causes == ["CRITERION_MET", "CRITERION_MET"]
    assert "Reports from every producer" in done.stdout and done.stdout.count("CRITERION_MET") == 2


def _counting_client(url: str):
    """A ProvMnS client whose every answer's size (bytes) is appended to ``sizes``, with the ids it names."""
    import httpx

    from sluice.service.client import ProvMnSClient

    sizes: list[int] = []
    bodies: list[str] = []

    def count(resp: httpx.Response) -> None:
        resp.read()
        sizes.append(len(resp.content))
        bodies.append(resp.text)

    http = httpx.Client(timeout=30, trust_env=False, event_hooks={"response": [count]})
    return ProvMnSClient(url, client=http), sizes, bodies


def _watched_bytes(url: str, rid: str, polls: int = 3) -> tuple[int, list[str]]:
    """Bytes fetched (and answers) while watching ``rid`` for ``polls`` snapshots."""
    c, sizes, bodies = _counting_client(url)
    with c:
        for n, _ in enumerate(c.watch(rid, interval=0.01, timeout=60), start=1):
            if n == polls:
                break
    return sum(sizes), bodies


def test_watch_fetches_only_the_watched_request(tmp_path):
    """Watching one request costs the same bytes whatever else the producer holds: 20 other requests (each
    with its process) change nothing of what the watch downloads, and no answer names them."""
    from sluice.service.client import request_body

    doc = {"engine": "local", "train": {"iterations": 3, "batch_size": 64}, "model": {"hidden": [16]},
           "termination": {"iterations": 3}, "request": {"suspendRequest": True}}  # suspended: nothing trains
    with running_server(tmp_path, name="watch") as srv:
        def put(rid: str) -> None:
            r = srv.http.put(srv.req(rid), json=request_body(doc, rid))
            assert r.status_code == 201, r.text

        put("W1")
        put("O1")
        alone, _ = _watched_bytes(srv.function, "W1")
        for i in range(2, 22):
            put(f"O{i}")
        crowded, bodies = _watched_bytes(srv.function, "W1")
    assert crowded == alone, (alone, crowded)
    assert not any("O1" in b or "MLTrainingRequest=O" in b for b in bodies)


def test_watch_polls_at_a_sensible_interval():
    from sluice.cli import build_parser

    for argv in (["watch", "X"], ["create", "job.toml", "--watch"]):
        args = build_parser().parse_args(["consumer", *argv])
        assert args.interval >= 1.0
    assert build_parser().parse_args(["consumer", "watch", "X", "--interval", "0.2"]).interval == 0.2


def test_fanout_with_an_unreachable_producer_fails_naming_it(two):
    """One producer down: the exit status is not 0, stderr names that producer and why, and the report of
    the producer that trained is still shown and written."""
    from test_service_support import free_port

    tmp, a, _ = two
    job = tmp / "fan-dead.toml"
    job.write_text(JOB.replace('id = "digits-mlp"', 'id = "fan-dead"'), encoding="utf-8")
    dead = f"http://127.0.0.1:{free_port()}/ProvMnS/v1920/SubNetwork=SN1/MLTrainingFunction=TF1"
    out = tmp / "fan-dead.json"
    done = consumer(a.function, "fanout", str(job), "--to", a.function, "--to", dead, "--id", "FAND",
                    "--json", str(out))
    assert done.returncode != 0, done.stdout + done.stderr
    err = " ".join(done.stderr.split())
    assert f"producer {dead}" in err and "could not be reached" in err and "refused" in err, done.stderr
    assert "1 of 2 producers" in err, done.stderr
    assert a.function not in err
    got = json.loads(out.read_text(encoding="utf-8"))
    assert got[0]["producer"] == a.function and got[0]["error"] == ""
    assert next(c for c in got[0]["report"]["VsDataContainer"] if c["id"] == "sluice-report")[
        "attributes"]["vsData"]["cause"] == "CRITERION_MET"
    assert got[1]["report"] is None and "could not be reached" in got[1]["error"]
    assert "CRITERION_MET" in done.stdout


def test_processes_by_id_page_on_and_fall_back_to_a_listing():
    """A request with more processes than one GET asks for gets them all, newest last; a producer that names
    processes otherwise is listed once and filtered."""
    import httpx

    from sluice.service.client import NAMED_BATCH, ProvMnSClient

    url = "http://producer/ProvMnS/v1920/SubNetwork=SN1/MLTrainingFunction=TF1"
    ref = "SubNetwork=SN1,MLTrainingFunction=TF1,MLTrainingRequest=R"

    def proc(pid: str, request_ref: str = ref) -> dict:
        return {"id": pid, "attributes": {"trainingRequestRef": [request_ref], "progressStatus": {}}}

    def serve(procs: list[dict], seen: list[str]):
        def handler(request: httpx.Request) -> httpx.Response:
            flt = request.url.params.get("filter", "")
            seen.append(flt)
            names = set(flt.split("|"))
            body = {"id": "TF1", "MLTrainingProcess": [p for p in procs if flt == "MLTrainingProcess"
                                                       or f"MLTrainingProcess={p['id']}" in names]}
            if "MLTrainingRequest=R" in names:
                body["MLTrainingRequest"] = [{"id": "R", "attributes": {"requestStatus": "IN_PROGRESS"}}]
            return httpx.Response(200, json=body)
        return handler

    seen: list[str] = []
    many = [proc(f"R-{n}") for n in range(1, NAMED_BATCH + 3)] + [proc("X-1", ref.replace("=R", "=X"))]
    with ProvMnSClient(url, client=httpx.Client(transport=httpx.MockTransport(serve(many, seen)))) as c:
        assert [p["id"] for p in c.processes("R")] == [f"R-{n}" for n in range(1, NAMED_BATCH + 3)]
        assert c.status("R")[0] == "IN_PROGRESS" and c.process("R")["id"] == f"R-{NAMED_BATCH + 2}"
    assert "MLTrainingProcess" not in seen
    seen.clear()
    other = [proc("p-7f3a"), proc("p-0b21", ref.replace("=R", "=X"))]
    with ProvMnSClient(url, client=httpx.Client(transport=httpx.MockTransport(serve(other, seen)))) as c:
        assert [p["id"] for p in c.processes("R")] == ["p-7f3a"]
    assert seen[-1] == "MLTrainingProcess"


def test_tables_show_rounded_estimates_and_no_producer_paths() -> None:
    """A status's remaining seconds read as seconds, rounded; a report names the model by the reference the
    consumer downloads it with, not the producer's file path."""
    from rich.console import Console

    from sluice.cli.consumer import _process_table, _report_table

    def text(table) -> str:  # noqa: ANN001
        console = Console(width=200, record=True)
        console.print(table)
        return console.export_text()

    status = {"id": "sluice-status", "attributes": {"vsData": {"iterations": 3, "estimated_remaining_s": 3348.35020520,
                                                               "bytes_up": 1234567}}}
    out = text(_process_table({"id": "P1", "VsDataContainer": [status]}, "p"))
    assert "estimated remaining s (s)" in out and "3,348.4" in out and "3348.350" not in out and "1,234,567" in out
    rep = {"id": "sluice-report", "attributes": {"vsData": {"cause": "CRITERION_MET", "status": "FINISHED",
                                                            "model_path": "/srv/sluice/models/x.pt"}}}
    out = text(_report_table({"attributes": {"mLModelGeneratedRef": "SubNetwork=SN1,MLModel=m"},
                              "VsDataContainer": [rep]}, "r"))
    assert "/srv/sluice" not in out and "MLModel=m" in out
