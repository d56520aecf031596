"""What a flow's config sync and ACL sync share: a run (diff, then apply unless a dry run), its
report, and the mirror job's scheduled run of it."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from confluent_kafka import KafkaException

from mirrorflow.errors import ClusterUnreachable, MirrorflowError
from mirrorflow.replication.scheduler import TaskFailed
from mirrorflow.replication.spec import MirrorSpec
from mirrorflow.replication.topics import ClusterAdmin, cluster_error

log = logging.getLogger("mirrorflow.mirror")


class SyncChange(Protocol):
    """One change a sync would make (a topic config, a partition count, an ACL)."""

    def describe(self) -> str: ...

    def as_dict(self) -> dict[str, str | None]: ...


@dataclass
class SyncReport:
    """What one sync of a flow found and did."""

    flow: str
    dry_run: bool
    what: str = "configs"  # "configs" (and partitions) or "acls"
    changes: list[SyncChange] = field(default_factory=list)
    applied: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        verb = "would change" if self.dry_run else "changed"
        if not self.changes:
            head = f"{self.flow} {self.what}: in sync, nothing to change"
        elif self.dry_run:
            head = f"{self.flow} {self.what}: {verb} {len(self.changes)} (dry run: nothing applied)"
        else:
            head = f"{self.flow} {self.what}: {verb} {self.applied} of {len(self.changes)}"
        return [
            head,
            *(f"  {c.describe()}" for c in self.changes),
            *(f"  note: {n}" for n in self.notes),
            *(f"  failed: {f}" for f in self.failures),
        ]

    def as_dict(self) -> dict[str, object]:
        return {
            "flow": self.flow,
            "what": self.what,
            "dry_run": self.dry_run,
            "changes": [c.as_dict() for c in self.changes],
            "applied": self.applied,
            "failures": self.failures,
            "notes": self.notes,
        }


class FlowSync:
    """What both syncs share: the flow's spec, its source and target admin clients, a run
    (diff, then apply unless a dry run) and the mirror job's scheduled run."""

    what = ""

    def __init__(self, spec: MirrorSpec, admins: dict[str, ClusterAdmin] | None = None) -> None:
        """The sync of the flow ``spec`` describes, with the given admin clients (by cluster
        alias) or its own."""
        admins = admins or {
            spec.source: ClusterAdmin(spec.source, spec.source_admin),
            spec.target: ClusterAdmin(spec.target, spec.target_admin),
        }
        self.spec, self.flow = spec, spec.flow
        self.source, self.target = admins[spec.source], admins[spec.target]

    def diff(self, notes: list[str] | None = None) -> list:
        """Every change the sync would make now (``notes`` gets what it leaves alone)."""
        raise NotImplementedError

    def apply(self, changes: list) -> tuple[int, list[str]]:
        """Apply ``changes`` on the target; the number applied and one line per failure."""
        raise NotImplementedError

    def failure(self, doing: str, exc: KafkaException, needs: str) -> str:
        """The line of a change the target refused or failed while ``doing`` it (``needs``: the
        ACL it takes), for :meth:`apply`'s failures."""
        return str(cluster_error(self.target, doing, exc, needs))

    def run(self, dry_run: bool = False) -> SyncReport:
        """Compute the diff, and apply it unless ``dry_run``."""
        report = SyncReport(self.flow, dry_run, self.what)
        report.changes = list(self.diff(report.notes))
        if not dry_run and report.changes:
            report.applied, report.failures = self.apply(report.changes)
        return report

    def scheduled_run(self) -> None:
        """One run of the mirror job's periodic task: each applied change logged; a refusal
        fails the run (counted, logged, retried at the next interval) and never stops the
        copying, as in MirrorMaker 2."""
        try:
            report = self.run()
        except ClusterUnreachable:
            raise
        except MirrorflowError as exc:
            raise TaskFailed(str(exc)) from None
        verb = "tried to sync (see the failure)" if report.failures else "synced"
        for change in report.changes:
            log.info("%s: %s %s", self.flow, verb, change.describe())
        if report.failures:
            more = f" (and {len(report.failures) - 1} more)" if len(report.failures) > 1 else ""
            raise TaskFailed(report.failures[0] + more)
