"""Request-body limits of the service, as a pure ASGI middleware (:class:`BodyLimit`).

Every request body is held to a byte limit before the application sees it:

* ``max_upload_bytes`` for training-data uploads — ``PATCH`` or ``PUT`` of an ``MLTrainingProcess``, the
  only operations that carry a ``sluice-data`` VsDataContainer;
* ``max_body_bytes`` for every other request.

A body whose ``Content-Length`` exceeds the limit is answered at once with **413** (RFC 9110 §15.5.14):
the body is never read. A body without a length (``Transfer-Encoding: chunked``) is counted as it streams
and refused with 413 as soon as the count crosses the limit; what came before was handed on chunk by chunk
and is dropped with the request, so the service never holds more than ``limit`` bytes of one body.

Content codings (RFC 9110 §8.4.1): ``gzip`` (RFC 1952, several members allowed) and ``deflate`` (the zlib
format of RFC 1950) are decoded as the body streams, with the decoded bytes held to the same limit — a
body that expands beyond it (a compression bomb) is refused with **400** as soon as the decoder has
produced ``limit + 1`` bytes, and so is one that is not valid in its coding. Any other coding is **415**.
The application sees the decoded body, without ``Content-Encoding`` and ``Content-Length``.

Refusals carry the 3GPP error body of the method (:func:`sluice.service.nrm.error_body`, ``type``
``SERVER_LIMITATION`` for 413) and ``Connection: close``, so that the rest of a refused body is not read.
A refusal raised while the application reads the body reaches the application's own :class:`MnSError`
handler; the middleware answers itself only when nothing else has.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from sluice.service.nrm import MnSError, error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UPLOAD_CLASS = "MLTrainingProcess"
UPLOAD_METHODS = ("PATCH", "PUT")
CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None


class _Decoder:
    """Streaming decoder of one content coding whose output may not exceed ``limit`` bytes in all."""

    def __init__(self, coding: str, limit: int) -> None:
        self.coding, self.wbits, self.room = coding, CODINGS[coding], limit
        self.limit = limit
        self._z = zlib.decompressobj(self.wbits)

    def _bad(self, why: str) -> MnSError:
        return MnSError(400, f"the body is not valid {self.coding} content: {why}", bad_attributes=["Content-Encoding"])

    def feed(self, data: bytes) -> bytes:
        """Decoded bytes of ``data``; MnSError(400) once the output would exceed the limit."""
        out = bytearray()
        while True:
            try:
                chunk = self._z.decompress(data, self.room + 1)
            except zlib.error as exc:
                raise self._bad(str(exc)) from exc
            self.room -= len(chunk)
            if self.room < 0:  # the decoder stopped at limit + 1 bytes: the rest is never inflated
                raise MnSError(400, f"the {self.coding} body expands beyond {self.limit} bytes",
                               bad_attributes=["Content-Encoding"])
            out += chunk
            # with room left all input was consumed; what follows the end of a gzip member is the next member
            if not (self._z.eof and self._z.unused_data):
                return bytes(out)
            if self.coding == "deflate":
                raise self._bad("data after the end of the stream")
            data = self._z.unused_data
            self._z = zlib.decompressobj(self.wbits)

    def finish(self) -> None:
        """MnSError(400) when the stream stopped in the middle."""
        if not self._z.eof:
            raise self._bad("the stream is truncated")


class BodyLimit:
    """ASGI middleware enforcing the body limits of :class:`sluice.service.config.ServiceConfig` (see the
    module docstring). ``base_path`` is ``{MnSRoot}/ProvMnS/{MnSVersion}``: uploads are under it."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, max_upload_bytes: int, base_path: str) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes
        self.base_path = base_path.rstrip("/") + "/"

    def limit_for(self, method: str, path: str) -> int:
        """The byte limit of a request: the upload limit for PATCH/PUT of an ``MLTrainingProcess``."""
        if method in UPLOAD_METHODS and path.startswith(self.base_path):
            last = path.rstrip("/").rpartition("/")[2]
            if last.partition("=")[0] == UPLOAD_CLASS:
                return self.max_upload_bytes
        return self.max_body_bytes

    async def _refuse(self, send: Send, method: str, err: MnSError) -> None:
        body = json.dumps(error_body(err, method)).encode()
        await send({"type": "http.response.start", "status": err.status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "GET").upper()
        limit = self.limit_for(method, scope.get("path", ""))
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(send, method, MnSError(
                413, f"the body has {int(declared)} bytes; at most {limit} are taken here", bad_attributes=["body"]))
            return
        coding = (_header(scope, b"content-encoding") or "identity").lower()
        if coding not in CODINGS and coding != "identity":
            await self._refuse(send, method, MnSError(
                415, f"content coding {coding!r} is not supported; send identity, gzip or deflate",
                bad_attributes=["Content-Encoding"]))
            return
        decoder = _Decoder(coding, limit) if coding in CODINGS else None
        if decoder is not None:
            drop = (b"content-encoding", b"content-length")
            scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers", []) if k.lower() not in drop]}
        state = {"received": 0, "refused": False, "started": False}

        async def limited_receive() -> Message:
            message = await receive()
            if message["type"] != "http.request":
                return message
            chunk = message.get("body", b"")
            state["received"] += len(chunk)
            try:
                if state["received"] > limit:
                    raise MnSError(413, f"the body exceeds {limit} bytes; the rest was not read",
                                   bad_attributes=["body"])
                if decoder is not None:
                    chunk = decoder.feed(chunk)
                    if not message.get("more_body", False):
                        decoder.finish()
            except MnSError:
                state["refused"] = True
                raise
            return {**message, "body": chunk}

        async def closing_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["started"] = True
                if state["refused"]:
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, limited_receive, closing_send)
        except MnSError as err:
            if not state["refused"] or state["started"]:
                raise
            await self._refuse(send, method, err)
