"""Certificates for a Flower deployment: the SuperLink's certificate is signed by the CA and names its hosts."""

from __future__ import annotations

import ipaddress
import ssl
import stat

import pytest
from cryptography import x509

from sluice.cli import main
from sluice.errors import ConfigError
from sluice.runtimes.flower.certs import make_certificates


def test_certificate_is_signed_by_the_ca_and_names_the_hosts(tmp_path) -> None:
    files = make_certificates(tmp_path, ["10.1.2.3", "link.example.org"])
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    cert.verify_directly_issued_by(ca)  # raises when the signature or issuer is wrong
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.1.2.3")]
    assert san.get_values_for_type(x509.DNSName) == ["link.example.org"]
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    # a TLS server can load the pair, a client can trust the CA
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(files.cert, files.key)
    ssl.create_default_context(cafile=str(files.ca))


def test_existing_files_are_kept_unless_forced(tmp_path) -> None:
    first = make_certificates(tmp_path).ca.read_bytes()
    assert make_certificates(tmp_path).ca.read_bytes() == first
    assert make_certificates(tmp_path, overwrite=True).ca.read_bytes() != first


def test_bad_host_and_cli(tmp_path) -> None:
    with pytest.raises(ConfigError):
        make_certificates(tmp_path / "x", ["bad host"])
    assert main(["certs", str(tmp_path / "c"), "--host", "127.0.0.1"]) == 0
    assert (tmp_path / "c" / "server.pem").exists()
