"""Java Kafka client settings translated to librdkafka (confluent-kafka) settings.

MirrorMaker 2 configuration speaks the Java client's language; mirrorflow's Python tasks talk to
Kafka through librdkafka. Settings with the same name and meaning pass through, renamed ones are
renamed, ``sasl.jaas.config`` becomes ``sasl.username``/``sasl.password`` (PLAIN, SCRAM) or a
Kerberos keytab and principal, PEM and PKCS#12 keystores become librdkafka's ``ssl.*``
locations, JKS stores and PKCS#12 truststores PEM text (:mod:`mirrorflow.config.keystores`).
A setting the Java client would ignore is dropped, and so is one left at the Java default or
that only tunes the JVM; anything else librdkafka cannot express is refused with an error naming
the setting, because silently dropping it could weaken security or change behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from mirrorflow.config import keystores
from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2 import configdefs

_SAME = frozenset(
    {
        "bootstrap.servers", "client.id", "client.rack", "client.dns.lookup",
        "security.protocol", "sasl.mechanism", "sasl.kerberos.service.name",
        "sasl.kerberos.kinit.cmd", "sasl.kerberos.min.time.before.relogin",
        "ssl.cipher.suites", "ssl.key.password", "ssl.endpoint.identification.algorithm",
        "metadata.max.age.ms", "reconnect.backoff.ms", "reconnect.backoff.max.ms",
        "retry.backoff.ms", "retry.backoff.max.ms", "socket.connection.setup.timeout.ms",
        "connections.max.idle.ms", "request.timeout.ms", "enable.metrics.push",
        # consumer
        "group.id", "group.instance.id", "group.protocol", "group.remote.assignor",
        "session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms",
        "enable.auto.commit", "auto.commit.interval.ms", "isolation.level", "fetch.min.bytes",
        "fetch.max.bytes", "max.partition.fetch.bytes", "check.crcs",
        "allow.auto.create.topics",
        # producer
        "acks", "linger.ms", "batch.size", "compression.type", "enable.idempotence",
        "transactional.id", "transaction.timeout.ms", "retries", "delivery.timeout.ms",
        "max.in.flight.requests.per.connection",
    }
)  # fmt: skip
_RENAMED = {
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "max.request.size": "message.max.bytes",
}
# JVM-side tuning with no librdkafka counterpart and no effect on what is read or written.
_JVM_ONLY = frozenset(
    {
        "key.serializer", "value.serializer", "key.deserializer", "value.deserializer",
        "buffer.memory", "max.block.ms", "default.api.timeout.ms", "max.poll.records",
        "exclude.internal.topics", "metric.reporters", "metrics.num.samples",
        "metrics.recording.level", "metrics.sample.window.ms", "auto.include.jmx.reporter",
        "ssl.keymanager.algorithm", "ssl.trustmanager.algorithm",
        "ssl.secure.random.implementation", "sasl.login.connect.timeout.ms",
        "sasl.login.read.timeout.ms", "sasl.login.retry.backoff.ms",
        "sasl.login.retry.backoff.max.ms", "sasl.login.refresh.buffer.seconds",
        "sasl.login.refresh.min.period.seconds", "sasl.login.refresh.window.factor",
        "sasl.login.refresh.window.jitter", "sasl.kerberos.ticket.renew.jitter",
        "sasl.kerberos.ticket.renew.window.factor",
    }
)  # fmt: skip
_OFFSET_RESET = {"earliest": "earliest", "latest": "latest", "none": "error"}
_ASSIGNORS = {
    "org.apache.kafka.clients.consumer.RangeAssignor": "range",
    "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
    "org.apache.kafka.clients.consumer.CooperativeStickyAssignor": "cooperative-sticky",
}
_JAAS = re.compile(r"\s*(\S+)\s+(required|requisite|sufficient|optional)\b(.*?);?\s*$", re.S)
_JAAS_OPTION = re.compile(r'([\w.-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;"]+))')
_JAAS_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": "password",
    "org.apache.kafka.common.security.scram.ScramLoginModule": "password",
    "com.sun.security.auth.module.Krb5LoginModule": "kerberos",
}


def translate(java: Mapping[str, str], role: str, where: str) -> dict[str, str]:
    """librdkafka settings equivalent to the Java ``role`` client settings ``java``.

    ``role`` is ``consumer``, ``producer`` or ``admin``; ``where`` names the cluster and client
    in errors (e.g. ``"cluster primary, admin client"``).
    """
    out: dict[str, str] = {}
    known = configdefs.client_names(role)
    defaults = configdefs.connector_settings()
    for key, value in java.items():
        if key in _SAME:
            out[key] = value
        elif key in _RENAMED:
            out[_RENAMED[key]] = value
        elif key == "sasl.jaas.config":
            out.update(_jaas(value, where))
        elif key == "auto.offset.reset" and value in _OFFSET_RESET:
            out[key] = _OFFSET_RESET[value]
        elif key == "partition.assignment.strategy":
            out[key] = _assignors(value, where)
        elif key.startswith(("ssl.keystore.", "ssl.truststore.")):
            continue  # translated together below
        elif key not in known or key in _JVM_ONLY:
            continue  # the Java client ignores unknown keys; JVM tuning has no counterpart
        elif key in defaults and value == defaults[key].default:
            continue  # the Java default, which is librdkafka's behaviour too
        else:
            raise _untranslatable(key, value, where)
    out.update(_stores(java, where))
    return out


def principal(java: Mapping[str, str]) -> str:
    """Who a Java client config logs in as (SASL user or Kerberos principal), for messages."""
    match = _JAAS.fullmatch(java.get("sasl.jaas.config", "") or "")
    if not match:
        return "(no SASL user)"
    options = _jaas_options(match)
    return options.get("username") or options.get("principal") or "(no SASL user)"


def _jaas_options(match: re.Match) -> dict[str, str]:
    return {
        m.group(1): re.sub(r"\\(.)", r"\1", m.group(2)) if m.group(2) is not None else m.group(3)
        for m in _JAAS_OPTION.finditer(match.group(3))
    }


def _jaas(value: str, where: str) -> dict[str, str]:
    match = _JAAS.fullmatch(value)
    module = match.group(1) if match else ""
    kind = _JAAS_MODULES.get(module)
    if kind is None or match is None:  # (no match: no module, so no kind)
        raise MirrorflowError(
            f"{where}: sasl.jaas.config uses {module or 'an unparsable login module'}, "
            "which librdkafka cannot use",
            "use PlainLoginModule or ScramLoginModule (username/password) or Krb5LoginModule "
            "with useKeyTab=true, keyTab and principal",
        )
    options = _jaas_options(match)
    if kind == "password":
        if "username" not in options or "password" not in options:
            raise MirrorflowError(
                f"{where}: sasl.jaas.config ({module.rsplit('.', 1)[-1]}) needs username and "
                "password options"
            )
        return {"sasl.username": options["username"], "sasl.password": options["password"]}
    if options.get("useKeyTab", "").lower() != "true" or "keyTab" not in options:
        raise MirrorflowError(
            f"{where}: Krb5LoginModule without useKeyTab=true and keyTab cannot be expressed "
            "for librdkafka",
            'add useKeyTab=true keyTab="/path/to/keytab" principal="name@REALM"',
        )
    out = {"sasl.kerberos.keytab": options["keyTab"]}
    if "principal" in options:
        out["sasl.kerberos.principal"] = options["principal"]
    return out


def _assignors(value: str, where: str) -> str:
    names = []
    for java_class in configdefs.parse_list(value):
        if java_class not in _ASSIGNORS:
            raise _untranslatable("partition.assignment.strategy", value, where)
        names.append(_ASSIGNORS[java_class])
    return ",".join(names)


def _stores(java: Mapping[str, str], where: str) -> dict[str, str]:
    """Java key and trust stores as librdkafka's settings: PEM files and PKCS#12 keystores by
    location, JKS and PKCS#12 truststores and JKS keystores as PEM text (:mod:`keystores`)."""
    out: dict[str, str] = {}
    trust_type = java.get("ssl.truststore.type", "JKS").upper()
    if "ssl.truststore.certificates" in java:
        out["ssl.ca.pem"] = java["ssl.truststore.certificates"]
    elif "ssl.truststore.location" in java:
        location = java["ssl.truststore.location"]
        if trust_type == "PEM":
            keystores.check_store("ssl.truststore", location, "PEM", None, where)
            out["ssl.ca.location"] = location
        elif trust_type in ("JKS", "PKCS12"):
            password = java.get("ssl.truststore.password")
            out["ssl.ca.pem"] = keystores.truststore_pem(location, trust_type, password, where)
        else:
            raise _store_type("truststore", trust_type, where)
    key_type = java.get("ssl.keystore.type", "JKS").upper()
    if "ssl.keystore.key" in java:
        out["ssl.key.pem"] = java["ssl.keystore.key"]
        if "ssl.keystore.certificate.chain" in java:
            out["ssl.certificate.pem"] = java["ssl.keystore.certificate.chain"]
    elif "ssl.keystore.location" in java:
        location = java["ssl.keystore.location"]
        if key_type == "PKCS12":
            password = java.get("ssl.keystore.password")
            keystores.check_store("ssl.keystore", location, "PKCS12", password, where)
            out["ssl.keystore.location"] = location
            if "ssl.keystore.password" in java:
                out["ssl.keystore.password"] = java["ssl.keystore.password"]
        elif key_type == "PEM":
            password = java.get("ssl.key.password")
            keystores.check_store("ssl.keystore", location, "PEM", password, where)
            out["ssl.certificate.location"] = out["ssl.key.location"] = location
        elif key_type == "JKS":
            pair = keystores.keystore_pair(
                location,
                key_type,
                java.get("ssl.keystore.password"),
                java.get("ssl.key.password"),
                where,
            )
            out["ssl.certificate.pem"] = pair.certificate_chain
            out["ssl.key.pem"] = pair.private_key
            if pair.password:
                out["ssl.key.password"] = pair.password
        else:
            raise _store_type("keystore", key_type, where)
    return out


def _store_type(store: str, store_type: str, where: str) -> MirrorflowError:
    return MirrorflowError(
        f"{where}: ssl.{store}.type = {store_type} is not a store type mirrorflow reads",
        f"use JKS, PKCS12 or PEM for ssl.{store}.type",
    )


def _untranslatable(key: str, value: str, where: str) -> MirrorflowError:
    return MirrorflowError(
        f"{where}: {key} = {configdefs.redact(key, value)} has no librdkafka equivalent",
        "remove it for this cluster or role, or set it only on the Java side "
        "(e.g. <alias>.consumer.<key> is used by the Spark job as well)",
    )
