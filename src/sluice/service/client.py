"""The consumer side: a small ProvMnS client (httpx) with one method per thing a consumer does.

:class:`ProvMnSClient` talks to one producer, addressed by the URI of its ``MLTrainingFunction``
(``http://127.0.0.1:8080/ProvMnS/v1920/SubNetwork=SN1/MLTrainingFunction=TF1``). Requests are named by
their id; the verbs find the request's current training process (the newest one whose
``trainingRequestRef`` names the request) themselves::

    c = ProvMnSClient(url)             # token="...", ca_file="ca.pem", client_cert=("me.pem", "me.key")
    c.create(job_doc, "R1")            # a job document (TOML as dict) → PUT MLTrainingRequest=R1
    c.wait("R1"); c.report("R1"); c.download_model("R1", "model.pt")

A job document is what ``sluice run`` / ``sluice local`` read (``engine = "local"``, the engine's sections,
``[model]``, ``[requirements]``, ``[termination]``) plus an optional ``[request]`` table: ``id``,
``aIMLInferenceName``, ``decided_by`` (``consumer``, ``producer``, ``negotiated``) and any other
``MLTrainingRequest`` attribute. :func:`request_body` turns it into the resource body.

Only httpx is imported here (no FastAPI, SQLAlchemy or torch).
"""

from __future__ import annotations

import re
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from sluice.errors import SluiceError

ENDED = ("FINISHED", "CANCELLED")
NAMED_BATCH = 8  # processes asked for by name in one GET (a request has one per training: 1, then retrainings)
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_.\-~:]")  # what a Sluice producer replaces by _ in the ids it makes
MERGE = "application/merge-patch+json"
REQUEST_KEYS = ("id", "decided_by")


class MnSClientError(SluiceError):
    """The producer answered with an error (its 3GPP error body is :attr:`body`)."""

    def __init__(self, status: int, body: Any, what: str) -> None:
        reason = body.get("reason") if isinstance(body, dict) else None
        bad = []
        if isinstance(body, dict):
            bad = body.get("badAttributes") or body.get("badQueryParams") or []
        detail = f" ({', '.join(bad)})" if bad else ""
        super().__init__(f"{what}: HTTP {status}: {reason or body}{detail}")
        self.status = status
        self.body = body


class ProducerUnreachable(SluiceError):
    """No answer came from the producer (connection refused, timed out, TLS failed...)."""


def request_body(doc: dict[str, Any], request_id: str | None = None) -> dict[str, Any]:
    """The ``MLTrainingRequest`` body of a job document (see the module docstring)."""
    doc = dict(doc)
    req = dict(doc.pop("request", None) or {})
    rid = request_id or req.get("id")
    decided = req.get("decided_by")
    attrs = {k: v for k, v in req.items() if k not in REQUEST_KEYS}
    vs: list[dict[str, Any]] = []
    requirements = doc.pop("requirements", None)
    termination = doc.pop("termination", None)
    vs.append({"id": "sluice-job", "attributes": {"vsData": doc}})
    if requirements:
        vs.append({"id": "sluice-requirements", "attributes": {"vsData": requirements}})
    if termination is not None:
        vs.append({"id": "sluice-termination", "attributes": {"vsData": termination}})
    if decided:
        vs.append({"id": "sluice-negotiation", "attributes": {"vsData": {"decidedBy": decided}}})
    body: dict[str, Any] = {"attributes": attrs, "VsDataContainer": vs}
    if rid:
        body["id"] = rid
    else:
        body["objectClass"] = "MLTrainingRequest"
    return body


def tls_context(ca_file: str | None = None,
                client_cert: tuple[str, str | None] | None = None) -> ssl.SSLContext | bool:
    """How an httpx client verifies servers: True (the system's CAs) when nothing is given, else a context
    trusting ``ca_file`` (or the system's CAs) that presents ``client_cert`` — ``(certificate file, key
    file)``, the key None when it is in the certificate file — to servers that ask for one (mutual TLS)."""
    if ca_file is None and client_cert is None:
        return True
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
        if client_cert is not None:
            ctx.load_cert_chain(client_cert[0], client_cert[1])
    except (OSError, ssl.SSLError) as exc:
        raise SluiceError(f"cannot load the TLS files {ca_file}, {client_cert}: {exc}") from exc
    return ctx


def _of_request(tree: dict[str, Any], request_dn: str) -> list[dict[str, Any]]:
    """The processes of a listing that train the request ``request_dn``, in the listing's order."""
    return [p for p in tree.get("MLTrainingProcess", [])
            if request_dn in (p.get("attributes", {}).get("trainingRequestRef") or [])]


