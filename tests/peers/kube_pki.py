"""The test cluster's PKI (what kubeadm writes to /etc/kubernetes/pki), made with ``cryptography``:
a CA, the apiserver's serving cert, an admin client cert (O=system:masters) and the service
account key pair. ECDSA P-256 throughout: instant to generate, accepted everywhere."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = timedelta(days=2)


@dataclass(frozen=True, slots=True)
class Pki:
    ca_crt: Path
    apiserver_crt: Path
    apiserver_key: Path
    admin_crt: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path

    @property
    def ca_pem(self) -> bytes:
        return self.ca_crt.read_bytes()


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name,
             key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.now(UTC)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + _VALID))


def _leaf(ca_key: ec.EllipticCurvePrivateKey, ca_name: x509.Name, subject: x509.Name,
          usage: x509.ObjectIdentifier,
          sans: list[x509.GeneralName] | None = None) -> tuple[bytes, bytes]:
    key = _key()
    builder = (_builder(subject, ca_name, key)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False,
                                            False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def make_pki(directory: Path, *, service_ip: str) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = _name("kubernetes")
    ca = (_builder(ca_name, ca_name, ca_key)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(True, False, True, False, False, True, False, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    sans: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address(service_ip)),
        *(x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default",
                                    "kubernetes.default.svc",
                                    "kubernetes.default.svc.cluster.local")),
    ]
    serving = _leaf(ca_key, ca_name, _name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH,
                    sans)
    admin = _leaf(ca_key, ca_name, _name("kubernetes-admin", "system:masters"),
                  ExtendedKeyUsageOID.CLIENT_AUTH)
    sa_key = _key()
    files = {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "apiserver.crt": serving[0], "apiserver.key": serving[1],
        "admin.crt": admin[0], "admin.key": admin[1],
        "sa.key": _key_pem(sa_key),
        "sa.pub": sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
    }
    for name, data in files.items():
        path = directory / name
        path.write_bytes(data)
        path.chmod(0o600)
    return Pki(*(directory / n for n in ("ca.crt", "apiserver.crt", "apiserver.key",
                                          "admin.crt", "admin.key", "sa.key", "sa.pub")))
