"""Certificates for a Flower deployment: a CA, and a server certificate for the SuperLink signed by it.

The SuperLink serves TLS with ``server.pem`` / ``server.key`` and names the CA with ``ca.pem``; every
SuperNode and the ``flwr`` command verify the SuperLink against ``ca.pem`` (``--root-certificates``). TLS
authenticates the SuperLink only: nodes are told apart by their node configuration, not by certificates.
Keys are EC P-256, certificates are valid for ``days`` days and name every host the SuperLink is reached
at (IP addresses as IP subject alternative names, other names as DNS names).

:func:`make_client_certificate` signs a client certificate with the same CA, for services that ask their
callers for one (``sluice serve --tls-client-ca ca.pem``: mutual TLS).

:func:`make_split_certificates` makes what the parties of split training across hosts need for mutual TLS
(``sluice split party``, ``[transport.tls]``): a server certificate for each follower, which listens, naming
the addresses the leader reaches it at, and a client certificate for the leader, which connects, all signed
by one CA; each party's files go into a folder of their own, to be copied to that party's host.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from sluice.errors import ConfigError
from sluice.files import atomic_write

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


def _new_ca(now: dt.datetime, until: dt.datetime):  # noqa: ANN202 - (certificate, private key)
    """A self-signed CA (EC P-256) that signs certificates only, not intermediate CAs."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

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
    return ca, ca_key


def _leaf(ca, ca_key, common_name: str, now: dt.datetime, until: dt.datetime, *,  # noqa: ANN001, ANN202
          server_hosts: list[str] | tuple[str, ...] | None = None):
    """(key, certificate) signed by the CA: a server certificate naming ``server_hosts`` (extended key usage
    server authentication), or without them a client certificate (client authentication)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                                                     common_name)]))
               .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(until))
    if server_hosts is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName([_san(h) for h in server_hosts]),
                                        critical=False)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server_hosts is not None else ExtendedKeyUsageOID.CLIENT_AUTH
    cert = (builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return key, cert


def make_certificates(out: str | Path, hosts: list[str] | tuple[str, ...] = ("127.0.0.1", "localhost"),
                      *, days: int = 365, overwrite: bool = False) -> CertFiles:
    """Write ``ca.pem`` (with its key ``ca.key``), ``server.pem`` and ``server.key`` into ``out``.

    ``hosts`` are the addresses the SuperLink is reached at; a node that connects through another name
    fails the TLS check. Existing files are kept unless ``overwrite``: a deployment's nodes must keep
    trusting the CA they were given. A kept server certificate that does not name every one of ``hosts`` is
    replaced by one that does, signed by the same CA.
    """
    from cryptography.hazmat.primitives import serialization

    if not hosts:
        raise ConfigError("name at least one host the SuperLink is reached at")
    for h in hosts:
        _san(h)
    out = Path(out)
    files = CertFiles(out / CA_CERT, out / SERVER_CERT, out / SERVER_KEY)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)
    if not overwrite and all(p.exists() for p in (files.ca, files.cert, files.key)):
        if set(map(_san, hosts)) <= _names(files.cert):
            return files
        ca, ca_key = _load_ca(out)  # new names, same CA: the nodes keep trusting it
        key, cert = _leaf(ca, ca_key, hosts[0], now, until, server_hosts=hosts)
        _write_pair(files, key, cert)
        return files
    out.mkdir(parents=True, exist_ok=True)

    ca, ca_key = _new_ca(now, until)
    key, cert = _leaf(ca, ca_key, hosts[0], now, until, server_hosts=hosts)

    pem = serialization.Encoding.PEM
    plain = serialization.NoEncryption()
    private = serialization.PrivateFormat.PKCS8
    atomic_write(out / "ca.key", ca_key.private_bytes(pem, private, plain), secret=True)
    atomic_write(files.ca, ca.public_bytes(pem))
    atomic_write(files.key, key.private_bytes(pem, private, plain), secret=True)
    atomic_write(files.cert, cert.public_bytes(pem))
    return files


def _names(cert_path: Path) -> set:
    """The subject alternative names of a certificate (empty when it cannot be read)."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        return set(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)
    except (OSError, ValueError, x509.ExtensionNotFound):
        return set()


