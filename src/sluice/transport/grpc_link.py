"""gRPC link: one bidirectional stream between a listening party and a connecting party.

No generated code: the service ``sluice.split.v1.Link`` has one method ``Exchange`` registered with a
generic handler, and messages cross as raw bytes (identity serialisers), so what is counted is exactly
what :mod:`sluice.wire.tensor` encoded. Optional mutual TLS: the listener presents its certificate
and, when a CA is given, requires a client certificate signed by it; the connecting side verifies the
listener against the same CA and presents its own certificate.

Failure handling: a broken stream (peer process died, connection reset) delivers a
:class:`~sluice.errors.TransportError` into the inbox at once; HTTP/2 keepalive pings detect a dead
host; a peer that is alive but silent is caught by the party's receive timeout.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from sluice.errors import ConfigError, TransportError

from .link import Link

SERVICE = "sluice.split.v1.Link"
METHOD = "Exchange"
FULL_METHOD = f"/{SERVICE}/{METHOD}"
MAX_MESSAGE_BYTES = 512 * 1024 * 1024

_COMMON_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
_SERVER_OPTIONS = _COMMON_OPTIONS + [
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.so_reuseport", 0),
]


@dataclass
class TlsFiles:
    """PEM files for (mutual) TLS. ``ca`` set on the listener means client certificates are required."""

    cert: str
    key: str
    ca: str | None = None
    server_name: str | None = None

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        out = []
        for label, path in (("certificate", self.cert), ("private key", self.key), ("CA", self.ca)):
            if path is None:
                out.append(None)
                continue
            p = Path(path)
            if not p.is_file():
                raise ConfigError(f"TLS {label} file not found: {p}")
            out.append(p.read_bytes())
        return out[0], out[1], out[2]  # type: ignore[return-value]


class GrpcLink(Link):
    """One end of a gRPC stream (either side)."""

    def __init__(self, name: str, secure: bool) -> None:
        super().__init__(name)
        self.secure = secure
        self._out: queue.Queue[bytes | None] = queue.Queue()
        self._pending = 0
        self._plock = threading.Lock()
        self._done = threading.Event()

    def send(self, payload: bytes) -> None:
        if self._closed:
            raise TransportError(f"{self.name}: cannot send on a closed link")
        if self._done.is_set():  # say why the stream ended when the peer said so
            raise self._failure or TransportError(f"{self.name}: the stream to {self._peer} has ended")
        with self._plock:
            self._pending += len(payload)
        self._out.put(payload)

    def pending_bytes(self) -> int:
        with self._plock:
            return self._pending

    def _outgoing(self) -> Iterator[bytes]:
        """Messages for gRPC to write; a message leaves the send queue when gRPC takes it."""
        while True:
            try:
                item = self._out.get(timeout=0.2)
            except queue.Empty:
                if self._done.is_set():
                    return
                continue
            if item is None:
                return
            with self._plock:
                self._pending -= len(item)
            self._count_sent(len(item))
            yield item

    def _read(self, incoming: Iterator[bytes], what: str) -> None:
        try:
            for payload in incoming:
                self._deliver(payload)
            if not self._closed:
                self._fail("the peer closed the stream")
        except grpc.RpcError as exc:
            if not self._closed:
                code = exc.code() if hasattr(exc, "code") else None
                detail = exc.details() if hasattr(exc, "details") else str(exc)
                self._fail(f"{what} failed ({code}: {detail})")
        except Exception as exc:  # noqa: BLE001 - any failure of the stream ends the link
            if not self._closed:
                self._fail(f"{what} failed: {exc!r}")
        finally:
            self._done.set()

    def close(self) -> None:
        """Finish the stream after the queued messages are written."""
        if self._closed:
            return
        self._closed = True
        self._out.put(None)


class GrpcListener:
    """A gRPC server that accepts one stream at a time; :meth:`accept` returns it as a :class:`GrpcLink`."""

    def __init__(self, address: str = "127.0.0.1:0", tls: TlsFiles | None = None, name: str = "server"):
        self.name = name
        self._links: queue.Queue[GrpcLink] = queue.Queue()
        self._busy = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=_SERVER_OPTIONS)
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                METHOD: grpc.stream_stream_rpc_method_handler(
                    self._exchange, request_deserializer=None, response_serializer=None
                )
            },
        )
        self._server.add_generic_rpc_handlers((handler,))
        self.tls = tls
        try:
            if tls is None:
                port = self._server.add_insecure_port(address)
            else:
                cert, key, ca = tls.read()
                creds = grpc.ssl_server_credentials(
                    [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
                )
                port = self._server.add_secure_port(address, creds)
        except RuntimeError as exc:
            raise TransportError(f"cannot listen on {address}: {exc}") from exc
        if not port:
            raise TransportError(f"cannot listen on {address}: the address is in use or not local")
        host = address.rsplit(":", 1)[0]
        self.address = f"{host}:{port}"
        self.port = port
        self._server.start()

    def _exchange(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        if not self._busy.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "this party already serves a task")
        try:
            ctx = context.auth_context() or {}
            secure = ctx.get("transport_security_type") == [b"ssl"]
            link = GrpcLink(f"{self.name}<-{context.peer()}", secure)
            reader = threading.Thread(
                target=link._read, args=(request_iterator, "the stream from the peer"), daemon=True
            )
            context.add_callback(lambda: link._done.set())
            reader.start()
            self._links.put(link)
            yield from link._outgoing()
            # keep the stream open until the peer has finished sending (or left)
            while not link._done.is_set() and context.is_active():
                time.sleep(0.05)
        finally:
            self._busy.release()

    def accept(self, timeout: float) -> GrpcLink:
        """Wait for a peer to open the stream; raises :class:`TransportError` after ``timeout`` seconds."""
        try:
            return self._links.get(timeout=timeout)
        except queue.Empty:
            raise TransportError(
                f"no peer connected to {self.address} within {timeout:g} s"
            ) from None

    def close(self, grace: float = 1.0) -> None:
        self._server.stop(grace).wait(grace + 1.0)


class _ClientLink(GrpcLink):
    def __init__(self, name: str, secure: bool, channel: grpc.Channel) -> None:
        super().__init__(name, secure)
        self._channel = channel
        self._call = None

    def close(self) -> None:
        if self._closed:
            return
        super().close()

        def _finish() -> None:
            self._done.wait(5.0)
            if self._call is not None and not self._done.is_set():
                self._call.cancel()
            self._channel.close()

        threading.Thread(target=_finish, daemon=True).start()

    def abort(self) -> None:
        """Tear the stream down at once (used on errors)."""
        self._closed = True
        self._out.put(None)
        if self._call is not None:
            self._call.cancel()
        self._channel.close()


def connect(address: str, timeout: float, tls: TlsFiles | None = None, name: str = "client") -> GrpcLink:
    """Open the stream to a :class:`GrpcListener`; raises :class:`TransportError` if it cannot within
    ``timeout`` seconds."""
    options = list(_COMMON_OPTIONS)
    if tls is None:
        channel = grpc.insecure_channel(address, options=options)
    else:
        cert, key, ca = tls.read()
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
        channel = grpc.secure_channel(address, creds, options=options)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        channel.close()
        hint = " (check the TLS files and server name)" if tls is not None else ""
        raise TransportError(
            f"could not connect to {address} within {timeout:g} s: is the other party listening there?{hint}"
        ) from None
    link = _ClientLink(f"{name}->{address}", tls is not None, channel)
    stub = channel.stream_stream(FULL_METHOD, request_serializer=None, response_deserializer=None)
    call = stub(link._outgoing(), wait_for_ready=False)
    link._call = call
    threading.Thread(target=link._read, args=(call, f"the stream to {address}"), daemon=True).start()
    return link
