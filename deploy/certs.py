"""A small certificate authority for local secure clusters (`kraftlog cluster up --secure`).

`CertificateAuthority.create(dir)` makes `ca.pem` + `ca-key.pem` (EC P-256, 0600 key);
`issue(cn, hosts, cert_path, key_path)` writes a node (or client) certificate signed by it,
with the host names / addresses as SANs (TLS host name checks) and `cn` as subject CN, so
mTLS authenticates node i as `User:broker-<i>`. EC keys: handshakes cost a fraction of RSA's.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY_DAYS = 3650
CERT_VALIDITY_DAYS = 825          # the longest validity browsers accept for leaf certificates
CA_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"


def default_hosts() -> list[str]:
    """SANs of a local node: loopback names and this machine's host name."""
    hosts = ["127.0.0.1", "localhost", "::1"]
    name = socket.gethostname()
    if name and name not in hosts:
        hosts.append(name)
    return hosts


def _write(path: str, data: bytes, private: bool = False) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


@dataclass
class CertificateAuthority:
    """A CA certificate and its private key (`cert_path`, `key_path` on disk)."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cert_path: str
    key_path: str

    @classmethod
    def create(cls, directory: str, name: str = "kraftlog local CA") -> "CertificateAuthority":
        os.makedirs(directory, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=CA_VALIDITY_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        cert_path, key_path = os.path.join(directory, CA_FILE), os.path.join(directory, CA_KEY_FILE)
        _write(key_path, _key_pem(key), private=True)
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        return cls(cert, key, cert_path, key_path)

    @classmethod
    def load(cls, directory: str) -> "CertificateAuthority":
        cert_path, key_path = os.path.join(directory, CA_FILE), os.path.join(directory, CA_KEY_FILE)
        with open(cert_path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        with open(key_path, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
        return cls(cert, key, cert_path, key_path)  # type: ignore[arg-type]

    @classmethod
    def load_or_create(cls, directory: str) -> "CertificateAuthority":
        if os.path.exists(os.path.join(directory, CA_FILE)) and os.path.exists(os.path.join(directory, CA_KEY_FILE)):
            return cls.load(directory)
        return cls.create(directory)

    def issue(self, cn: str, hosts: list[str] | None, cert_path: str, key_path: str,
              days: int = CERT_VALIDITY_DAYS) -> x509.Certificate:
        """Write a certificate for `cn` (server and client use) with SANs `hosts`; -> it."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
             .issuer_name(self.cert.subject).public_key(key.public_key())
             .serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5))
             .not_valid_after(now + datetime.timedelta(days=days))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                            critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                            critical=False))
        if hosts:
            b = b.add_extension(_san(hosts), critical=False)
        cert = b.sign(self.key, hashes.SHA256())
        os.makedirs(os.path.dirname(os.path.abspath(cert_path)), exist_ok=True)
        os.makedirs(os.path.dirname(os.path.abspath(key_path)), exist_ok=True)
        _write(key_path, _key_pem(key), private=True)
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        return cert


def node_certificate_paths(node_dir: str) -> tuple[str, str]:
    """(certificate, key) paths of a node under its data dir."""
    return os.path.join(node_dir, "tls", "node.pem"), os.path.join(node_dir, "tls", "node-key.pem")


def ensure_node_certificate(ca: CertificateAuthority, node_dir: str, cn: str,
                            hosts: list[str] | None = None) -> tuple[str, str]:
    """The node's certificate pair under `node_dir`, issued by `ca` when missing."""
    cert_path, key_path = node_certificate_paths(node_dir)
    if not (os.path.exists(cert_path) and os.path.exists(key_path)):
        ca.issue(cn, hosts or default_hosts(), cert_path, key_path)
    return cert_path, key_path
