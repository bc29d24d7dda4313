"""The local Kafka's certificates and reclaimd's SCRAM password, made once at stack-up.

``python pki.py DIR`` writes, when missing (an existing set is kept, so a broker restart
changes nothing a client holds):

- ``ca.crt``: the CA every listener's certificate and every client certificate chains to;
- ``broker.pem``: the broker's key (PKCS#8) and certificate for 127.0.0.1 and localhost,
  the file Kafka reads as a PEM keystore;
- ``client.crt``/``client.key``: reclaimd's client certificate (CN=reclaimd, so the broker
  maps it to ``User:reclaimd``, the SCRAM user's principal too);
- ``expired-client.crt``/``.key``: the same identity, expired a year ago;
- ``other-ca.crt``: a CA that signed nothing here (a client trusting it refuses the broker);
- ``reclaimd.password``: the SCRAM-SHA-512/256 password of user ``reclaimd`` (mode 0600).

Production makes these with its own PKI (cert-manager, Strimzi's cluster CA, ACM PCA): this
is the test double of that, real certificates over real TLS.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

FILES = (
    "ca.crt",
    "broker.pem",
    "client.crt",
    "client.key",
    "expired-client.crt",
    "expired-client.key",
    "other-ca.crt",
    "reclaimd.password",
)
DAY = dt.timedelta(days=1)


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    key = _key()
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - DAY)
        .not_valid_after(now + 3650 * DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(
    ca: tuple[rsa.RSAPrivateKey, x509.Certificate],
    cn: str,
    *,
    server: bool,
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> tuple[rsa.RSAPrivateKey, x509.Certificate]:
    ca_key, ca_cert = ca
    key = _key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def _write(path: Path, data: bytes, *, secret: bool = False) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def make(directory: Path) -> bool:
    """Write the set into ``directory`` unless it is complete; True if it was made."""
    if all((directory / name).exists() for name in FILES):
        return False
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca = _ca("reclaimd-local-kafka-ca")
    broker_key, broker = _leaf(
        ca, "127.0.0.1", server=True, not_before=now - DAY, not_after=now + 3650 * DAY
    )
    client_key, client = _leaf(
        ca, "reclaimd", server=False, not_before=now - DAY, not_after=now + 3650 * DAY
    )
    old_key, old = _leaf(
        ca, "reclaimd", server=False, not_before=now - 400 * DAY, not_after=now - 365 * DAY
    )
    _, other = _ca("reclaimd-local-other-ca")
    # Written last-first: ca.crt, checked first by ``make``'s caller, only once all else is.
    _write(directory / "broker.pem", _pem_key(broker_key) + _pem(broker) + _pem(ca[1]), secret=True)
    _write(directory / "client.key", _pem_key(client_key), secret=True)
    _write(directory / "client.crt", _pem(client))
    _write(directory / "expired-client.key", _pem_key(old_key), secret=True)
    _write(directory / "expired-client.crt", _pem(old))
    _write(directory / "other-ca.crt", _pem(other))
    _write(directory / "reclaimd.password", secrets.token_urlsafe(24).encode(), secret=True)
    _write(directory / "ca.crt", _pem(ca[1]))
    return True


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: pki.py DIR")
    print("made" if make(Path(sys.argv[1])) else "kept")
