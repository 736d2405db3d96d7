"""The REST layer in process: a router per resource class, the caller a dependency checked before anything
else, and the 3GPP error bodies of what no router takes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from sluice.service.app import create_app
from sluice.service.auth import TokenEntry, hash_token
from sluice.service.config import ServiceConfig


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, ServiceConfig]]:
    tmp: Path = tmp_path_factory.mktemp("routes")
    cfg = ServiceConfig(database=f"sqlite:///{tmp / 'svc.db'}")
    cfg.auth.tokens = [TokenEntry(consumer="alice", token_sha256=hash_token("tok-a"))]
    with TestClient(create_app(cfg, "http://testserver")) as c:
        yield c, cfg


def test_every_route_has_the_caller_checked_first(client: tuple[TestClient, ServiceConfig]) -> None:
    c, cfg = client
    sn = f"{cfg.base_path}/SubNetwork={cfg.subnetwork}"
    tf = f"{sn}/MLTrainingFunction={cfg.training_function}"
    for path in (f"{tf}/MLTrainingRequest=R1", f"{tf}/MLTrainingProcess=R1-1", f"{sn}/NtfSubscriptionControl=S1",
                 f"{tf}/MLTrainingReport=R1-1", tf, f"{sn}/Bad%01=x"):
        for method in ("GET", "PUT", "PATCH", "POST", "DELETE", "OPTIONS", "HEAD"):
            resp = c.request(method, path, content=b"{not json")
            assert resp.status_code == 401, (method, path, resp.text)
            assert resp.headers["www-authenticate"].startswith("Bearer")
            if method != "HEAD":
                assert resp.json()["status"] == "401"
    assert c.get("/health").status_code == 200  # operations and the OpenAPI document need no token
    assert c.get(f"{cfg.base_path}/openapi.json").status_code == 200


def test_what_no_resource_router_takes(client: tuple[TestClient, ServiceConfig]) -> None:
    c, cfg = client
    auth = {"Authorization": "Bearer tok-a"}
    sn = f"{cfg.base_path}/SubNetwork={cfg.subnetwork}"
    tf = f"{sn}/MLTrainingFunction={cfg.training_function}"
    resp = c.put(tf, json={}, headers=auth)
    assert (resp.status_code, resp.headers["allow"]) == (405, "GET, POST")
    resp = c.head(f"{tf}/MLTrainingRequest=R1", headers=auth)
    assert (resp.status_code, resp.headers["allow"]) == (405, "GET, PUT, PATCH, DELETE")
    resp = c.request("TRACE", tf, headers=auth)
    assert resp.status_code == 405 and resp.json()["status"] == "405"
    resp = c.options(f"{tf}/MLTrainingProcess=R1-1", headers=auth)
    assert (resp.status_code, resp.headers["allow"]) == (204, "GET, PATCH")  # as the OpenAPI document declares
    resp = c.put(f"{tf}/MLTrainingRequest=R1", headers=auth, json={"VsDataContainer": [
        {"id": "sluice-job", "attributes": {"vsData": [1]}}]})
    assert resp.status_code == 400 and resp.json()["badAttributes"] == ["VsDataContainer/sluice-job"]
    resp = c.post(tf, headers=auth, json={"objectClass": "MLModel"})
    assert resp.status_code == 400 and resp.json()["badAttributes"] == ["objectClass"]
    resp = c.get(f"{sn}/Bad%01=x", headers=auth)
    assert resp.status_code == 400 and "malformed LDN segment" in resp.json()["reason"]