def vs_of(resource: dict[str, Any], cid: str) -> Any:
    """The ``vsData`` of container ``cid`` in a resource, or None."""
    for entry in resource.get("VsDataContainer") or []:
        if entry.get("id") == cid:
            return (entry.get("attributes") or {}).get("vsData")
    return None


@dataclass(frozen=True)
class MnSAddress:
    """Where a producer's resources are: the ProvMnS base URI (``…/ProvMnS/<version>``), the LDN of its
    ``MLTrainingFunction`` and of the SubNetwork above it, and the LDNs and URIs of what a consumer names."""

    url: str
    base: str
    function: str
    subnetwork: str

    @classmethod
    def parse(cls, url: str) -> MnSAddress:
        """The address of the ``MLTrainingFunction`` URI ``url`` (SluiceError if it is not one)."""
        url = url.rstrip("/")
        marker = url.find("/ProvMnS/")
        if marker < 0:
            raise SluiceError(f"{url} is not a ProvMnS URI (…/ProvMnS/<version>/SubNetwork=…/MLTrainingFunction=…)")
        rest = url[marker + len("/ProvMnS/"):]
        version, _, ldn = rest.partition("/")
        if not ldn or "MLTrainingFunction=" not in ldn.rpartition("/")[2]:
            raise SluiceError(f"{url} does not name an MLTrainingFunction (…/SubNetwork=SN1/MLTrainingFunction=TF1)")
        return cls(url, url[:marker] + "/ProvMnS/" + version, ldn, ldn.rpartition("/")[0])

    def uri(self, ldn: str) -> str:
        return f"{self.base}/{quote(ldn, safe='/=,:~.-_')}"

    def dn_uri(self, dn: str) -> str:
        """The URI a DN (``*Ref`` attribute) resolves to."""
        return self.uri(",".join(p.strip() for p in dn.split(",")).replace(",", "/"))

    def request_ldn(self, rid: str) -> str:
        return f"{self.function}/MLTrainingRequest={rid}"

    def request_dn(self, rid: str) -> str:
        return ",".join(self.request_ldn(rid).split("/"))

    def process_ldn(self, pid: str) -> str:
        return f"{self.function}/MLTrainingProcess={pid}"

    def subscription_ldn(self, sid: str) -> str:
        return f"{self.subnetwork}/NtfSubscriptionControl={sid}"


