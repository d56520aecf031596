"""A flow's start, before its first batch: both clusters checked, its internal topics created, its
lease taken (:mod:`mirrorflow.replication.lease`: at most one job copies the flow), its earlier
producers fenced (exactly once), and its positions loaded from ``mm2-offsets.<source>.internal``
on the target (:class:`FlowStarter`); then the mirrorflow package shipped to the executors, once
per application.

A restart request (``S-T/restart``) overwrites the positions once. A mirrorflow 0.x job kept
at-least-once positions in a Spark streaming checkpoint (``S-T/checkpoint``,
:data:`LEGACY_PROGRESS`); they are moved into the offsets topic once, at the first start.
"""

from __future__ import annotations

import logging
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication.checkpoint_stores import OffsetMapReader
from mirrorflow.replication.lease import FlowLease, Holder
from mirrorflow.replication.positions import PositionWriter, SourceOffsetReader, legacy_progress
from mirrorflow.replication.topics import ensure_flow_topics
from mirrorflow.runtime import eos_writer as mirror_writer
from mirrorflow.runtime import exactly_once, jobs

if TYPE_CHECKING:
    from mirrorflow.runtime.driver import MirrorJob

log = logging.getLogger("mirrorflow.mirror")

Partition = tuple[str, int]
LEGACY_PROGRESS = "checkpoint"  # mirrorflow 0.x: Spark's streaming checkpoint of the flow
# How long a start waits for another job's lease of the flow to be released or to expire (a job
# that is stopping, or whose host died) before it fails naming that job.
LEASE_WAIT_S = 14.0
_SHIPPED = False  # the mirrorflow package went to the executors (once per application)


class FlowStarter:
    """Starts ``job``'s flow (again, after a cluster's outage): its lease, its positions."""

    def __init__(self, job: MirrorJob) -> None:
        self.job = job
        self.reader: SourceOffsetReader | None = None  # the flow's stored positions
        self._map_reader: OffsetMapReader | None = None

    def prepare(self) -> None:
        """Check both clusters, create the internal topics and load the flow's positions. The
        readers of the positions and the offset map end their clients once read: the flow
        reads them again only at its next start (:meth:`TopicReader.release
        <mirrorflow.replication.topic_reader.TopicReader.release>`)."""
        try:
            self._prepare()
        finally:
            for reader in (self._map_reader, self.reader):
                if reader is not None:
                    reader.release()

    def _prepare(self) -> None:
        job, spec = self.job, self.job.spec
        job.copier.transform_plan()  # both modes: a transform Spark cannot evaluate fails now
        for admin in job.admins.values():
            admin.metadata()
        ensure_flow_topics(spec, job.admins)
        taken = self._take_lease()
        if self._map_reader is None:
            self._map_reader = OffsetMapReader(spec, job.offset_map, missing_ok=True)
        self._map_reader.read_to_end()
        if self.reader is None:
            self.reader = SourceOffsetReader(
                spec.target_consumer,
                spec.target_admin,
                spec.offsets_topic,
                spec.source,
                spec.target,
            )
            job.writer = PositionWriter(
                spec.target_client, spec.offsets_topic, spec.source, spec.target
            )
        assert job.writer is not None
        job.writer.lease = job.lease
        job.mapping = job.remote_topics.prepare()
        if taken and spec.exactly_once:
            # Fence every earlier producer of the flow's partitions first (a job that held the
            # lease may have left transactions open, or committing): the positions read next
            # are then final, and a fenced job can commit nothing more.
            try:
                exactly_once.fence(spec, job.copy_producer_config, job.partitions())
            except MirrorflowError as exc:
                raise ClusterUnreachable(exc.message, exc.hint) from None
        job.positions = self._stored_positions()

    def _take_lease(self) -> bool:
        """Hold the flow's lease on the target (:mod:`mirrorflow.replication.lease`): at most
        one job copies the flow, wherever it runs. Taken at start, waiting for a holder that
        is going away; kept across a cluster's outage (renewed, or lost to another job)."""
        job, spec = self.job, self.job.spec
        if job.lease is not None and job.lease.held:
            job.lease.renew()
            return False
        FlowLease.ensure_topic(job.admins[spec.target], spec.offsets_replication_factor)
        state_dir = str(Path(spec.flow_dir).parent) if spec.flow_dir else "(none)"
        job.lease = FlowLease(
            spec.flow,
            spec.target,
            spec.target_client,
            spec.target_consumer,
            spec.target_admin,
            Holder.this_process(state_dir),
        )
        job.lease.take(wait_s=LEASE_WAIT_S)
        return True

    def _stored_positions(self) -> dict[Partition, int]:
        """Where each partition resumes: its stored position, migrated or restarted once."""
        job, spec = self.job, self.job.spec
        assert self.reader is not None and job.writer is not None
        stored = {tp: last + 1 for tp, last in self.reader.read_to_end().items()}
        restart = jobs.restart_request(job.flow_dir)
        if restart is not None:
            position = restart or spec.starting_offsets
            starts = job.source_offsets.starts(job.partitions(), position)
            job.writer.write(starts)
            log.warning(
                "%s: restart requested: %d partitions start over from %s (their earlier "
                "positions are overwritten)",
                spec.flow,
                len(starts),
                position,
            )
            (job.flow_dir / jobs.RESTART_FILE).unlink(missing_ok=True)
            return starts
        legacy = job.flow_dir / LEGACY_PROGRESS
        if legacy.is_dir():
            migrated = {tp: o for tp, o in legacy_progress(legacy).items() if tp not in stored}
            if migrated:
                job.writer.write(migrated)
                stored.update(migrated)
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            legacy.rename(legacy.with_name(f"{LEGACY_PROGRESS}.migrated-{stamp}"))
            log.warning(
                "%s: moved the positions of %d partitions from %s to %s (once)",
                spec.flow,
                len(migrated),
                legacy,
                spec.offsets_topic,
            )
        return stored

    def ship_library(self) -> None:
        """Ship the mirrorflow package to the executors (a cluster's workers may lack it),
        once per application."""
        global _SHIPPED
        if _SHIPPED:
            return
        _SHIPPED = True
        package = Path(mirror_writer.__file__).parent.parent
        archive = self.job.flow_dir / "mirrorflow-lib.zip"
        archive.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(archive, "w") as zf:
            for path in sorted(package.rglob("*.py")):
                zf.write(path, path.relative_to(package.parent))
        self.job.spark.context.addPyFile(str(archive))
