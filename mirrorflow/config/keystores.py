"""Java key and trust stores read for librdkafka, which reads PEM and PKCS#12 files but not JKS.

MirrorMaker 2 users configure TLS with the Java client's ``ssl.truststore.*`` and
``ssl.keystore.*`` settings, usually JKS files (seed 003's SSL block). mirrorflow's Java parts
(the copier, Spark's Kafka source) read them as they are; for its Python clients a JKS or PKCS#12
truststore becomes the PEM text of its certificates (librdkafka's ``ssl.ca.pem``) and a JKS
keystore becomes its certificate chain and private key as PEM text (``ssl.certificate.pem`` and
``ssl.key.pem``, the key encrypted with the key's password). Nothing is left on disk: a JKS
keystore passes through a PKCS#12 copy in a private temporary directory (0700) that is removed
at once. JKS is read by the JDK's ``keytool``, given its passwords in its environment, never on
its command line; PKCS#12 by ``cryptography``. Each store is read once per process and version
of its file. A wrong password or a file that is no store ends in one line naming the setting.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.hazmat.primitives.serialization import pkcs12

from mirrorflow.errors import MirrorflowError

_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)


@dataclass(frozen=True)
class KeyPair:
    """A keystore's entry for librdkafka: its certificate chain and its private key, as PEM."""

    certificate_chain: str
    private_key: str  # encrypted with ``password`` when there is one
    password: str | None


def truststore_pem(location: str, store_type: str, password: str | None, where: str) -> str:
    """The certificates of a JKS or PKCS#12 truststore as PEM text (``ssl.ca.pem``)."""
    path = _existing(location, "ssl.truststore.location", where)
    stat = path.stat()
    return _truststore(str(path), stat.st_mtime_ns, stat.st_size, store_type, password, where)


def keystore_pair(
    location: str, store_type: str, password: str | None, key_password: str | None, where: str
) -> KeyPair:
    """A JKS or PKCS#12 keystore's one key entry as PEM text."""
    path = _existing(location, "ssl.keystore.location", where)
    stat = path.stat()
    return _keystore(
        str(path), stat.st_mtime_ns, stat.st_size, store_type, password, key_password, where
    )


def check_store(
    setting: str, location: str, store_type: str, password: str | None, where: str
) -> None:
    """Open a store librdkafka will read itself (a PEM truststore or keystore, a PKCS#12
    keystore), so that a wrong password or file ends in one line naming the setting here rather
    than in librdkafka's error when a client is built."""
    path = _existing(location, f"{setting}.location", where)
    stat = path.stat()
    _check(str(path), stat.st_mtime_ns, stat.st_size, setting, store_type, password, where)


@functools.lru_cache(maxsize=64)
def _check(
    path: str,
    _mtime: int,
    _size: int,
    setting: str,
    store_type: str,
    password: str | None,
    where: str,
) -> None:
    data = Path(path).read_bytes()
    what = setting.removeprefix("ssl.")
    if store_type == "PKCS12":
        _pkcs12(data, password, what, where)
        return
    if not _PEM_CERTIFICATE.search(data.decode("ascii", errors="replace")):
        raise MirrorflowError(
            f"{where}: {setting}.location = {path} holds no PEM certificate",
            f"point it at a PEM file, or set {setting}.type to the store's type (JKS, PKCS12)",
        )
    if setting == "ssl.keystore":
        try:
            serialization.load_pem_private_key(data, password.encode() if password else None)
        except (ValueError, TypeError):
            raise MirrorflowError(
                f"{where}: cannot read the private key in {path}: the key's password is wrong "
                "or the file holds no PEM private key",
                "check ssl.key.password and ssl.keystore.location",
            ) from None


@functools.lru_cache(maxsize=64)
def _truststore(
    path: str, _mtime: int, _size: int, store_type: str, password: str | None, where: str
) -> str:
    if store_type == "JKS":
        listed = _keytool(
            ["-list", "-rfc", "-keystore", path, "-storetype", "JKS"],
            {"-storepass": password},
            setting="ssl.truststore",
            path=path,
            where=where,
        )
        certificates = _PEM_CERTIFICATE.findall(listed)
    else:
        _key, certificate, others = _pkcs12(Path(path).read_bytes(), password, "truststore", where)
        certificates = [
            c.public_bytes(serialization.Encoding.PEM).decode()
            for c in ([certificate] if certificate else []) + others
        ]
    if not certificates:
        raise MirrorflowError(
            f"{where}: the truststore {path} holds no certificate",
            "import the cluster's CA certificate into it (keytool -importcert)",
        )
    return "\n".join(c.strip() for c in certificates) + "\n"


