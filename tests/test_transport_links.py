"""Links: emulated bandwidth/latency (token bucket, full duplex), gRPC streams, byte meters, failures."""

from __future__ import annotations

import datetime
import ipaddress
import threading
import time

import pytest

from sluice.errors import ConfigError, TransportError
from sluice.transport.emulated import emulated_pair
from sluice.transport.grpc_link import GrpcListener, TlsFiles, connect
from sluice.transport.link import Inbox

# -- emulated link ---------------------------------------------------------------------------------


def test_bandwidth_is_enforced_per_direction():
    a, b = emulated_pair(20e6, 0.0, burst_bytes=16 * 1024)  # 2.5 MB/s
    t0 = time.perf_counter()
    for _ in range(10):
        a.send(bytes(25_000))
    assert a.pending_bytes() > 0
    for _ in range(10):
        b.recv(5)
    dt = time.perf_counter() - t0
    ideal = (250_000 - 16 * 1024) / 2.5e6  # the full bucket lets the first 16 KB through at once
    assert ideal * 0.97 < dt < ideal + 0.4
    assert a.pending_bytes() == 0
    assert a.stats.bytes_sent == b.stats.bytes_received == 250_000
    assert a.stats.messages_sent == b.stats.messages_received == 10


def test_full_duplex_and_latency():
    a, b = emulated_pair(8e6, 0.02, burst_bytes=1000)  # 1 MB/s each way
    t0 = time.perf_counter()
    for _ in range(4):
        a.send(bytes(25_000))
        b.send(bytes(25_000))
    for _ in range(4):
        b.recv(5)
        a.recv(5)
    dt = time.perf_counter() - t0
    one_way = (100_000 - 1000) / 1e6 + 0.02
    # both directions at once take as long as one (sharing one wire would take 0.2 s)
    assert one_way * 0.97 < dt < one_way * 1.6


def test_latency_delays_small_messages_and_order_is_kept():
    a, b = emulated_pair(None, 0.05)
    t0 = time.perf_counter()
    for i in range(5):
        a.send(bytes([i]))
    got = [b.recv(5) for _ in range(5)]
    assert time.perf_counter() - t0 >= 0.049
    assert got == [bytes([i]) for i in range(5)]


def test_close_delivers_queued_data_then_reports_the_close():
    a, b = emulated_pair(50e6, 0.0)
    a.send(b"last words")
    a.close()
    assert b.recv(2) == b"last words"
    with pytest.raises(TransportError, match="closed"):
        b.recv(2)
    with pytest.raises(TransportError):
        a.send(b"more")


def test_broken_link_fails_both_ends_at_once():
    a, b = emulated_pair(1e6, 0.0)
    a.send(bytes(100_000))  # would take 0.8 s
    t0 = time.perf_counter()
    a.break_("peer crashed")
    with pytest.raises(TransportError, match="crashed"):
        b.recv(5)
    with pytest.raises(TransportError, match="crashed"):
        a.recv(5)
    assert time.perf_counter() - t0 < 0.5


def test_silent_peer_times_out_with_a_clear_message():
    a, b = emulated_pair()
    with pytest.raises(TransportError, match="stalled or died"):
        b.recv(0.1)


def test_attached_links_share_one_inbox():
    a1, b1 = emulated_pair(names=("x", "p1"))
    a2, b2 = emulated_pair(names=("x", "p2"))
    b1.send(b"early")  # arrives before attach: must not be lost
    time.sleep(0.05)
    box = Inbox()
    a1.attach(box, "p1")
    a2.attach(box, "p2")
    b2.send(b"two")
    got = {box.get(2).peer for _ in range(2)}
    assert got == {"p1", "p2"}


def test_invalid_emulation_settings():
    with pytest.raises(ConfigError):
        emulated_pair(-1.0)
    with pytest.raises(ConfigError):
        emulated_pair(None, -0.1)


# -- gRPC ------------------------------------------------------------------------------------------


@pytest.fixture
def grpc_pair():
    lis = GrpcListener("127.0.0.1:0")
    client = connect(lis.address, 5.0)
    client.send(b"hello")
    server = lis.accept(5.0)
    yield lis, client, server
    client.close()
    server.close()
    lis.close(0.2)


