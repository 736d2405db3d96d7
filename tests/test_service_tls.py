"""TLS of ``sluice serve`` with a CA made by the test: HTTPS verified against the CA (and refused without
it), notifications to an HTTPS recipient verified with ``notify_ca_file``, mutual TLS (no client
certificate: no connection), and the refusal to listen on a non-loopback address without TLS and
authentication."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest

from sluice.cli import main
from sluice.errors import SluiceError
from sluice.runtimes.flower.certs import CertFiles, make_certificates, make_client_certificate
from sluice.service.auth import AuthConfig
from sluice.service.client import ProvMnSClient, tls_context
from sluice.service.config import ServiceConfig, TLSConfig
from test_service_support import BASE, TF, Receiver, request_body, running_server


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[CertFiles, CertFiles]:
    out = tmp_path_factory.mktemp("pki")
    return make_certificates(out, ["127.0.0.1", "localhost"]), make_client_certificate(out, "alice")


def test_https_with_the_test_ca(tmp_path: Path, pki: tuple[CertFiles, CertFiles],
                                capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = pki
    ca = str(server.ca)
    extra = ("--tls-cert", str(server.cert), "--tls-key", str(server.key), "--set", f"notify_ca_file={ca!r}")
    with running_server(tmp_path, extra=extra, tls=tls_context(ca)) as srv:
        url = f"{srv.root}{BASE}/{TF}"
        assert url.startswith("https://")
        with ProvMnSClient(url, ca_file=ca) as c:
            assert c.tree()["id"] == "TF1"
        with ProvMnSClient(url) as c, pytest.raises(SluiceError, match="CERTIFICATE_VERIFY_FAILED"):
            c.tree()  # the system's CAs do not know the test CA
        with pytest.raises(httpx.TransportError):
            httpx.get(url.replace("https://", "http://"), trust_env=False)  # no plain HTTP on the TLS port
        assert main(["consumer", "--producer", url, "--ca-file", ca, "list"]) == 0
        assert "Training requests" in capsys.readouterr().out

        recv_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        recv_ctx.load_cert_chain(server.cert, server.key)
        recv = Receiver(recv_ctx)
        try:
            with ProvMnSClient(url, ca_file=ca) as c:
                c.subscriptions.add("S-tls", recv.url)
                assert recv.url.startswith("https://")
                body = request_body("Rt", attributes={"suspendRequest": True})
                c.http.put(c.at.uri(c.at.request_ldn("Rt")), json=body)
                recv.wait(lambda n: n["notificationType"] == "notifyMOICreation"
                          and n["href"].endswith("MLTrainingRequest=Rt"))
                assert recv.got[0]["href"].startswith("https://127.0.0.1:")
                c.subscriptions.remove("S-tls")
        finally:
            recv.close()


def test_mutual_tls_needs_a_client_certificate(tmp_path: Path, pki: tuple[CertFiles, CertFiles]) -> None:
    server, client = pki
    ca = str(server.ca)
    cert = (str(client.cert), str(client.key))
    extra = ("--tls-cert", str(server.cert), "--tls-key", str(server.key), "--tls-client-ca", ca)
    with running_server(tmp_path, extra=extra, tls=tls_context(ca, cert)) as srv:
        url = f"{srv.root}{BASE}/{TF}"
        with ProvMnSClient(url, ca_file=ca, client_cert=cert) as c:
            assert c.tree()["id"] == "TF1"
        with ProvMnSClient(url, ca_file=ca) as c, pytest.raises(SluiceError, match="cannot reach"):
            c.tree()
        assert main(["consumer", "--producer", url, "--ca-file", ca, "--client-cert", cert[0],
                     "--client-key", cert[1], "list"]) == 0


def test_no_public_address_without_tls_and_authentication(tmp_path: Path, pki: tuple[CertFiles, CertFiles],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    server, _ = pki
    db = f"sqlite:///{tmp_path / 'never.db'}"
    assert main(["serve", "--host", "0.0.0.0", "--port", "0", "--database", db]) == 2
    err = capsys.readouterr().err
    assert "refusing to listen on 0.0.0.0" in err and "--insecure" in err
    assert main(["serve", "--host", "0.0.0.0", "--port", "0", "--database", db, "--tls-cert", str(server.cert),
                 "--tls-key", str(server.key)]) == 2  # TLS alone: anyone could still call it
    assert "authentication" in capsys.readouterr().err
    assert not (tmp_path / "never.db").exists()  # refused before anything was opened

    tls = TLSConfig(cert=str(server.cert), key=str(server.key))
    assert ServiceConfig(host="0.0.0.0", insecure=True).exposure_problem() is None
    assert ServiceConfig(host="0.0.0.0", tls=tls, auth=AuthConfig(tokens_file="t.toml")).exposure_problem() is None
    assert ServiceConfig(host="10.1.2.3", tls=tls.model_copy(update={"client_ca": str(server.ca)})
                         ).exposure_problem() is None
    for host in ("127.0.0.1", "127.8.0.1", "::1", "localhost"):
        assert ServiceConfig(host=host).exposure_problem() is None
    assert "TLS" in (ServiceConfig(host="192.168.1.5", auth=AuthConfig(tokens_file="t.toml")).exposure_problem()
                     or "")


def test_tls_files_must_exist_and_go_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'never.db'}"
    assert main(["serve", "--port", "0", "--database", db, "--tls-cert", str(tmp_path / "no.pem")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["serve", "--port", "0", "--database", db, "--tls-client-ca", str(tmp_path / "ca.pem")]) == 2
    assert "need tls.cert" in capsys.readouterr().err
    assert main(["serve", "--port", "0", "--database", db, "--tokens-file", str(tmp_path / "none.toml")]) == 2
    assert "tokens file not found" in capsys.readouterr().err
    assert not (tmp_path / "never.db").exists()
