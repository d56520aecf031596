"""Copying a partition's offset range from one cluster to another as a failback does: the
committed records in order, with their keys, values, headers and timestamps, into the same
partition of another topic, and where each landed (runs of source offset, copy's offset, count);
each copy and each topic created in the run's ledger as it is made."""

from __future__ import annotations

import time

from mirrorflow.dr import steps
from mirrorflow.errors import MirrorflowError
from mirrorflow.replication.topics import ADMIN_TIMEOUT_S, ClusterAdmin, cluster_error


def topic_partitions(admin: ClusterAdmin, topic: str) -> list[int]:
    found = admin.metadata().topics.get(topic)
    if found is None or found.error is not None:
        return []
    return sorted(found.partitions)


def copy_range(
    source_config: dict[str, str],
    target_config: dict[str, str],
    topic: str,
    partition: int,
    start: int,
    end: int,
    to_topic: str,
    clusters: tuple[str, str] = ("", ""),
) -> list[list[int]]:
    """Copy the committed records of ``topic``-``partition`` in ``[start, end)`` to
    ``to_topic``'s same partition (key, value, headers, timestamp), in order; returns where they
    landed as runs ``[first source offset, first copy's offset, count]`` (both advancing by one
    within a run). ``clusters``: the aliases of the clusters read and written."""
    from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

    from mirrorflow.replication import clients

    if end <= start:
        return []
    consumer = clients.consumer(
        clusters[0],
        {
            **source_config,
            "group.id": "mirrorflow-failback",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        },
    )
    producer = clients.producer(
        clusters[1], {**target_config, "enable.idempotence": True, "acks": "all"}
    )
    landed: list[tuple[int, int]] = []
    errors: list = []
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        deadline = time.monotonic() + 120
        while True:
            msg = consumer.poll(1.0)
            if msg is None:
                if consumer.position([TopicPartition(topic, partition)])[0].offset >= end:
                    break
                if time.monotonic() > deadline:
                    raise MirrorflowError(f"reading {topic}-{partition} timed out at {start}")
                continue
            error, offset = msg.error(), msg.offset()
            if error:
                if error.code() == KafkaError._PARTITION_EOF:
                    assert offset is not None  # the end's offset
                    if (
                        offset >= end
                        or consumer.position([TopicPartition(topic, partition)])[0].offset >= end
                    ):
                        break
                    continue
                raise KafkaException(error)
            assert offset is not None  # a record's
            if offset >= end:
                break

            def delivered(err: KafkaError | None, m: Message, o: int = offset) -> None:
                if err:
                    errors.append(err)
                else:
                    landed_at = m.offset()
                    assert landed_at is not None  # a delivered record's
                    landed.append((o, landed_at))

            producer.produce(
                to_topic,
                value=msg.value(),
                key=msg.key(),
                partition=partition,
                headers=msg.headers(),
                timestamp=msg.timestamp()[1],
                on_delivery=delivered,
            )
            producer.poll(0)
            if offset + 1 >= end:
                break
        if producer.flush(60) or errors:
            raise MirrorflowError(
                f"copying {topic}-{partition} to {to_topic} failed: "
                + (errors[0].str() if errors else "not acknowledged within 60s")
            )
    finally:
        consumer.close()
    runs: list[list[int]] = []
    for upstream, downstream in sorted(landed):
        last = runs[-1] if runs else None
        if last and upstream == last[0] + last[2] and downstream == last[1] + last[2]:
            runs[-1][2] += 1
        else:
            runs.append([upstream, downstream, 1])
    return runs


def ensure_topic(
    run: steps.Run, admin: ClusterAdmin, topic: str, like: ClusterAdmin, like_topic: str
) -> None:
    """Create ``topic`` on ``admin``'s cluster with ``like_topic``'s partition count (in the
    run's ledger)."""
    from confluent_kafka.admin import NewTopic

    if topic in admin.metadata().topics:
        return
    partitions = max(1, len(topic_partitions(like, like_topic)))
    brokers = len(admin.metadata().brokers)
    for name, future in admin.client.create_topics(
        [NewTopic(topic, partitions, min(3, brokers))], request_timeout=ADMIN_TIMEOUT_S
    ).items():
        try:
            future.result()
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise cluster_error(
                    admin, f"creating topic {name}", exc, f"CREATE on {name}"
                ) from None
            continue
        run.change(
            "topic-created",
            f"created topic {name} on {admin.alias} ({partitions} partition(s))",
            undo={"cluster": admin.alias, "topic": name},
        )


def copy_recorded(
    run: steps.Run,
    clusters: tuple[str, str],
    source_config: dict[str, str],
    target_config: dict[str, str],
    r: dict,
) -> list[list[int]]:
    """:func:`copy_range` of range ``r`` (topic, partition, start, end, to) from ``clusters[0]``
    to ``clusters[1]``, in the run's ledger as soon as it is copied (or failed, perhaps partly
    copied)."""
    what = f"{r['topic']}-{r['partition']} [{r['start']}, {r['end']}) to {r['to']} on {clusters[1]}"
    try:
        runs = copy_range(
            source_config,
            target_config,
            r["topic"],
            r["partition"],
            r["start"],
            r["end"],
            r["to"],
            clusters=clusters,
        )
    except Exception as exc:
        run.change("records-copied", f"copy of {what} failed, perhaps part copied: {exc}")
        raise
    landed = ", ".join(f"{d}..{d + n - 1}" for _u, d, n in runs) or "nothing"
    run.change(
        "records-copied",
        f"copied {sum(n for _u, _d, n in runs)} record(s) of {what} (at offsets {landed})",
    )
    return runs
