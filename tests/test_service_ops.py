"""Operations endpoints of a real ``sluice serve``: ``/health`` and ``/ready`` without a token, Prometheus metrics
at ``/metrics`` (parsed with prometheus_client's parser), and the OpenAPI document as YAML."""

from __future__ import annotations

import time
from types import SimpleNamespace

import httpx
import pytest
import sqlalchemy as sa
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sluice.service.auth import hash_token, new_token
from test_service_support import BASE, Receiver, checked, request_body, running_server


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A service whose ProvMnS needs a token; ``srv.http`` carries it, ``anon`` does not."""
    tmp = tmp_path_factory.mktemp("ops")
    token = new_token()
    cfg = tmp / "service.toml"
    cfg.write_text(f'[auth]\ntokens = [{{consumer = "ops", role = "admin", token_sha256 = "{hash_token(token)}"}}]\n',
                   encoding="utf-8")
    with running_server(tmp, extra=(str(cfg),), token=token) as srv, httpx.Client(timeout=30, trust_env=False) as anon:
        yield srv, anon


def metrics(anon: httpx.Client, srv) -> dict[str, dict[tuple, float]]:
    resp = anon.get(f"{srv.root}/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_health_and_ready_answer_without_a_token(secured):
    srv, anon = secured
    assert anon.get(f"{srv.root}{BASE}/SubNetwork=SN1").status_code == 401  # ProvMnS needs one
    assert anon.get(f"{srv.root}/health").json() == {"status": "ok"}
    ready = anon.get(f"{srv.root}/ready")
    assert ready.status_code == 200, ready.text
    body = ready.json()
    assert body["status"] == "ready" and body["database"] == "ok"
    assert body["workers"] == {"supervisor": "running", "running": 0, "max": 2}


def test_metrics_count_requests_processes_and_notifications(secured):
    srv, anon = secured
    before = metrics(anon, srv)
    assert before["sluice_training_requests"][(("status", "FINISHED"),)] == 0
    rec = Receiver()
    try:
        sub = srv.uri("SubNetwork=SN1/NtfSubscriptionControl=M")
        checked(srv.http.put(sub, json={"id": "M", "attributes": {"notificationRecipientAddress": rec.url}}), 201)
        for rid in ("M1", "M2"):
            checked(srv.http.put(srv.req(rid), json=request_body(rid, termination={"iterations": 1})), 201)
        for rid in ("M1", "M2"):
            srv.wait_status(rid, ("FINISHED",))
        rec.wait(lambda n: n["href"].endswith("MLTrainingReport=M2-1"))
        t0 = time.monotonic()
        while (after := metrics(anon, srv))["sluice_notification_backlog"][()] > 0:  # the last may be in flight
            assert time.monotonic() - t0 < 30, f"notifications were not delivered: {after}"
            time.sleep(0.05)
    finally:
        rec.close()
    assert after["sluice_training_requests"][(("status", "FINISHED"),)] == 2
    assert after["sluice_training_requests"][(("status", "IN_PROGRESS"),)] == 0
    assert after["sluice_training_processes"][(("phase", "ended"),)] == 2
    assert after["sluice_training_processes"][(("phase", "running"),)] == 0
    assert after["sluice_queue_length"][()] == 0
    assert after["sluice_workers_max"][()] == 2
    delivered = after["sluice_notification_delivery_latency_seconds_count"][()]
    assert delivered == len(rec.got) > 0
    buckets = {dict(k)["le"]: v for k, v in after["sluice_notification_delivery_latency_seconds_bucket"].items()}
    assert buckets["+Inf"] == delivered and list(buckets.values()) == sorted(buckets.values())
    assert after["sluice_notification_delivery_latency_seconds_sum"][()] >= 0
    http = after["sluice_http_requests_total"]
    assert http[(("code", "201"), ("method", "PUT"))] >= 3
    assert http[(("code", "401"), ("method", "GET"))] >= 1


def test_the_openapi_document_is_served_as_yaml(secured):
    srv, anon = secured
    as_json = anon.get(f"{srv.root}{BASE}/openapi.json").json()
    for path in ("/openapi.yaml", f"{BASE}/openapi.yaml"):
        resp = anon.get(f"{srv.root}{path}")
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/yaml")
        assert yaml.safe_load(resp.text) == as_json


def test_ready_is_503_when_the_database_cannot_be_reached(tmp_path):
    from sluice.service.metrics import readiness

    class Supervisor:
        max_concurrent = 1

        def alive(self) -> bool:
            return True

        def running(self) -> list[str]:
            return []

    broken = sa.create_engine(f"sqlite:///{tmp_path / 'missing' / 'dir' / 'x.db'}")
    status, body = readiness(SimpleNamespace(db=broken, supervisor=Supervisor()))
    assert status == 503 and body["status"] == "unready" and body["database"].startswith("unreachable")
    Supervisor.alive = lambda self: False
    good = sa.create_engine(f"sqlite:///{tmp_path / 'x.db'}")
    status, body = readiness(SimpleNamespace(db=good, supervisor=Supervisor()))
    assert status == 503 and body["database"] == "ok" and body["workers"]["supervisor"] == "stopped"
