"""Bearer tokens and ownership on a real ``sluice serve``: two consumers (tokens file) and an admin (inline
token in the configuration file); 401 without a valid token, another consumer's MOIs answer 404 and are
left out of subtrees, subscriptions hear of their consumer's MOIs only, tokens added or revoked with
``sluice token`` act without a restart."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from sluice.cli import main
from sluice.service.auth import add_token, hash_token, new_token
from test_service_support import BASE, TF, Receiver, checked, local_job, request_body, running_server

SUSPENDED = {"suspendRequest": True}  # stays queued: no worker runs


class Caller:
    """One consumer's view of the server: its own httpx client with its token."""

    def __init__(self, root: str, token: str | None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self.http = httpx.Client(base_url=f"{root}{BASE}/", timeout=30, trust_env=False, headers=headers)

    def get(self, ldn: str, status: int | tuple[int, ...] = 200, **params: Any) -> Any:
        return checked(self.http.get(ldn, params=params or None), status)

    def put(self, ldn: str, body: Any, status: int | tuple[int, ...] = 201) -> Any:
        return checked(self.http.put(ldn, json=body), status)

    def patch(self, ldn: str, body: Any, status: int | tuple[int, ...] = 200) -> Any:
        return checked(self.http.patch(ldn, content=json.dumps(body),
                                       headers={"Content-Type": "application/merge-patch+json"}), status)

    def delete(self, ldn: str, status: int | tuple[int, ...] = 204) -> Any:
        return checked(self.http.delete(ldn), status)

    def tree(self, ldn: str = TF) -> dict[str, Any]:
        return self.get(ldn, scopeType="BASE_ALL")


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("auth")
    tokens = tmp / "tokens.toml"
    alice, bob = add_token(tokens, "alice"), add_token(tokens, "bob")
    admin = new_token()
    cfg = tmp / "service.toml"
    cfg.write_text(f'[auth]\ntokens_file = "{tokens}"\n'
                   f'tokens = [{{consumer = "ops", role = "admin", token_sha256 = "{hash_token(admin)}"}}]\n',
                   encoding="utf-8")
    with running_server(tmp, extra=(str(cfg),), token=admin) as srv:
        callers = {name: Caller(srv.root, tok) for name, tok in (("alice", alice), ("bob", bob), ("ops", admin))}
        try:
            yield srv, callers, tokens
        finally:
            for c in callers.values():
                c.http.close()


def req(rid: str) -> str:
    return f"{TF}/MLTrainingRequest={rid}"


def ids(tree: dict[str, Any], cls: str) -> set[str]:
    return {x["id"] for x in tree.get(cls, [])}


def test_no_or_bad_token_is_401_with_a_3gpp_body(svc: Any) -> None:
    srv, _, _ = svc
    for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic YWxpY2U6eA=="},
                    {"Authorization": "Bearer"}):
        resp = httpx.get(srv.uri(TF), headers=headers, trust_env=False)
        body = checked(resp, 401)
        assert resp.headers["www-authenticate"].startswith("Bearer")
        assert body["status"] == "401" and body["title"] == "Unauthorized"
    resp = httpx.put(srv.uri(req("Rx")), json=request_body("Rx"), trust_env=False)
    checked(resp, 401)  # ErrorResponseDefault for PUT
    assert httpx.get(srv.uri(TF), trust_env=False, headers={"Authorization": "Bearer x"}).status_code == 401
    assert httpx.get(f"{srv.root}/openapi.json", trust_env=False).status_code == 200  # the document is public


