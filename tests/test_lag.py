"""A flow's lag measured from its source on a real cluster (``mirrorflow.replication.lag``): the
ends, and the timestamp of the record at each position behind, read with the one consumer a job
keeps for it, measurement after measurement."""

from __future__ import annotations

import time

from mirrorflow.replication import lag
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.replication.topics import ClusterAdmin
from tests.conftest import create_topics
from tests.mirror_harness import flow_file, produce, read_topic


def test_every_measurement_reads_the_oldest_uncopied_records_timestamp_not_only_the_first(
    sandbox, topic_name, tmp_path
):
    """The ``measure-lag`` task measures every 10 s with the same consumer, which pauses each
    partition once it has its record. librdkafka keeps a partition paused across ``unassign``
    and ``assign``: the consumer read nothing more of a partition it had measured once, each
    later measurement waited its 5 s for records and left the age of the oldest record not
    copied unknown (``mirrorflow_lag_seconds`` then falls back to the time since the flow was
    last caught up, an upper bound)."""
    primary = sandbox["primary"]
    t = topic_name("lagging")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 20)
    spec = spec_for_flow([flow_file(tmp_path, sandbox, t)], "primary->secondary")
    records = read_topic(primary, t)
    admin, consumer = ClusterAdmin(spec.source, spec.source_admin), lag.timestamp_reader(spec)
    try:
        for behind in ({(t, 0): 2, (t, 1): 3}, {(t, 0): 2, (t, 1): 5}, {(t, 0): 4, (t, 1): 5}):
            started = time.monotonic()
            measured = lag.measure(spec, behind, admin=admin, consumer=consumer)
            took = time.monotonic() - started
            assert measured.ends == {(t, p): rs[-1][0] + 1 for p, rs in records.items()}
            assert measured.oldest_ms == {
                (t, p): next(r[4] for r in records[p] if r[0] == offset)
                for (_t, p), offset in behind.items()
            }, behind
            assert took < lag.TIMESTAMP_WAIT_S / 2, took
    finally:
        consumer.close()
