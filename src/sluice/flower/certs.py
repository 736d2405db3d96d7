"""Certificates for a Flower deployment: a CA, and a server certificate for the SuperLink signed by it.

The SuperLink serves TLS with ``server.pem`` / ``server.key`` and names the CA with ``ca.pem``; every
SuperNode and the ``flwr`` command verify the SuperLink against ``ca.pem`` (``--root-certificates``). TLS
authenticates the SuperLink only: nodes are told apart by their node configuration, not by certificates.
Keys are EC P-256, certificates are valid for ``days`` days and name every host the SuperLink is reached
at (IP addresses as IP subject alternative names, other names as DNS names).

:func:`make_client_certificate` signs a client certificate with the same CA, for services that ask their
callers for one (``sluice serve --tls-client-ca ca.pem``: mutual TLS).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import ConfigError

CA_CERT, SERVER_CERT, SERVER_KEY = "ca.pem", "server.pem", "server.key"


@dataclass(frozen=True)
class CertFiles:
    """Where :func:`make_certificates` put the files."""

    ca: Path
    cert: Path
    key: Path


def _san(host: str):  # noqa: ANN202 - a cryptography GeneralName
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        if not host or any(c.isspace() for c in host):
            raise ConfigError(f"not a host name or IP address: {host!r}") from None
        return x509.DNSName(host)


def make_certificates(out: str | Path, hosts: list[str] | tuple[str, ...] = ("127.0.0.1", "localhost"),
                      *, days: int = 365, overwrite: bool = False) -> CertFiles:
    """Write ``ca.pem`` (with its key ``ca.key``), ``server.pem`` and ``server.key`` into ``out``.

    ``hosts`` are the addresses the SuperLink is reached at; a node that connects through another name
    fails the TLS check. Existing files are kept unless ``overwrite``: a deployment's nodes must keep
    trusting the CA they were given.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not hosts:
        raise ConfigError("name at least one host the SuperLink is reached at")
    out = Path(out)
    files = CertFiles(out / CA_CERT, out / SERVER_CERT, out / SERVER_KEY)
    if not overwrite and all(p.exists() for p in (files.ca, files.cert, files.key)):
        return files
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Sluice deployment CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False),
                         critical=True)
          .sign(ca_key, hashes.SHA256()))

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(until)
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))

    pem = serialization.Encoding.PEM
    plain = serialization.NoEncryption()
    private = serialization.PrivateFormat.PKCS8
    _write(out / "ca.key", ca_key.private_bytes(pem, private, plain), secret=True)
    _write(files.ca, ca.public_bytes(pem))
    _write(files.key, key.private_bytes(pem, private, plain), secret=True)
    _write(files.cert, cert.public_bytes(pem))
    return files


def _write(path: Path, data: bytes, *, secret: bool = False) -> None:
    """Replace ``path`` by ``data`` atomically (a new file renamed over it); ``secret``: owner-only mode 0600."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)  # with O_EXCL below a leftover file (or a link) is never reused with its mode
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if secret else 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def make_client_certificate(out: str | Path, name: str, *, days: int = 365) -> CertFiles:
    """Write ``<name>.pem`` and ``<name>.key`` into ``out``: a client certificate (common name ``name``,
    extended key usage client authentication) signed by the CA that :func:`make_certificates` put there."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(out)
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise ConfigError(f"a client name is letters, digits and -_. only, got {name!r}")
    try:
        ca = x509.load_pem_x509_certificate((out / CA_CERT).read_bytes())
        ca_key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"no usable CA in {out} (make one with make_certificates): {exc}") from exc
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    files = CertFiles(out / CA_CERT, out / f"{name}.pem", out / f"{name}.key")
    _write(files.key, key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
           secret=True)
    _write(files.cert, cert.public_bytes(pem))
    return files