def _name(name: str, what: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name):
        raise ConfigError(f"a {what} name is letters, digits and -_. only, got {name!r}")
    return name


def _load_ca(out: Path):  # noqa: ANN202 - (certificate, private key)
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        ca = x509.load_pem_x509_certificate((out / CA_CERT).read_bytes())
        ca_key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"no usable CA in {out} (make one with make_certificates): {exc}") from exc
    return ca, ca_key


def _write_pair(files: CertFiles, key, cert) -> None:  # noqa: ANN001
    from cryptography.hazmat.primitives import serialization

    pem = serialization.Encoding.PEM
    atomic_write(files.key, key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
                 secret=True)
    atomic_write(files.cert, cert.public_bytes(pem))


def make_client_certificate(out: str | Path, name: str, *, days: int = 365) -> CertFiles:
    """Write ``<name>.pem`` and ``<name>.key`` into ``out``: a client certificate (common name ``name``,
    extended key usage client authentication) signed by the CA that :func:`make_certificates` put there."""
    out = Path(out)
    _name(name, "client")
    ca, ca_key = _load_ca(out)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    key, cert = _leaf(ca, ca_key, name, now, now + dt.timedelta(days=days))
    files = CertFiles(out / CA_CERT, out / f"{name}.pem", out / f"{name}.key")
    _write_pair(files, key, cert)
    return files


@dataclass(frozen=True)
class PartyCerts:
    """One party's files from :func:`make_split_certificates`: everything in ``folder`` goes to its host."""

    name: str
    role: str  # "follower" (server certificate) or "leader" (client certificate)
    folder: Path
    files: CertFiles
    hosts: tuple[str, ...] = ()


def make_split_certificates(out: str | Path, followers: dict[str, list[str]], leader: str = "leader", *,
                            days: int = 365, overwrite: bool = False) -> list[PartyCerts]:
    """Certificates for split training across hosts with mutual TLS: followers first, then the leader.

    ``followers`` maps each follower's name to the addresses (IP or DNS names) its leader reaches it at.
    Writes the CA into ``out`` (``ca.pem`` and ``ca.key``, which stays there), and for each party a folder
    ``out/<name>/`` holding ``ca.pem``, ``<name>.pem`` and ``<name>.key``: a follower's is a server
    certificate naming its addresses, the leader's a client certificate. A CA already in ``out`` is reused
    (parties made before keep working) unless ``overwrite``; the parties' certificates are always new.
    """
    from cryptography.hazmat.primitives import serialization

    out = Path(out)
    if not followers:
        raise ConfigError("name at least one follower and the addresses the leader reaches it at")
    names = [_name(n, "party") for n in followers] + [_name(leader, "party")]
    for n in names:
        if not n[0].isalnum() or n.lower() in ("ca", "ca.pem", "ca.key"):
            raise ConfigError(f"a party name starts with a letter or digit and is not the CA's, got {n!r}")
    if len(set(names)) != len(names):
        raise ConfigError(f"every party needs its own name, got {names}")
    for name, hosts in followers.items():
        if not hosts:
            raise ConfigError(f"name the addresses the leader reaches follower {name!r} at")
        for h in hosts:
            _san(h)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    until = now + dt.timedelta(days=days)
    if not overwrite and (out / CA_CERT).exists():
        ca, ca_key = _load_ca(out)
    else:
        out.mkdir(parents=True, exist_ok=True)
        ca, ca_key = _new_ca(now, until)
        pem = serialization.Encoding.PEM
        atomic_write(out / "ca.key", ca_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()), secret=True)
        atomic_write(out / CA_CERT, ca.public_bytes(pem))
    ca_pem = (out / CA_CERT).read_bytes()
    parties = [(n, "follower", tuple(h)) for n, h in followers.items()] + [(leader, "leader", ())]
    made = []
    for name, role, hosts in parties:
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        files = CertFiles(folder / CA_CERT, folder / f"{name}.pem", folder / f"{name}.key")
        key, cert = _leaf(ca, ca_key, name, now, until, server_hosts=hosts if role == "follower" else None)
        atomic_write(files.ca, ca_pem)
        _write_pair(files, key, cert)
        made.append(PartyCerts(name, role, folder, files, hosts))
    return made