class ProvMnSClient:
    """One producer's ProvMnS interface (see the module docstring)."""

    def __init__(self, url: str, *, timeout: float = 30.0, client: httpx.Client | None = None,
                 token: str | None = None, ca_file: str | None = None,
                 client_cert: tuple[str, str | None] | None = None) -> None:
        """``token``: sent as ``Authorization: Bearer``; ``ca_file``/``client_cert``: see :func:`tls_context`
        (all three configure the client this builds; with ``client`` give none of them)."""
        if client is not None and (token or ca_file or client_cert):
            raise SluiceError("give either an httpx client or token/ca_file/client_cert, not both")
        self.at = MnSAddress.parse(url)
        self.url = self.at.url
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self.http = client or httpx.Client(timeout=timeout, trust_env=False, headers=headers,
                                           verify=tls_context(ca_file, client_cert))
        self.subscriptions = Subscriptions(self)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ProvMnSClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing
    def _send(self, method: str, url: str, what: str, **kw: Any) -> httpx.Response:
        try:
            resp = self.http.request(method, url, **kw)
        except httpx.HTTPError as exc:
            raise ProducerUnreachable(f"{what}: cannot reach {url}: {exc or type(exc).__name__}") from exc
        if resp.status_code >= 400:
            try:
                body = resp.json()
            except ValueError:
                body = resp.text
            raise MnSClientError(resp.status_code, body, what)
        return resp

    def get(self, ldn: str, **params: Any) -> dict[str, Any]:
        return self._send("GET", self.at.uri(ldn), f"GET {ldn}", params=params or None).json()

    def patch(self, ldn: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = self._send("PATCH", self.at.uri(ldn), f"PATCH {ldn}", json=body, headers={"Content-Type": MERGE})
        return resp.json() if resp.content else {}

    # ------------------------------------------------------------------ requests
    def create(self, doc: dict[str, Any], request_id: str | None = None) -> dict[str, Any]:
        """Create a request from a job document; PUT when it has an id, else POST (the producer names it)."""
        body = request_body(doc, request_id)
        if "id" in body:
            return self._send("PUT", self.at.uri(self.at.request_ldn(body["id"])), "create request", json=body).json()
        return self._send("POST", self.at.uri(self.at.function), "create request", json=body).json()

    def tree(self) -> dict[str, Any]:
        return self.get(self.at.function, scope='{"scopeType":"BASE_NTH_LEVEL","scopeLevel":1}')

    def requests(self) -> list[dict[str, Any]]:
        return list(self.tree().get("MLTrainingRequest", []))

    def request(self, rid: str) -> dict[str, Any]:
        return self.get(self.at.request_ldn(rid))

    def processes(self, rid: str, tree: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The request's training processes, oldest first (from ``tree``, a listing of the function, when
        given; else fetched by id, see :meth:`snapshot`)."""
        if tree is not None:
            return _of_request(tree, self.at.request_dn(rid))
        return self.snapshot(rid)[1]

    def snapshot(self, rid: str) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The request (None when the producer does not hold it) and its processes, oldest first, in one GET
        that asks for them by id: a Sluice producer names a request's processes ``<request id>-1``, ``-2``…
        (so what is fetched does not grow with the producer's other requests). Where no process answers to
        these names, the producer names them otherwise: every process is listed and filtered here."""
        dn = self.at.request_dn(rid)
        base = _UNSAFE_ID.sub("_", rid) or "_"
        req: dict[str, Any] | None = None
        found: list[dict[str, Any]] = []
        start = 1
        while True:
            names = [f"MLTrainingProcess={base}-{n}" for n in range(start, start + NAMED_BATCH)]
            if start == 1:
                names.insert(0, f"MLTrainingRequest={rid}")
            tree = self.get(self.at.function, scopeType="BASE_NTH_LEVEL", scopeLevel=1, filter="|".join(names))
            if start == 1:
                req = next(iter(tree.get("MLTrainingRequest") or []), None)
            got = tree.get("MLTrainingProcess") or []
            found += _of_request(tree, dn)
            if len(got) < NAMED_BATCH:  # the numbers run from 1 without a gap: this batch held the last one
                break
            start += NAMED_BATCH
        if req is not None and not found:
            found = _of_request(self.get(self.at.function, scopeType="BASE_NTH_LEVEL", scopeLevel=1,
                                         filter="MLTrainingProcess"), dn)
        return req, found

    def process(self, rid: str) -> dict[str, Any]:
        """The request's current (newest) training process."""
        procs = self.processes(rid)
        if not procs:
            raise SluiceError(f"request {rid} has no training process")
        return procs[-1]

    def modify(self, rid: str, *, termination: dict[str, Any] | None = None,
               requirements: dict[str, Any] | None = None, attributes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Change a request: termination parameters / requirements (merged in; a running process takes them at
        its next iteration) and 3GPP attributes."""
        vs = []
        if termination is not None:
            vs.append({"id": "sluice-termination", "attributes": {"vsData": termination}})
        if requirements is not None:
            vs.append({"id": "sluice-requirements", "attributes": {"vsData": requirements}})
        body: dict[str, Any] = {"attributes": attributes or {}}
        if vs:
            body["VsDataContainer"] = vs
        return self.patch(self.at.request_ldn(rid), body)

    def cancel(self, rid: str) -> dict[str, Any]:
        return self.patch(self.at.request_ldn(rid), {"attributes": {"cancelRequest": True}})

    def suspend(self, rid: str) -> dict[str, Any]:
        return self.patch(self.at.request_ldn(rid), {"attributes": {"suspendRequest": True}})

    def resume(self, rid: str) -> dict[str, Any]:
        return self.patch(self.at.request_ldn(rid), {"attributes": {"suspendRequest": False}})

    def delete(self, rid: str) -> None:
        self._send("DELETE", self.at.uri(self.at.request_ldn(rid)), f"delete request {rid}")

    def set_priority(self, rid: str, priority: int) -> dict[str, Any]:
        return self.patch(self.at.process_ldn(self.process(rid)["id"]), {"attributes": {"priority": int(priority)}})

    def accept(self, rid: str, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Answer the producer's proposal: accept it, or modify it with ``changes`` (merged into it)."""
        if changes:
            vs = [{"id": "sluice-termination", "attributes": {"vsData": changes}}]
        else:
            vs = [{"id": "sluice-negotiation", "attributes": {"vsData": {"accept": True}}}]
        return self.patch(self.at.process_ldn(self.process(rid)["id"]), {"VsDataContainer": vs})

    def upload(self, rid: str, X: Any, y: Any, client: int | None = None) -> dict[str, Any]:
        """Training data for the request's process (arrays or lists); an ended process retrains with it."""
        import numpy as np

        data: dict[str, Any] = {"X": np.asarray(X, dtype=float).tolist(), "y": np.asarray(y).tolist()}
        if client is not None:
            data["client"] = int(client)
        return self.patch(self.at.process_ldn(self.process(rid)["id"]), {"VsDataContainer": [{"id": "sluice-data",
                                                                       "attributes": {"vsData": data}}]})

    def feedback(self, rid: str, metric: str, value: float) -> dict[str, Any]:
        """Report how the model performs in use; the answer is the request's ``sluice-trigger``."""
        out = self.patch(self.at.request_ldn(rid), {"VsDataContainer": [
            {"id": "sluice-feedback", "attributes": {"vsData": {"metric": metric, "value": float(value)}}}]})
        return vs_of(out, "sluice-trigger") or {}

    def report(self, rid: str) -> dict[str, Any]:
        """The report of the request's current process (SluiceError when it has not ended)."""
        proc = self.process(rid)
        ref = proc["attributes"].get("trainingReportRef")
        if not ref:
            raise SluiceError(f"request {rid} has no report yet (its process is "
                              f"{proc['attributes']['progressStatus']['status']})")
        return self._send("GET", self.at.dn_uri(ref), f"GET {ref}").json()

    def model(self, rid: str) -> dict[str, Any]:
        rep = self.report(rid)
        ref = rep["attributes"].get("mLModelGeneratedRef")
        if not ref:
            raise SluiceError(f"request {rid} produced no model ({(vs_of(rep, 'sluice-report') or {}).get('cause')})")
        return self._send("GET", self.at.dn_uri(ref), f"GET {ref}").json()

    def download_model(self, rid: str, path: str | Path) -> Path:
        rep = self.report(rid)
        ref = rep["attributes"].get("mLModelGeneratedRef")
        if not ref:
            raise SluiceError(f"request {rid} produced no model")
        resp = self._send("GET", self.at.dn_uri(ref), "download model", headers={"Accept": "application/octet-stream"})
        p = Path(path)
        p.write_bytes(resp.content)
        return p

    def status(self, rid: str) -> tuple[str, dict[str, Any]]:
        """``(requestStatus, current process)``, in one GET (see :meth:`snapshot`)."""
        req, procs = self.snapshot(rid)
        if req is None:
            self.request(rid)  # the producer's own answer (404) says why
            raise SluiceError(f"request {rid} vanished")
        if not procs:
            raise SluiceError(f"request {rid} has no training process")
        return req["attributes"]["requestStatus"], procs[-1]

    def watch(self, rid: str, interval: float = 2.0, timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """The request's current process every ``interval`` seconds until the request ends (one GET each time,
        of the request and its processes only)."""
        t0 = time.monotonic()
        while True:
            status, proc = self.status(rid)
            yield proc
            if status in ENDED:
                return
            if timeout is not None and time.monotonic() - t0 > timeout:
                raise SluiceError(f"request {rid} did not end within {timeout:g} s (it is {status})")
            time.sleep(interval)

    def wait(self, rid: str, timeout: float = 600.0, interval: float = 1.0) -> dict[str, Any]:
        """Wait until the request ends; its current process."""
        last: dict[str, Any] = {}
        for snapshot in self.watch(rid, interval, timeout):
            last = snapshot
        return last



class Subscriptions:
    """A producer's notification subscriptions (``NtfSubscriptionControl`` under its SubNetwork)."""

    def __init__(self, client: ProvMnSClient) -> None:
        self.client = client

    def add(self, sid: str, address: str, types: list[str] | None = None,
            scope: dict[str, Any] | None = None, notification_filter: str | None = None) -> dict[str, Any]:
        """Subscribe ``address`` to the producer's notifications (by default of creations, attribute value
        changes and deletions), under the id ``sid``."""
        attrs: dict[str, Any] = {"notificationRecipientAddress": address,
                                 "notificationTypes": types or ["notifyMOICreation",
                                                                "notifyMOIAttributeValueChanges",
                                                                "notifyMOIDeletion"]}
        if scope is not None:
            attrs["scope"] = scope
        if notification_filter is not None:
            attrs["notificationFilter"] = notification_filter
        c = self.client
        return c._send("PUT", c.at.uri(c.at.subscription_ldn(sid)), "subscribe",
                       json={"id": sid, "attributes": attrs}).json()

    def remove(self, sid: str) -> None:
        c = self.client
        c._send("DELETE", c.at.uri(c.at.subscription_ldn(sid)), "unsubscribe")
