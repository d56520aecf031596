"""Certificates for the sandbox's TLS listeners, and the stores clients use, in every format.

One certificate authority per sandbox directory signs each broker's certificate (for 127.0.0.1
and localhost) and one client certificate per sandbox user (``CN=<user>``, which the brokers map
to the principal ``User:<user>``). The stores are written as MirrorMaker 2 users keep them:

    tls/ca.pem                      the CA's certificate (a PEM truststore)
    tls/truststore.jks, .p12        the same certificate as JKS and PKCS#12 truststores
    tls/broker.p12                  the brokers' key and certificate
    tls/<user>.jks, .p12, .pem      each user's key and certificate (PEM: key encrypted)

Every file is 0600 in a 0700 directory; the stores' one password is kept with the sandbox's
other secrets (``clusters.json``, 0600). JKS stores are made with the JDK's ``keytool``, which
reads the password from its environment.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import make_private, private_dir, write_private

STORE_TYPES = ("JKS", "PKCS12", "PEM")
_SUFFIX = {"JKS": "jks", "PKCS12": "p12", "PEM": "pem"}
_VALID = datetime.timedelta(days=3650)


def truststore(directory: Path, store_type: str) -> Path:
    """The sandbox's truststore of ``store_type``."""
    return directory / ("ca.pem" if store_type == "PEM" else f"truststore.{_SUFFIX[store_type]}")


def keystore(directory: Path, user: str, store_type: str) -> Path:
    """``user``'s keystore of ``store_type``."""
    return directory / f"{user}.{_SUFFIX[store_type]}"


def ensure(directory: Path, users: list[str], password: str, keytool: str) -> Path:
    """Create the CA, the brokers' and the users' stores in ``directory`` unless they exist."""
    directory = private_dir(directory)
    if (directory / "complete").exists():
        return directory
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mirrorflow sandbox CA")])
    ca = _certificate(ca_name, ca_name, ca_key.public_key(), ca_key, authority=True)
    write_private(directory / "ca.pem", ca.public_bytes(serialization.Encoding.PEM))
    secret = password.encode()
    for store_type, store in (("PKCS12", "truststore.p12"), ("JKS", "truststore.jks")):
        _keytool(
            keytool,
            [
                *("-importcert", "-noprompt", "-alias", "ca", "-file", str(directory / "ca.pem")),
                *("-keystore", str(directory / store), "-storetype", store_type),
            ],
            password,
        )
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker = _certificate(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]),
        ca_name,
        broker_key.public_key(),
        ca_key,
        names=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
    )
    write_private(directory / "broker.p12", _pkcs12("broker", broker_key, broker, ca, secret))
    for user in users:
        key = ec.generate_private_key(ec.SECP256R1())
        certificate = _certificate(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user)]),
            ca_name,
            key.public_key(),
            ca_key,
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        )
        p12 = keystore(directory, user, "PKCS12")
        write_private(p12, _pkcs12(user, key, certificate, ca, secret))
        encrypted = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(secret),
        )
        chain = certificate.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(
            serialization.Encoding.PEM
        )
        write_private(keystore(directory, user, "PEM"), encrypted + chain)
        _keytool(
            keytool,
            [
                *("-importkeystore", "-noprompt", "-srckeystore", str(p12)),
                *("-srcstoretype", "PKCS12", "-deststoretype", "JKS"),
                *("-destkeystore", str(keystore(directory, user, "JKS"))),
            ],
            password,
            options=("-srcstorepass", "-deststorepass"),
        )
    for path in directory.iterdir():  # keytool's stores, written with its umask's mode
        make_private(path)
    write_private(directory / "complete", "")
    return directory


def _certificate(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    signer: ec.EllipticCurvePrivateKey,
    *,
    authority: bool = False,
    names: list[x509.GeneralName] | None = None,
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
        .add_extension(x509.BasicConstraints(ca=authority, path_length=None), critical=True)
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _pkcs12(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    certificate: x509.Certificate,
    ca: x509.Certificate,
    password: bytes,
) -> bytes:
    return pkcs12.serialize_key_and_certificates(
        name.encode(), key, certificate, [ca], serialization.BestAvailableEncryption(password)
    )


def _keytool(
    keytool: str,
    arguments: list[str],
    password: str,
    options: tuple[str, ...] = ("-storepass",),
) -> None:
    environment = {**os.environ, "MIRRORFLOW_STORE_PASSWORD": password}
    command = [keytool, *arguments]
    for option in options:
        command += [f"{option}:env", "MIRRORFLOW_STORE_PASSWORD"]
    result = subprocess.run(
        command, env=environment, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    if result.returncode != 0:
        output = " ".join((result.stdout + result.stderr).split())
        raise MirrorflowError(
            f"making the sandbox's TLS stores failed: keytool {arguments[0]}: {output[:300]}",
            "delete the sandbox's tls/ directory and run sandbox up again",
        )
