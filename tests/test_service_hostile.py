"""Hostile input against a real ``sluice serve``: oversized bodies are refused with 413 before they are read whole
(:mod:`sluice.service.limits`), malformed or hostile training-data uploads with 400, and a refused request
changes nothing — the store's MOIs, uploads and notifications are compared row by row before and after.
Also the regression tests of the server errors the schemathesis run found (tests/test_service_fuzz.py)."""

from __future__ import annotations

import gzip
import io
import json
import pickle
import socket
import sqlite3
import zipfile
import zlib

import numpy as np
import pytest

from test_service_support import BASE, TF, Receiver, checked, request_body, running_server

BODY_LIMIT = 16 * 1024
UPLOAD_LIMIT = 2 * 1024 * 1024
PROC_PATH = f"{BASE}/{TF}/MLTrainingProcess="


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    rec = Receiver()
    extra = ("--set", f"max_body_bytes={BODY_LIMIT}", "--set", f"max_upload_bytes={UPLOAD_LIMIT}",
             "--set", "policy.default_iterations=2")
    try:
        with running_server(tmp, name="hostile", extra=extra) as s:
            checked(s.http.put(s.uri("SubNetwork=SN1/NtfSubscriptionControl=HS"), json={"attributes": {
                "notificationRecipientAddress": rec.url, "notificationTypes": [
                    "notifyMOICreation", "notifyMOIAttributeValueChanges", "notifyMOIDeletion"]}}), 201)
            s.receiver = rec
            yield s
    finally:
        rec.close()


def snapshot(srv) -> dict:
    """Everything the service stores, read from its SQLite file: MOIs (with versions and the producer's own
    bookkeeping), uploads and notifications."""
    con = sqlite3.connect(f"file:{srv.db}?mode=ro", uri=True)
    try:
        return {
            "moi": con.execute("SELECT dn, version, attributes, vs_data, internal FROM moi ORDER BY dn").fetchall(),
            "upload": con.execute("SELECT id, process_dn, samples FROM upload ORDER BY id").fetchall(),
            "notification": con.execute("SELECT id FROM notification ORDER BY id").fetchall(),
        }
    finally:
        con.close()


def data_body(data) -> dict:
    return {"VsDataContainer": [{"id": "sluice-data", "attributes": {"vsData": data}}]}


def samples(n: int, features: int = 64, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"X": rng.uniform(0, 16, size=(n, features)).round(3).tolist(), "y": rng.integers(0, 10, n).tolist()}


def raw_exchange(port: int, head: str, first: bytes, then: bytes = b"") -> tuple[bytes, int]:
    """Send the request head and ``first`` on a raw socket, then ``then`` (ignoring a closed connection), and
    read the response. Returns (response bytes, bytes of the body sent)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(head.encode("latin-1") + first)
        sent = len(first)
        try:
            if then:
                s.sendall(then)
                sent += len(then)
        except OSError:
            pass
        got = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            got += chunk
        return got, sent


def parse(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body)


# ------------------------------------------------------------------------------------------------ 413


def test_a_declared_oversized_body_is_refused_before_it_is_sent(srv):
    for path, limit in ((f"{BASE}/{TF}/MLTrainingRequest=BIG", BODY_LIMIT), (f"{PROC_PATH}P-1", UPLOAD_LIMIT)):
        declared = 50 * limit
        head = (f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {declared}\r\n\r\n")
        raw, sent = raw_exchange(srv.port, head, b"[" * 1024)  # the client stops after 1 KiB and waits
        status, headers, body = parse(raw)
        assert status == 413 and sent == 1024 < declared
        assert headers["content-type"] == "application/json" and headers["connection"] == "close"
        assert body["type"] == "SERVER_LIMITATION" and str(declared) in body["reason"]
        assert str(limit) in body["reason"]


def test_a_chunked_body_is_refused_as_soon_as_it_crosses_the_limit(srv):
    before = snapshot(srv)
    path = f"{BASE}/{TF}/MLTrainingRequest=CHUNKY"
    head = (f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n")
    piece = b" " * 4096
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(BODY_LIMIT // len(piece) + 1))
    # more than the limit, and the body never ends (no last chunk): only an early answer can come back
    raw, _ = raw_exchange(srv.port, head, chunks)
    status, headers, body = parse(raw)
    assert status == 413 and headers["connection"] == "close"
    assert body["type"] == "SERVER_LIMITATION" and "the rest was not read" in body["reason"]
    assert snapshot(srv) == before


def test_an_endless_streamed_upload_stops_early_for_an_ordinary_client(srv):
    """httpx streams a generator without Content-Length; the 413 comes back while most of it was never made."""
    made = []

    def endless():
        for i in range(10_000):  # 40 MiB in all, 40 times the limit
            made.append(i)
            yield b"[" + b"0," * 2047 + b"0]"

    resp = srv.http.patch(srv.uri(f"{TF}/MLTrainingProcess=NOPE-1"), content=endless(),
                          headers={"Content-Type": "application/merge-patch+json"})
    body = checked(resp, 413)
    assert body["type"] == "SERVER_LIMITATION"
    assert len(made) < 10_000 // 4, f"the client produced {len(made)} chunks before the answer"


def test_too_many_samples_are_refused_with_413(srv):
    pid = _proposed_process(srv, "ROWS")
    before = snapshot(srv)
    many = {"X": [[0]] * 200_001, "y": [0] * 200_001}
    err = checked(srv.http.patch(srv.proc_uri(pid), content=json.dumps(data_body(many), separators=(",", ":")),
                                 headers={"Content-Type": "application/merge-patch+json"}), 413)
    assert "200000 samples" in err["reason"]
    assert snapshot(srv) == before


# ------------------------------------------------------------------------------------------------ uploads


def _proposed_process(srv, rid: str) -> str:
    """A request whose process waits for the consumer's agreement (no worker: its state holds still)."""
    checked(srv.http.put(srv.req(rid), json=request_body(rid, decided_by="negotiated")), 201)
    return srv.process_of(rid)["id"]


