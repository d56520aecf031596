"""How a batch or a stream ends other than done: the one line a user reads when it fails (the
cause found in what Spark, Kafka's Java clients or mirrorflow's code on an executor raised, and
whether trying again can mend it: a cluster that did not answer,
:class:`~mirrorflow.errors.ClusterUnreachable`, retried with backoff; or not: a refused
principal, a bad setting, and the flow stops), or :class:`BatchCancelled`."""

from __future__ import annotations

import re

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.runtime import eos_writer as mirror_writer


class BatchCancelled(Exception):
    """The flow was cancelled (paused or held) before or while its batch or stream ran."""


class ProducerFenced(MirrorflowError):
    """Exactly once: another producer of the flow's transactional ids fenced the batch's (an
    earlier holder's copy task that Spark retried after that job woke from a freeze, or a
    stray producer of ``mirrorflow-S->T-*``). Nothing of the batch was committed; the job,
    while it still holds the flow's lease, starts its producers again and copies it again
    (:class:`~mirrorflow.runtime.flow_loop.FlowLoop`)."""


_FENCED = re.compile(
    r"_FENCED|PRODUCER_FENCED|ProducerFencedException|InvalidProducerEpochException|"
    r"fenced by a newer instance|newer producer with the same transactionalId|"
    r"attempted an operation with an old epoch"
)


_UNREACHABLE = re.compile(
    r"TimeoutException|NetworkException|DisconnectException|Local: Timed out|"
    r"_TRANSPORT|All broker connections are down|not acknowledged within|did not answer"
)


_PERMANENT = re.compile(
    r"AuthenticationException|AuthorizationException|[Aa]uthori[sz]ation failed|"
    r"[Aa]uthentication failed|SSL handshake failed|certificate verify failed|ConfigException|"
    r"InvalidConfigurationException|refused principal"
)
"""Errors that trying again does not mend (a refused principal, a wrong password or certificate, a
bad setting), even when a timeout is mentioned beside them: never retried."""


_KAFKA_CAUSE = re.compile(r"org\.apache\.kafka\.common\.errors\.\w+: .*")
_DRIVER_ERROR = re.compile(r"mirrorflow\.errors\.(MirrorflowError|ClusterUnreachable): (.*)")


def batch_error(spec: MirrorSpec, exc) -> MirrorflowError:
    """The first line a user needs from a failed batch (a copy error names the record); a
    cluster that did not answer gives :class:`ClusterUnreachable`, which is retried, unless the
    error is one retrying does not mend (:data:`_PERMANENT`)."""
    while isinstance(exc, SystemError) and exc.__cause__ is not None:
        # A Python callback that librdkafka called while the client had an error pending
        # (a delivery report during a produce() that failed): "<function ...> returned a
        # result with an exception set", the client's own error its cause.
        exc = exc.__cause__
    text = str(exc)
    fenced = _FENCED.search(text)
    if fenced and not _PERMANENT.search(text):
        line = next(ln.strip() for ln in text.splitlines() if _FENCED.search(ln))
        kafka = _KAFKA_CAUSE.search(line)  # Kafka's own exception, not Spark's wrapper
        cause = (kafka[0] if kafka else line).removeprefix(mirror_writer.ERROR_PREFIX)[:300]
        return ProducerFenced(
            f"flow {spec.flow}: its batch's transactional producer was fenced by another "
            f"producer of its transactional ids: {cause}",
            "nothing of the batch was committed; while the job holds the flow's lease it starts "
            "its producers again and copies the batch again",
        )
    driver = _DRIVER_ERROR.search(text)  # raised by mirrorflow's code on an executor
    if driver:
        kind = ClusterUnreachable if driver.group(1) == "ClusterUnreachable" else MirrorflowError
        return kind(f"flow {spec.flow} stopped: {driver.group(2).strip()}")
    match = re.search(re.escape(mirror_writer.ERROR_PREFIX) + r"(.*)", text)
    if match:
        message = f"flow {spec.flow} stopped: {match.group(1).strip()}"
        if _UNREACHABLE.search(match.group(1)) and not _PERMANENT.search(match.group(1)):
            return ClusterUnreachable(message)
        return MirrorflowError(message)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # Kafka's own exception says more than Spark's wrappers around it.
    causes = [m[0] for ln in lines if (m := _KAFKA_CAUSE.search(ln))]
    first = causes[0] if causes else lines[0] if lines else text
    if _UNREACHABLE.search(text) and not _PERMANENT.search(text):
        cause = next((ln for ln in text.splitlines() if _UNREACHABLE.search(ln)), first)
        return ClusterUnreachable(
            f"flow {spec.flow}: a cluster did not answer: {cause.strip()[:300]}",
            f"check that {spec.source} and {spec.target} are up and reachable",
        )
    return MirrorflowError(f"flow {spec.flow} stopped: {first[:500]}", "see the job's log")