def test_a_consumer_sees_and_changes_only_its_own_requests(svc: Any) -> None:
    _, c, _ = svc
    alice, bob, ops = c["alice"], c["bob"], c["ops"]
    alice.put(req("Ra"), request_body("Ra", attributes=SUSPENDED))
    bob.put(req("Rb"), request_body("Rb", attributes=SUSPENDED))

    # another consumer's request and its process do not exist for bob
    for ldn in (req("Ra"), f"{TF}/MLTrainingProcess=Ra-1"):
        err = bob.get(ldn, 404)
        assert err["type"] == "IE_NOT_FOUND"
    bob.patch(req("Ra"), {"attributes": {"cancelRequest": True}}, 404)
    bob.put(req("Ra"), request_body("Ra"), 404)
    bob.delete(req("Ra"), 404)
    bob.patch(f"{TF}/MLTrainingProcess=Ra-1", {"attributes": {"priority": 9}}, 404)
    assert alice.get(req("Ra"))["attributes"]["cancelRequest"] is False  # nothing of bob's reached it
    assert alice.get(f"{TF}/MLTrainingProcess=Ra-1")["attributes"]["priority"] == 0

    # subtrees hold only what the caller owns; the shared containers are visible to all
    tb, ta, to = bob.tree(), alice.tree(), ops.tree()
    assert "Rb" in ids(tb, "MLTrainingRequest") and "Ra" not in ids(tb, "MLTrainingRequest")
    assert "Rb-1" in ids(tb, "MLTrainingProcess") and "Ra-1" not in ids(tb, "MLTrainingProcess")
    assert "Ra" in ids(ta, "MLTrainingRequest") and "Rb" not in ids(ta, "MLTrainingRequest")
    assert {"Ra", "Rb"} <= ids(to, "MLTrainingRequest")  # the admin sees both
    assert bob.get("SubNetwork=SN1", scopeType="BASE_ALL")["id"] == "SN1"

    # the id namespace is shared: bob cannot take alice's id
    checked(bob.http.post(TF, json={**request_body("Ra"), "objectClass": "MLTrainingRequest"}), 409)

    # the admin changes anyone's request; the owner then sees the change
    ops.patch(req("Rb"), {"attributes": {"cancelRequest": True}})
    assert bob.get(req("Rb"))["attributes"]["requestStatus"] in ("CANCELLING", "CANCELLED")
    alice.delete(req("Ra"), (204, 409))


def test_subscriptions_hear_of_their_consumers_moi_only(svc: Any) -> None:
    _, c, _ = svc
    alice, bob = c["alice"], c["bob"]
    got = {name: Receiver() for name in ("alice", "bob", "ops")}
    try:
        for name, r in got.items():
            sub = f"SubNetwork=SN1/NtfSubscriptionControl=S-{name}"
            c[name].put(sub, {"id": f"S-{name}", "attributes": {"notificationRecipientAddress": r.url}})
        bob.get("SubNetwork=SN1/NtfSubscriptionControl=S-alice", 404)
        bob.delete("SubNetwork=SN1/NtfSubscriptionControl=S-alice", 404)
        alice.put(req("Na"), request_body("Na", attributes=SUSPENDED))
        bob.put(req("Nb"), request_body("Nb", attributes=SUSPENDED))
        alice.patch(req("Na"), {"attributes": {"cancelRequest": True}})  # ends its process: a report

        def created(cls: str, rid: str) -> Any:
            return lambda n: n["notificationType"] == "notifyMOICreation" and n["href"].endswith(f"/{cls}={rid}")

        got["alice"].wait(created("MLTrainingReport", "Na-1"))
        got["bob"].wait(created("MLTrainingProcess", "Nb-1"))
        got["ops"].wait(created("MLTrainingReport", "Na-1"))
        got["ops"].wait(created("MLTrainingProcess", "Nb-1"))
        for name, mine, theirs in (("alice", "=Na", "=Nb"), ("bob", "=Nb", "=Na")):
            hrefs = [n["href"] for n in got[name].got]
            assert any(mine in h for h in hrefs), hrefs
            assert not any(theirs in h for h in hrefs), hrefs
            assert all(n["subscriptionId"].endswith(f"NtfSubscriptionControl=S-{name}") for n in got[name].got)
        for name in got:
            c[name].delete(f"SubNetwork=SN1/NtfSubscriptionControl=S-{name}")
    finally:
        for r in got.values():
            r.close()