def _send(srv, pid: str, content: bytes, headers: dict | None = None):
    return srv.http.patch(srv.proc_uri(pid), content=content,
                          headers={"Content-Type": "application/merge-patch+json", **(headers or {})})


class _Opens:
    """Unpickling this creates ``path``: the marker that the service never unpickles."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _npz_with_objects() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, X=np.array([{"a": 1}, None], dtype=object), y=np.array([0, 1]))
    return buf.getvalue()


def hostile_uploads(tmp_marker: str) -> dict[str, tuple[bytes, dict]]:
    """name -> (raw body, extra headers) of a malformed or hostile upload; each must be refused with 400."""
    good = samples(4)

    def as_json(data) -> bytes:
        return json.dumps(data_body(data)).encode()

    bomb_doc = b'{"VsDataContainer":[{"id":"sluice-data","attributes":{"vsData":{"X":[[' + b"0," * (8 << 20) + b"0]]"
    return {
        "ragged rows": (as_json({"X": [[1.0, 2.0], [3.0]], "y": [0, 1]}), {}),
        "1-D X": (as_json({"X": [1.0, 2.0, 3.0], "y": [0, 1, 2]}), {}),
        "y shorter than X": (as_json({**good, "y": good["y"][:-1]}), {}),
        "wrong feature count": (as_json(samples(4, features=3)), {}),
        "empty X": (as_json({"X": [], "y": []}), {}),
        "NaN": (b'{"VsDataContainer":[{"id":"sluice-data","attributes":{"vsData":{"X":[[NaN]],"y":[0]}}}]}', {}),
        "Infinity": (json.dumps(data_body({"X": [[float("inf")] * 64], "y": [0]})).encode(), {}),
        "overflowing number": (as_json({"X": [[0.0] * 63 + [7.0]], "y": [0]}).replace(b"7.0", b"1e999"), {}),
        "strings": (as_json({"X": [["a"] * 64], "y": [0]}), {}),
        "booleans": (as_json({"X": [[True] * 64], "y": [0]}), {}),
        "nested rows": (as_json({"X": [[[1.0]] * 64], "y": [0]}), {}),
        "unknown member": (as_json({**good, "w": [1]}), {}),
        "data not an object": (as_json("gASVCgAAAAAAAACMBl9fbWFpbl9flC4="), {}),
        "pickle body": (pickle.dumps(_Opens(tmp_marker)), {}),
        "pickle as application/octet-stream": (pickle.dumps(_Opens(tmp_marker)), {}),
        "npz with object arrays": (_npz_with_objects(), {}),
        "zip archive": (_zip_of(as_json(good)), {}),
        "gzip bomb": (gzip.compress(bomb_doc, 9), {"Content-Encoding": "gzip"}),
        "deflate bomb": (zlib.compress(b"\0" * (64 << 20), 9), {"Content-Encoding": "deflate"}),
        "truncated gzip": (gzip.compress(as_json(good))[:-20], {"Content-Encoding": "gzip"}),
        "gzip of garbage": (b"\x1f\x8b\x08\x00" + b"\xff" * 64, {"Content-Encoding": "gzip"}),
        "deep nesting": (b'{"VsDataContainer":' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}),
    }


def _zip_of(content: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("data.json", content)
    return buf.getvalue()


def test_hostile_uploads_are_refused_with_400_and_change_nothing(srv, tmp_path):
    pid = _proposed_process(srv, "HOST")
    first = checked(_send(srv, pid, json.dumps(data_body(samples(8))).encode()), 200)
    assert first["id"] == pid
    marker = tmp_path / "unpickled"
    cases = hostile_uploads(str(marker))
    before = snapshot(srv)
    notified = len(srv.receiver.got)
    for name, (content, headers) in cases.items():
        if name == "pickle as application/octet-stream":
            resp = srv.http.patch(srv.proc_uri(pid), content=content,
                                  headers={"Content-Type": "application/octet-stream"})
            checked(resp, 415)
        else:
            err = checked(_send(srv, pid, content, headers), 400)
            assert err["type"] == "VALIDATION_ERROR", name
        assert snapshot(srv) == before, f"{name} changed the store"
    assert not marker.exists(), "the service unpickled an upload"
    assert len(srv.receiver.got) == notified
    # a gzip upload within the limits is taken like the plain one
    out = checked(_send(srv, pid, gzip.compress(json.dumps(data_body(samples(8, seed=1))).encode()),
                        {"Content-Encoding": "gzip"}), 200)
    data = next(c for c in out["VsDataContainer"] if c["id"] == "sluice-data")["attributes"]["vsData"]
    assert data["uploads"] == 2 and data["samples"] == 16 and data["features"] == 64


def test_refused_data_for_an_ended_process_starts_no_retraining(srv):
    """The request took 64-feature data before it trained: data of another shape for its ended process is
    refused at once (400), and no retraining process appears."""
    pid = _proposed_process(srv, "ENDED")
    checked(_send(srv, pid, json.dumps(data_body(samples(8))).encode()), 200)
    srv.patch(srv.proc_uri(pid), {"VsDataContainer": [{"id": "sluice-termination",
                                                       "attributes": {"vsData": {"iterations": 2}}}]})
    srv.wait_status("ENDED", ("FINISHED",), timeout=120)
    before = snapshot(srv)
    for data in (samples(4, features=3), {"X": [[0.5] * 64], "y": ["seven"]}):
        err = checked(_send(srv, pid, json.dumps(data_body(data)).encode()), 400)
        assert err["badAttributes"][0].startswith("VsDataContainer/sluice-data")
    checked(_send(srv, pid, b'{"VsDataContainer": [{"id": "sluice-data", "attributes": {"vsData": '
                               b'{"X": [[NaN]], "y": [0]}}}]}'), 400)
    assert snapshot(srv) == before
    assert srv.process_of("ENDED")["id"] == pid


# ------------------------------------------------------------------------------------------------ fuzz regressions


def test_json_patch_of_the_whole_document_is_a_400(srv):
    checked(srv.http.put(srv.req("JP"), json=request_body("JP", decided_by="negotiated")), 201)
    for op in ({"op": "move", "from": "", "path": ""}, {"op": "remove", "path": ""},
               {"op": "move", "from": "", "path": "/attributes/x"}):
        err = srv.patch(srv.req("JP"), [op], 400, ctype="application/json-patch+json")
        assert "whole resource" in err["reason"]


def test_a_request_recreated_under_a_deleted_id_gets_a_new_process(srv):
    checked(srv.http.put(srv.req("AGAIN"), json=request_body("AGAIN", decided_by="negotiated")), 201)
    first = srv.process_of("AGAIN")["id"]
    assert srv.http.delete(srv.req("AGAIN")).status_code == 204
    # the process went with its request: data for it retrains nothing
    err = srv.patch(srv.proc_uri(first), data_body(samples(2)), 404)
    assert "type" in err
    checked(srv.http.put(srv.req("AGAIN"), json=request_body("AGAIN", decided_by="negotiated")), 201)
    second = srv.process_of("AGAIN")
    assert second["attributes"]["progressStatus"]["progressStateInfo"] == "AWAITING_AGREEMENT"
    assert "trainingReportRef" not in second["attributes"]  # nothing of the cancelled one is left


def test_non_finite_and_deeply_nested_json_is_a_400_anywhere(srv):
    for raw in (b'{"attributes": {"trainingDataQualityScore": 1e999}}',
                b'{"attributes": {"trainingDataQualityScore": NaN}}',
                b'{"attributes": {"trainingDataQualityScore": -Infinity}}',
                b'{"attributes": ' + b'{"a": ' * 40 + b"1" + b"}" * 41):
        err = checked(srv.http.put(srv.req("NUM"), content=raw, headers={"Content-Type": "application/json"}), 400)
        assert "JSON" in err["reason"] or "nests" in err["reason"]
    assert srv.http.get(srv.req("NUM")).status_code == 404


def test_writes_to_producer_only_classes_are_405_with_allow_whatever_the_body(srv):
    for ldn in ("SubNetwork=SN1/MLModelRepository=MR1", "SubNetwork=SN1/MLTrainingFunction=TF1"):
        resp = srv.http.put(srv.uri(ldn))  # no body at all
        checked(resp, 405)
        assert resp.headers["allow"] in ("GET", "GET, POST")
