"""Continuous copying (the at-least-once default) on real clusters: once caught up, a flow copies
in a stream in the driver's JVM; a pause ends the stream, a SIGKILL mid-stream loses nothing, a
frozen target holds the stream until it answers again, a stop writes the last positions, and what
it wrote (positions, offset map, offset syncs) says exactly where each copy is. Copies the target
refuses or never acknowledges keep the positions before them, and a stop never waits for them
longer than its grace."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from datetime import datetime

import pytest
from confluent_kafka import KafkaException, Producer

from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.mm2.formats import Heartbeat
from mirrorflow.replication.lease import LEASES_TOPIC, RENEW_S
from mirrorflow.replication.offset_map import decode_key, decode_value, map_topic
from mirrorflow.replication.positions import SourceOffsetReader, offsets_topic
from mirrorflow.replication.spec import DEFAULT_OFFSET_FLUSH_INTERVAL_MS
from mirrorflow.runtime import launch
from mirrorflow.runtime.streaming import STREAM_IDLE_COMMIT_S
from tests.conftest import create_topics
from tests.mirror_harness import (
    alter_topic,
    distinct,
    flow_file,
    offset_syncs,
    produce,
    produce_fresh,
    progress,
    read_topic,
    record_batches,
    start_mirror,
    stop_job,
    topic_names,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

FLOW = "primary->secondary"
REFRESH_S = 5  # the flows' topic refresh, where a test needs it soon
FLUSH_S = DEFAULT_OFFSET_FLUSH_INTERVAL_MS / 1000  # a stream's positions are written this often


def test_a_continuous_flow_copies_a_steady_stream_and_a_sigkill_mid_stream_loses_nothing(
    sandbox, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic = topic_name("steady")
    remote = f"primary.{topic}"
    create_topics(primary, topic, partitions=2)
    if "heartbeats" not in topic_names(primary):  # of flows into primary (written below)
        create_topics(primary, "heartbeats")
    produce(primary, topic, 2, 2_000)  # a backlog: batches copy it, then the stream starts
    config = flow_file(tmp_path, sandbox, topic, f"refresh.topics.interval.seconds = {REFRESH_S}")
    state, log = tmp_path / "state", tmp_path / "mirror.log"

    def complete() -> bool:
        if remote not in topic_names(secondary):
            return False
        target = read_topic(secondary, remote)
        return all(
            distinct(target.get(p, [])) >= distinct(records)
            for p, records in read_topic(primary, topic).items()
        )

    stop_file = launch.stop_file_for(state, [FLOW])
    options = ("--stop-file", str(stop_file))  # continuous copying: the default
    job = start_mirror(config, FLOW, state, log, *options)
    try:
        wait_for(complete, 120, "the backlog's copies")
        wait_for(lambda: "copying continuously" in log.read_text(), 30, "the stream to start")
        # Paused, the stream ends: nothing more is copied until the flow resumes.
        paused = state / "primary-secondary" / "paused"
        paused.touch()
        wait_for(lambda: progress(state).get("state") == "PAUSED", 60, "the pause")
        copies = sum(map(len, read_topic(secondary, remote).values()))
        produce_fresh(primary, topic, 2, 100, start=2_000)
        time.sleep(3)
        assert sum(map(len, read_topic(secondary, remote).values())) == copies
        paused.unlink()
        wait_for(complete, 60, "the resumed flow's copies")
        # A steady stream of 12,000 records over 12 s; the driver is killed in the middle of it.
        load = threading.Thread(
            target=produce_fresh, args=(primary, topic, 2, 12_000, 2_100, 12.0), daemon=True
        )
        load.start()
        time.sleep(6)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
        job = start_mirror(config, FLOW, state, log, *options)
        load.join(60)
        wait_for(complete, 120, "every record, including those produced while the job was down")
        # Caught up again, a single record reaches the target through the restarted job's stream.
        wait_for(
            lambda: log.read_text().count("copying continuously") >= 2,
            30,
            "the restarted job's stream",
        )
        produce_fresh(primary, topic, 2, 1, start=14_100)
        wait_for(complete, 60, "the record copied by the stream")
        # The remote topic's limit is lowered under the stream's batch size (16 KiB), as a
        # config sync does when the source topic's is: its records still fit, its producer's
        # batches do not, and Kafka's producer would split a refused batch into batches of the
        # same size forever (KAFKA-8350). Records arrive at once: the stream's producer splits
        # the refused batches, the stream says so, the flow's topic refresh runs at once and
        # takes the new limit (a streaming flow does not read its limits at every refresh),
        # and the stream starts again with batches that fit, from before the copies its
        # producer could not deliver.
        restarts = log.read_text().count("copying continuously")
        alter_topic(secondary, remote, {"max.message.bytes": "8000"})
        lowered = time.monotonic()
        producer = Producer({**primary.client_config(), "linger.ms": 50})
        for i in range(20_000, 20_600):  # in 1-KiB records, a burst: full batches
            producer.produce(topic, b"y" * 1_000, f"key-{i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0
        wait_for(complete, 60, "records that fit the lowered limit, in batches that fit it")
        print(f"copied {time.monotonic() - lowered:.1f} s after the limit was lowered")
        assert log.read_text().count("copying continuously") == restarts + 1
        assert "the target refused a batch of the stream as too large" in log.read_text()
        # The limit is raised again, and records over the limit the stream knows (8,000 bytes)
        # arrive: its copier stops at the first, the limits are read again, and the stream
        # starts again with the raised one, rather than the flow failing on a record the
        # target takes.
        alter_topic(secondary, remote, {"max.message.bytes": "1048588"})
        for i in range(4):
            producer.produce(topic, b"z" * 20_000, f"large-{i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0
        wait_for(complete, 60, "records over the stream's limit, once the target's was raised")
        assert (
            f"{remote} takes records of at most 1048588 bytes now (max.message.bytes, was 8000): "
            "the stream starts again with it"
        ) in log.read_text()
        # Under a steady stream the flow's control traffic on the target is one transaction
        # per lease renewal, the positions riding with one every offset.flush.interval.ms:
        # not one each second as well.
        began = time.time()
        produce_fresh(primary, topic, 2, 2_000, start=14_101, seconds=12.0)
        ended = time.time()
        wait_for(complete, 60, "the steady stream's copies")

        def positions_at_the_ends() -> bool:
            reader = SourceOffsetReader(
                secondary.client_config(),
                secondary.client_config(),
                offsets_topic("primary"),
                "primary",
            )
            try:
                stored = {p: o for (t, p), o in reader.read_to_end().items() if t == topic}
            finally:
                reader.close()
            return stored == {p: rs[-1][0] for p, rs in read_topic(primary, topic).items()}

        # The positions are written while the stream runs (with the renewals), not only at its
        # end: a failover waiting for them to reach the source's ends must not wait forever.
        wait_for(positions_at_the_ends, FLUSH_S + 5 * RENEW_S, "the stream's positions, running")
        renewals = [
            stamp
            for records in read_topic(secondary, LEASES_TOPIC).values()
            for _o, key, _v, _h, stamp in records
            if key == FLOW.encode() and began * 1000 <= stamp <= ended * 1000
        ]
        assert len(renewals) <= (ended - began) / RENEW_S + 2, (len(renewals), ended - began)
        # The offset map's records go with the positions (each run that grew since), every
        # offset.flush.interval.ms, not at every harvest nor renewal: in a mesh every flow's
        # heartbeat topics grow every second.
        stored_runs: dict[int, int] = {}
        for records in read_topic(secondary, map_topic("primary")).values():
            for _o, key, _v, _h, stamp in records:
                (run_topic, partition), _downstream = decode_key(key)
                if run_topic == topic and began * 1000 <= stamp <= ended * 1000:
                    stored_runs[partition] = stored_runs.get(partition, 0) + 1
        assert set(stored_runs) == {0, 1}, stored_runs
        assert max(stored_runs.values()) <= (ended - began) / FLUSH_S + 2, (
            stored_runs,
            ended - began,
        )
        # Heartbeat topics are read once a beat, not as each heartbeat arrives: in a mesh every
        # cluster holds hundreds of them (every flow's heartbeats, copied along every chain),
        # a heartbeat a second each. Heartbeats of a flow into the source, 20 a second for 4 s,
        # all reach the target, in a batch or two a second, not one batch each.
        mine = {int(time.time() * 1000) + i for i in range(80)}
        beats = Producer({**primary.client_config(), "linger.ms": 0})
        for stamp in sorted(mine):
            beat = Heartbeat("elsewhere", "primary", stamp)
            beats.produce("heartbeats", beat.value(), beat.key(), partition=0)
            beats.poll(0)
            time.sleep(0.05)
        assert beats.flush(30) == 0

        def copied_beats() -> list[int]:
            return [
                offset
                for offset, key, value, *_rest in read_topic(secondary, "primary.heartbeats")[0]
                if key is not None
                and (beat := Heartbeat.from_record(key, value)).source_cluster_alias == "elsewhere"
                and beat.timestamp in mine
            ]

        wait_for(lambda: len(copied_beats()) == len(mine), 30, "the heartbeats' copies")
        offsets = copied_beats()
        batches = [
            (first, last)
            for first, last in record_batches(secondary, "primary.heartbeats", 0)
            if any(first <= offset <= last for offset in offsets)
        ]
        assert len(batches) <= 12, batches  # read as they arrived: 80
        # A backlog of heartbeats (100,000 at once: a stream started far behind, or a mesh's
        # chains after an outage) is copied at the next beats, all of it: not one poll's
        # max.poll.records (500) a beat (200 s), nor one socket buffer of a fetch's answer a
        # beat (41-46 s: the paced consumer is polled without waiting), but read on until
        # caught up (about 8 s on a quiet machine).
        burst = {int(time.time() * 1000) + 1_000 + i for i in range(100_000)}
        beats = Producer({**primary.client_config(), "linger.ms": 20})
        for stamp in burst:
            beat = Heartbeat("elsewhere", "primary", stamp)
            beats.produce("heartbeats", beat.value(), beat.key(), partition=0)
            beats.poll(0)
        assert beats.flush(30) == 0
        mine |= burst
        written = time.monotonic()
        wait_for(lambda: len(copied_beats()) == len(mine), 60, "a backlog of heartbeats")
        assert time.monotonic() - written < 30, time.monotonic() - written
        # Heartbeats arrive all the time, as in a mesh (every flow into the source beats each
        # second; here five a second): each beat's read brings new ones, whose copies are still
        # in flight as the read ends. The flow is caught up all the same once they are
        # acknowledged, and says so: its progress.json, rewritten meanwhile, has it caught up a
        # harvest or two before (it said so last before these heartbeats began, and its lag task
        # asked the source every 10 s, a record of each partition read).
        beating = threading.Event()

        def beat_five_a_second() -> None:
            steady = Producer({**primary.client_config(), "linger.ms": 0})
            while not beating.is_set():
                beat = Heartbeat("elsewhere", "primary", int(time.time() * 1000))
                steady.produce("heartbeats", beat.value(), beat.key(), partition=0)
                steady.poll(0)
                time.sleep(0.2)
            steady.flush(30)

        beater = threading.Thread(target=beat_five_a_second, daemon=True)
        beater.start()
        try:
            began = time.time()

            def updated(written: dict) -> float:
                return datetime.fromisoformat(written["updated"]).timestamp()

            wait_for(lambda: updated(progress(state)) > began + 12, 30, "progress.json rewritten")
            written = progress(state)
        finally:
            beating.set()
            beater.join(30)
        # Its harvests, caught up, are STREAM_IDLE_COMMIT_S apart; the beats' topic is read
        # once a second.
        assert updated(written) - written["caught_up_at"] < STREAM_IDLE_COMMIT_S + 2.5, written
        assert written["lag_records"] == 0, written
        # The target freezes (SIGSTOP: connections open, no answer) for longer than a lease
        # renewal waits, while records arrive: the stream holds, copying nothing, and copies
        # again once the target answers, without ending: no retry, no new stream, no batch.
        before_freeze = len(log.read_text())
        target_broker = sandbox_mod.load(sandbox.directory)["secondary"].pid
        os.kill(target_broker, signal.SIGSTOP)
        try:
            produce_fresh(primary, topic, 2, 200, start=16_101)
            time.sleep(25)
        finally:
            os.kill(target_broker, signal.SIGCONT)
        time.sleep(5)  # the target's brokers answer metadata again

        def complete_after_thaw() -> bool:
            try:
                return complete()
            except KafkaException:  # a read of the thawed target that timed out: again
                return False

        wait_for(complete_after_thaw, 90, "the records that arrived while the target was frozen")
        wait_for(
            lambda: "the stream copies again" in log.read_text()[before_freeze:],
            60,
            "the stream to copy again",
        )
        since = log.read_text()[before_freeze:]
        assert "the stream holds (copies nothing) until the lease is renewed" in since, since
        assert "retrying" not in since and "copying continuously" not in since, since
        assert not re.search(rf"{re.escape(FLOW)} batch \d+:", since), since
        stop_file.touch()  # the stream ends, its last copies' positions written
        assert job.wait(60) == 0, log.read_text()[-3000:]
    finally:
        stop_job(job)

    source, target = read_topic(primary, topic), read_topic(secondary, remote)
    ends = {p: records[-1][0] + 1 for p, records in source.items()}
    # The positions written at the stop are the source's ends: nothing left, nothing beyond.
    assert progress(state)["source_positions"][topic] == {str(p): e for p, e in ends.items()}
    by_offset = {
        side: {p: {r[0]: r[1:] for r in records} for p, records in topic_records.items()}
        for side, topic_records in (("source", source), ("target", target))
    }
    # Every run of the offset map pairs each source record with its copy, run after run.
    runs = [
        (decode_key(key), value)
        for records in read_topic(secondary, map_topic("primary")).values()
        for _o, key, value, _h, _t in records
        if value is not None
    ]
    mapped = 0
    for ((map_topic_name, partition), downstream), value in runs:
        if map_topic_name != topic:
            continue
        run = decode_value(downstream, value)
        for i in range(run.count):
            assert (
                by_offset["target"][partition][run.downstream + i]
                == by_offset["source"][partition][run.upstream + i]
            ), (partition, run, i)
        mapped += run.count
    assert mapped >= 16_301, mapped
    # And so does every offset sync.
    syncs = [s for s in offset_syncs(primary, "mm2-offset-syncs.secondary.internal")]
    assert any(s.topic == topic for s in syncs)
    for sync in syncs:
        if sync.topic == topic:
            assert (
                by_offset["target"][sync.partition][sync.downstream_offset]
                == by_offset["source"][sync.partition][sync.upstream_offset]
            ), sync


def test_copies_the_target_refuses_mid_stream_are_copied_once_it_takes_them_not_skipped(
    sandbox, topic_name, tmp_path
):
    """The target refuses the stream's copies after they were sent (a record larger than the
    remote topic now takes, refused by its broker, not by the copier's own check): the flow
    fails in one line naming the partition and the refusal, and its positions stay below the
    first refused copy. Once the target takes the records again, a new job copies every one of
    them: none is skipped. Then the target freezes with copies in flight, and a stop ends the
    stream within ``task.shutdown.graceful.timeout.ms``, not when its producer gives up on
    them; the next job copies them. Frozen again before its stream's producer has met the
    remote topic, a stop leaves the task blocked in its send to end alone."""

    primary, secondary = sandbox["primary"], sandbox["secondary"]
    topic = topic_name("refused")
    remote = f"primary.{topic}"
    create_topics(primary, topic, partitions=2)
    produce(primary, topic, 2, 100)
    # A stream's end waits this long for its copies' acknowledgements (MirrorMaker 2's worker
    # setting; 5 s by default).
    grace = "secondary.task.shutdown.graceful.timeout.ms = 2000"
    config = flow_file(tmp_path, sandbox, topic, grace)
    state, log = tmp_path / "state", tmp_path / "mirror.log"

    def complete() -> bool:
        target = read_topic(secondary, remote)
        return all(
            distinct(target.get(p, [])) >= distinct(records)
            for p, records in read_topic(primary, topic).items()
        )

    stop_file = launch.stop_file_for(state, [FLOW])
    target_broker = sandbox_mod.load(sandbox.directory)["secondary"].pid

    def stop_while_frozen(records: int, start: int, ended: str, timeout: float, what: str) -> int:
        """Freeze the target (SIGSTOP), produce ``records`` from key ``start``, ask the job to
        stop and wait until its log says ``ended``; thaw. Where the log stood at the freeze."""
        before = len(log.read_text())
        os.kill(target_broker, signal.SIGSTOP)
        try:
            produce_fresh(primary, topic, 2, records, start=start)
            time.sleep(2)
            stop_file.touch()
            # the stop is seen once a renewal to the frozen target gives up (10 s)
            wait_for(lambda: ended in log.read_text()[before:], timeout, what)
        finally:
            os.kill(target_broker, signal.SIGCONT)
        return before

    job = start_mirror(config, FLOW, state, log, "--stop-file", str(stop_file))
    try:
        wait_for(complete, 120, "the first records' copies")
        wait_for(lambda: "copying continuously" in log.read_text(), 30, "the stream to start")
        # The copier took the remote topic's limit (1 MiB) at its start; the broker now takes
        # 10 KiB, and 20-KiB records arrive, steadily, for 4 s (each alone in a producer batch,
        # over the stream's batch size: refused, not split).
        alter_topic(secondary, remote, {"max.message.bytes": "10240"})
        producer = Producer({**primary.client_config(), "enable.idempotence": True})
        for i in range(400):
            producer.produce(topic, b"x" * 20_480, f"big-{i}".encode(), partition=i % 2)
            if i % 20 == 19:
                producer.flush(10)
                time.sleep(0.2)
        assert producer.flush(30) == 0
        assert job.wait(120) != 0, log.read_text()[-3000:]
    finally:
        stop_job(job)
    text = log.read_text()
    refused = rf"{re.escape(topic)}-[01] to {re.escape(remote)} on secondary failed"
    assert re.search(refused, text), text[-3000:]
    stored = progress(state)["source_positions"][topic]
    # The positions stop short of the refused records (the first 100 were copied).
    assert all(int(offset) <= 50 for offset in stored.values()), stored
    # The target takes the records again: a new job copies every one of them.
    alter_topic(secondary, remote, {"max.message.bytes": "1048588"})
    job = start_mirror(config, FLOW, state, log, "--stop-file", str(stop_file))
    try:
        wait_for(complete, 120, "the refused records, copied once the target takes them")
        wait_for(
            lambda: (
                text.count("copying continuously") < log.read_text().count("copying continuously")
            ),
            30,
            "the new job's stream",
        )
        produce_fresh(primary, topic, 2, 2, start=500)  # the stream's producer meets the topic
        wait_for(complete, 30, "the stream's first copies")
        # The target freezes (SIGSTOP) with the stream's copies in flight, and the job is asked
        # to stop: the stream's end waits for their acknowledgements 2 s, not until its
        # producer expires them (delivery.timeout.ms, 120 s).
        before_freeze = stop_while_frozen(
            200, 502, "copies not acknowledged", 30, "the stream's end, 2 s after its stop"
        )
        assert job.wait(120) == 0, log.read_text()[-3000:]
    finally:
        stop_job(job)
    ended = log.read_text()[before_freeze:]
    assert re.search(
        rf"the stream ended with \d+ copies not acknowledged by secondary within "
        rf"task.shutdown.graceful.timeout.ms=2000 \({re.escape(remote)}-[01]",
        ended,
    ), ended[-3000:]
    # Nothing lost: the next job copies the records whose copies were not acknowledged.
    stop_file.unlink()
    before = log.read_text().count("copying continuously")
    job = start_mirror(config, FLOW, state, log, "--stop-file", str(stop_file))
    try:
        wait_for(complete, 120, "the records whose copies the stopped stream left")
        wait_for(lambda: log.read_text().count("copying continuously") > before, 30, "its stream")
        ends = {str(p): records[-1][0] + 1 for p, records in read_topic(primary, topic).items()}
        # Frozen before the stream's producer has met the remote topic: its first send waits
        # for the topic's metadata (max.block.ms, 60 s), and a stop then leaves the task to end
        # alone, sending nothing more, its copies past the positions.
        before_freeze = stop_while_frozen(
            100, 702, "still sending", 40, "the stream's end, 8 s after its stop"
        )
        assert job.wait(120) == 0, log.read_text()[-3000:]
    finally:
        stop_job(job)
    assert "task.shutdown.graceful.timeout.ms=2000" in log.read_text()[before_freeze:]
    # The positions written at the stop are where the stream's copies began: the records
    # produced while the target was frozen are copied by the next start.
    assert progress(state)["source_positions"][topic] == ends