def test_reports_and_models_belong_to_the_requests_consumer(svc: Any) -> None:
    _, c, _ = svc
    alice, bob = c["alice"], c["bob"]
    alice.put(req("Rm"), request_body("Rm", local_job(iterations=2)))
    t0 = time.monotonic()
    while True:
        proc = alice.get(f"{TF}/MLTrainingProcess=Rm-1")
        if proc["attributes"]["progressStatus"]["status"] in ("FINISHED", "FAILED", "CANCELLED"):
            break
        assert time.monotonic() - t0 < 60, proc
        time.sleep(0.1)
    ref = proc["attributes"].get("mLModelRef")
    assert ref, proc
    model = ref.replace(",", "/")
    report = proc["attributes"]["trainingReportRef"].replace(",", "/")
    assert alice.get(model)["objectClass"] == "MLModel"
    resp = alice.http.get(model, headers={"Accept": "application/octet-stream"})
    assert resp.status_code == 200 and len(resp.content) > 100
    for ldn in (model, report):
        bob.get(ldn, 404)
    assert bob.http.get(model, headers={"Accept": "application/octet-stream"}).status_code == 404
    repo = "SubNetwork=SN1/MLModelRepository=MR1"
    assert model.rpartition("=")[2] not in ids(bob.tree(repo), "MLModel")
    assert model.rpartition("=")[2] in ids(alice.tree(repo), "MLModel")


def test_tokens_added_and_revoked_act_without_restart(svc: Any, capsys: pytest.CaptureFixture[str]) -> None:
    srv, _, tokens = svc
    assert main(["token", "add", "--consumer", "carol", "--file", str(tokens)]) == 0
    token = capsys.readouterr().out.strip()
    assert hash_token(token) in tokens.read_text(encoding="utf-8") and token not in tokens.read_text(encoding="utf-8")
    carol = Caller(srv.root, token)
    try:
        carol.get(TF)
        url = f"{srv.root}{BASE}/{TF}"
        assert main(["consumer", "--producer", url, "--token", token, "list"]) == 0
        assert main(["consumer", "--producer", url, "list"]) == 2  # no token: the 401 is reported
        assert "401" in capsys.readouterr().err
        assert main(["token", "revoke", "--consumer", "carol", "--file", str(tokens)]) == 0
        carol.get(TF, 401)
    finally:
        carol.http.close()


def test_tokens_file_is_owner_only_even_over_a_leftover(tmp_path) -> None:
    import stat

    from sluice.service.auth import read_tokens_file

    path = tmp_path / "tokens.toml"
    import os
    import threading

    # an interrupted write's new file, readable by everyone
    leftover = tmp_path / f"tokens.toml.{os.getpid()}.{threading.get_ident()}.tmp"
    leftover.write_text("junk")
    leftover.chmod(0o644)
    token = add_token(path, "ops")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not leftover.exists()
    assert [e.token_sha256 for e in read_tokens_file(path)] == [hash_token(token)]


def _add_tokens(path: str, consumer: str, n: int) -> list[str]:
    return [hash_token(add_token(path, consumer)) for _ in range(n)]


def test_tokens_added_at_once_from_many_processes_are_all_kept(tmp_path) -> None:
    """Concurrent `sluice token add` runs (separate processes) serialise on the tokens file's lock: every
    token added is in the file, none lost to another run's read-modify-write, and a revoke racing the
    adds removes exactly its consumer's tokens."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from sluice.service.auth import read_tokens_file, revoke_tokens

    path = str(tmp_path / "tokens.toml")
    _add_tokens(path, "gone", 3)
    with ProcessPoolExecutor(6, mp_context=multiprocessing.get_context("fork")) as pool:
        adds = [pool.submit(_add_tokens, path, f"c{i}", 8) for i in range(5)]
        revoked = pool.submit(revoke_tokens, path, "gone")
        added = {h for f in adds for h in f.result()}
    assert revoked.result() == 3
    assert len(added) == 40
    assert {e.token_sha256 for e in read_tokens_file(path)} == added


def test_new_tokens_carry_the_prefix_and_pass_as_an_option_value(tmp_path) -> None:
    """A bare URL-safe token starts with "-" once in 64, and `--token -x...` is then an unknown option:
    every token Sluice makes starts with its prefix instead, and the consumer command line takes it."""
    from sluice.cli import build_parser
    from sluice.service.auth import TOKEN_PREFIX

    tokens = {add_token(tmp_path / "tokens.toml", f"c{i}") for i in range(200)}
    assert len(tokens) == 200 and all(t.startswith(TOKEN_PREFIX) and len(t) == len(TOKEN_PREFIX) + 43 for t in tokens)
    parser = build_parser()
    url = "http://127.0.0.1:1/ProvMnS/v1920/SubNetwork=SN1/MLTrainingFunction=TF1"
    assert all(parser.parse_args(["consumer", "--producer", url, "--token", t, "list"]).token == t for t in tokens)