@functools.lru_cache(maxsize=64)
def _keystore(
    path: str,
    _mtime: int,
    _size: int,
    store_type: str,
    password: str | None,
    key_password: str | None,
    where: str,
) -> KeyPair:
    if store_type == "JKS":
        with tempfile.TemporaryDirectory(prefix="mirrorflow-keystore-") as private:
            copy = Path(private) / "keystore.p12"
            secret = key_password or password or ""
            arguments = [
                *("-importkeystore", "-noprompt", "-srckeystore", path, "-srcstoretype", "JKS"),
                *("-destkeystore", str(copy), "-deststoretype", "PKCS12"),
            ]
            passwords = {"-srcstorepass": password, "-deststorepass": secret}
            if key_password and key_password != password:
                # A key with a password of its own is imported by its alias.
                arguments += ["-srcalias", _key_alias(path, password, where)]
                passwords["-srckeypass"] = key_password
            _keytool(arguments, passwords, setting="ssl.keystore", path=path, where=where)
            data, password = copy.read_bytes(), secret
    else:
        data = Path(path).read_bytes()
    key, certificate, others = _pkcs12(data, password, "keystore", where)
    if key is None or certificate is None:
        raise MirrorflowError(
            f"{where}: the keystore {path} holds no private key with its certificate",
            "point ssl.keystore.location at the client's keystore, not a truststore",
        )
    key_secret = key_password or password
    encryption = (
        serialization.BestAvailableEncryption(key_secret.encode())
        if key_secret
        else serialization.NoEncryption()
    )
    pem_key = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    ).decode()
    chain = "".join(
        c.public_bytes(serialization.Encoding.PEM).decode() for c in [certificate, *others]
    )
    return KeyPair(chain, pem_key, key_secret or None)


def _key_alias(path: str, password: str | None, where: str) -> str:
    """The alias of a JKS keystore's (first) private key entry."""
    listed = _keytool(
        ["-list", "-keystore", path, "-storetype", "JKS"],
        {"-storepass": password},
        setting="ssl.keystore",
        path=path,
        where=where,
    )
    for line in listed.splitlines():
        alias, _, rest = line.partition(",")
        if "PrivateKeyEntry" in rest:
            return alias.strip()
    raise MirrorflowError(
        f"{where}: the keystore {path} holds no private key",
        "point ssl.keystore.location at the client's keystore, not a truststore",
    )


def _pkcs12(
    data: bytes, password: str | None, what: str, where: str
) -> tuple[PrivateKeyTypes | None, x509.Certificate | None, list[x509.Certificate]]:
    try:
        key, certificate, others = pkcs12.load_key_and_certificates(
            data, password.encode() if password else None
        )
    except ValueError:
        raise MirrorflowError(
            f"{where}: cannot open the PKCS12 {what}: the password is wrong or the file is not a "
            "PKCS12 store",
            f"check ssl.{what}.password and ssl.{what}.type (JKS, PKCS12 or PEM)",
        ) from None
    return key, certificate, list(others)


def _keytool(
    arguments: list[str],
    passwords: dict[str, str | None],
    *,
    setting: str,
    path: str,
    where: str,
) -> str:
    """Run keytool with its passwords in its environment (``-option:env NAME``)."""
    keytool = _keytool_binary(where)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MIRRORFLOW_KT_")}
    command = [keytool, *arguments]
    for i, (option, value) in enumerate(passwords.items()):
        if value is not None:
            name = f"MIRRORFLOW_KT_{i}"
            environment[name] = value
            command += [f"{option}:env", name]
    result = subprocess.run(
        command,
        env=environment,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        output = " ".join((result.stdout + result.stderr).split())
        if "password was incorrect" in output or "password" in output.lower():
            problem, fix = "the password is wrong", f"check {setting}.password"
        elif "Invalid keystore format" in output or "not a" in output.lower():
            problem = "it is not a JKS store"
            fix = f"set {setting}.type to its type (JKS, PKCS12 or PEM)"
        else:
            problem, fix = output.removeprefix("keytool error: ")[:200], f"check {setting}.*"
        raise MirrorflowError(f"{where}: cannot open {path} ({setting}): {problem}", fix)
    return result.stdout


def _keytool_binary(where: str) -> str:
    java_home = os.environ.get("JAVA_HOME")
    candidates = [Path(java_home) / "bin" / "keytool"] if java_home else []
    found = shutil.which("keytool")
    if found:
        candidates.append(Path(found))
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    raise MirrorflowError(
        f"{where}: a JKS store needs the JDK's keytool, which is not on PATH or in $JAVA_HOME",
        "install a JDK (scripts/bootstrap.sh does) or convert the store to PKCS12 or PEM",
    )


def _existing(location: str, setting: str, where: str) -> Path:
    path = Path(location)
    if not path.is_file():
        raise MirrorflowError(
            f"{where}: {setting} = {location} is not a readable file",
            f"check {setting} (the path is read where the job runs)",
        )
    return path