def test_grpc_round_trip_counts_bytes(grpc_pair):
    lis, client, server = grpc_pair
    assert lis.address.startswith("127.0.0.1:")
    assert server.recv(5) == b"hello"
    payloads = [bytes([i]) * (1000 * i + 1) for i in range(20)]
    for p in payloads:
        server.send(p)
    got = [client.recv(5) for _ in payloads]
    assert got == payloads
    assert server.stats.bytes_sent == client.stats.bytes_received == sum(map(len, payloads))
    assert client.stats.bytes_sent == server.stats.bytes_received == 5
    assert not client.secure and not server.secure


def test_grpc_peer_death_is_reported_quickly(grpc_pair):
    lis, client, server = grpc_pair
    server.recv(5)
    lis._server.stop(0)  # the listening process goes away
    t0 = time.perf_counter()
    with pytest.raises(TransportError, match="failed|closed"):
        client.recv(10)
    assert time.perf_counter() - t0 < 5


def test_grpc_client_abort_is_reported_to_the_server(grpc_pair):
    lis, client, server = grpc_pair
    server.recv(5)
    client.abort()
    with pytest.raises(TransportError, match="failed|closed"):
        server.recv(10)


def test_grpc_second_leader_is_refused(grpc_pair):
    lis, client, server = grpc_pair
    other = connect(lis.address, 5.0)
    with pytest.raises(TransportError, match="already serves"):  # from send when the refusal came first
        other.send(b"me too")
        other.recv(5)
    other.close()


def test_grpc_nobody_listening():
    lis = GrpcListener("127.0.0.1:0")
    addr = lis.address
    lis.close(0)
    t0 = time.perf_counter()
    with pytest.raises(TransportError, match="could not connect"):
        connect(addr, 0.5)
    assert time.perf_counter() - t0 < 3


def test_grpc_listen_only_where_allowed():
    with pytest.raises(TransportError):
        GrpcListener("192.0.2.1:0")  # not an address of this host


def _make_certs(tmp_path):
    crypto = pytest.importorskip(
        "cryptography",
        reason="the 'cryptography' package is not installed in this environment, so no test certificates "
        "can be generated; mutual TLS is not tested here",
    )
    del crypto
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder().subject_name(name("sluice test ca")).issuer_name(name("sluice test ca"))
        .public_key(ca_key.public_key()).serial_number(1).not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    files = {"ca": tmp_path / "ca.pem"}
    files["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for i, who in enumerate(("server", "client")):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder().subject_name(name(f"sluice {who}")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(10 + i).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
            ]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        files[f"{who}.pem"] = tmp_path / f"{who}.pem"
        files[f"{who}.key"] = tmp_path / f"{who}.key"
        files[f"{who}.pem"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[f"{who}.key"].write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return {k: str(v) for k, v in files.items()}


def test_grpc_mutual_tls(tmp_path):
    f = _make_certs(tmp_path)
    lis = GrpcListener("127.0.0.1:0", TlsFiles(f["server.pem"], f["server.key"], f["ca"]))
    try:
        c = connect(lis.address, 5.0, TlsFiles(f["client.pem"], f["client.key"], f["ca"]))
        c.send(b"secret")
        s = lis.accept(5.0)
        assert s.recv(5) == b"secret" and s.secure and c.secure
        c.close()
        s.close()
        # a client without a certificate cannot connect
        with pytest.raises(TransportError):
            connect(lis.address, 1.0, None)
    finally:
        lis.close(0.2)


def test_missing_tls_files_are_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        GrpcListener("127.0.0.1:0", TlsFiles(str(tmp_path / "nope.pem"), str(tmp_path / "nope.key")))


def test_grpc_large_messages_in_both_directions(grpc_pair):
    lis, client, server = grpc_pair
    server.recv(5)
    big = bytes(6 << 20)  # above gRPC's 4 MB default limit

    def pump() -> None:
        client.send(big)

    th = threading.Thread(target=pump)
    th.start()
    server.send(big)
    assert len(server.recv(10)) == len(big)
    assert len(client.recv(10)) == len(big)
    th.join()
