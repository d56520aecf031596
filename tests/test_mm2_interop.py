"""A flow handed over between MirrorMaker 2 and mirrorflow: each resumes where the other stopped.

Both keep a flow's positions in the same place, in the same format, in both delivery modes:
Connect's offsets topic ``mm2-offsets.<source>.internal`` on the target.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from mirrorflow.replication.positions import SourceOffsetReader, offsets_topic
from mirrorflow.runtime import jvm
from tests.conftest import create_topics
from tests.mirror_harness import copied, flow_file, produce, read_topic, run_mirror_once, wait_for
from tests.test_mirror_job import produce_transactions

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

# MirrorMaker 2's Connect worker on one-broker clusters, as both tools read the file.
MM2_WORKER = [
    "offset.storage.replication.factor = 1",
    "status.storage.replication.factor = 1",
    "config.storage.replication.factor = 1",
    "plugin.discovery = service_load",
    "tasks.max = 1",
]


def run_mm2_until(config: Path, log: Path, done, what: str) -> None:
    """Run MirrorMaker 2 (dedicated mode, target ``secondary``) until ``done()``, then stop it."""
    command = jvm.mirrormaker_command(config, "secondary", log.parent)
    with open(log, "ab") as out:
        mm2 = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        wait_for(done, 180, what)
    finally:
        os.killpg(mm2.pid, signal.SIGTERM)
        try:
            mm2.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(mm2.pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["at-least-once", "exactly-once"])
def test_a_flow_moves_from_mirrormaker_2_to_mirrorflow_and_back_without_copying_twice(
    mode, sandbox, topic_name, tmp_path
):
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    t = topic_name(f"handover-{mode}")
    create_topics(primary, t, partitions=2)
    produce(primary, t, 2, 400)
    common = [
        "primary.consumer.isolation.level = read_committed",
        "secondary.offset.flush.interval.ms = 1000",
        *MM2_WORKER,
    ]
    (tmp_path / "mm2").mkdir()
    (tmp_path / "mirrorflow").mkdir()
    mm2_config = flow_file(tmp_path / "mm2", sandbox, t, *common)
    mirrorflow_config = flow_file(
        tmp_path / "mirrorflow",
        sandbox,
        t,
        *common,
        *(["secondary.exactly.once.source.support = enabled"] if mode == "exactly-once" else []),
    )
    reader = SourceOffsetReader(
        secondary.client_config(), secondary.client_config(), offsets_topic("primary"), "primary"
    )

    def positions_reach(last: int):
        def reached() -> bool:
            try:
                found = reader.read_to_end(timeout_s=10)
            except Exception:  # the topic may not exist yet
                return False
            return all(found.get((t, p), -1) >= last for p in (0, 1))

        return reached

    try:
        # 1. MirrorMaker 2 copies the first 400 records and records its positions.
        run_mm2_until(mm2_config, tmp_path / "mm2.log", positions_reach(199), "MM2's positions")
        # 2. mirrorflow, with no progress of its own, resumes from MirrorMaker 2's positions.
        produce(primary, t, 2, 200, start=400)
        run_mirror_once(mirrorflow_config, "primary->secondary", tmp_path / "state")
        assert copied(read_topic(secondary, f"primary.{t}")) == copied(read_topic(primary, t))
        # 3. MirrorMaker 2 resumes from mirrorflow's positions.
        produce(primary, t, 2, 200, start=600)
        run_mm2_until(
            mm2_config,
            tmp_path / "mm2.log",
            lambda: sum(map(len, read_topic(secondary, f"primary.{t}").values())) >= 800,
            "MM2 to copy the last records",
        )
    finally:
        reader.close()
    assert copied(read_topic(secondary, f"primary.{t}")) == copied(read_topic(primary, t))


def test_aborted_transactions_are_copied_as_mirrormaker_2_copies_them_only_when_asked(
    sandbox, topic_name, tmp_path
):
    """mirrorflow reads the source read_committed by default (the failover and broker-restart
    scenarios run on that default); ``consumer.isolation.level = read_uncommitted`` gives
    MirrorMaker 2's behaviour, checked here against MirrorMaker 2 itself: the records of
    aborted transactions arrive as data, each once, and the control markers do not."""
    primary, secondary = sandbox["primary"], sandbox["secondary"]
    ours, theirs = topic_name("aborted-mirrorflow"), topic_name("aborted-mm2")
    for t in (ours, theirs):
        create_topics(primary, t, partitions=2)
    committed = produce_transactions(primary, ours, 2, range(10), 20)
    assert produce_transactions(primary, theirs, 2, range(10), 20) == committed
    everything = {f"{txn}-{i}".encode() for txn in range(10) for i in range(20)}
    assert len(everything - committed) == 40  # transactions 4 and 9 were aborted

    def keys(topic: str) -> list:
        return sorted(r[1] for rs in read_topic(secondary, f"primary.{topic}").values() for r in rs)

    common = MM2_WORKER
    (tmp_path / "mm2").mkdir()
    (tmp_path / "mirrorflow").mkdir()
    run_mm2_until(
        flow_file(tmp_path / "mm2", sandbox, theirs, *common),
        tmp_path / "mm2.log",
        lambda: len(keys(theirs)) >= len(everything),
        "MirrorMaker 2's copies",
    )
    mirrorflow_config = flow_file(
        tmp_path / "mirrorflow",
        sandbox,
        ours,
        *common,
        "primary.consumer.isolation.level = read_uncommitted",
    )
    run_mirror_once(mirrorflow_config, "primary->secondary", tmp_path / "state")
    assert keys(theirs) == sorted(everything), "MirrorMaker 2 did not copy what it reads"
    assert keys(ours) == keys(theirs)
