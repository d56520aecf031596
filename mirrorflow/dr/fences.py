"""Producer fences: ACLs denying WRITE on a topic to a principal, created by a failover on the
source (a failback on the DR cluster) so nothing more is written there, and the record of the
failovers' fences (``fences.json``) from which a failback or a rollback removes exactly those."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from mirrorflow import paths
from mirrorflow.dr.steps import now
from mirrorflow.replication.topics import ADMIN_TIMEOUT_S, ClusterAdmin, cluster_error
from mirrorflow.runtime import jobs


def deny_write_bindings(acls: Sequence[tuple[str, str]], as_filter: bool = False) -> list:
    """ACL bindings denying WRITE, one per ``(principal, topic)`` (a literal topic name), from
    any host (``as_filter``: the filters that match exactly those, to delete them)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    make = AclBindingFilter if as_filter else AclBinding
    return [
        make(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            principal,
            "*",
            AclOperation.WRITE,
            AclPermissionType.DENY,
        )
        for principal, topic in acls
    ]


def create_acls(
    admin: ClusterAdmin, bindings: list, created: Callable[[object], None] | None = None
) -> None:
    """Create the DENY WRITE ``bindings`` on ``admin``'s cluster, calling ``created`` with each
    one the cluster created (as it answers, before a later refusal fails, naming it)."""
    try:
        futures = admin.create_acls(bindings, request_timeout=ADMIN_TIMEOUT_S)
        for binding, future in futures.items():
            future.result()
            if created is not None:
                created(binding)
    except Exception as exc:
        raise cluster_error(
            admin, "creating DENY WRITE ACLs", exc, "ALTER on the cluster"
        ) from None


def delete_acls(
    admin: ClusterAdmin,
    acls: Sequence[tuple[str, str]],
    deleted: Callable[[tuple[str, str]], None] | None = None,
) -> None:
    """Delete exactly the DENY WRITE ACLs ``(principal, topic)`` on ``admin``'s cluster, calling
    ``deleted`` with each one as the cluster answers (before a later refusal fails)."""
    if not acls:
        return
    filters = deny_write_bindings(acls, as_filter=True)
    try:
        futures = admin.delete_acls(filters, request_timeout=ADMIN_TIMEOUT_S)
        for acl_filter, future in futures.items():
            future.result()
            if deleted is not None:
                deleted(acls[filters.index(acl_filter)])
    except Exception as exc:
        raise cluster_error(
            admin, "removing DENY WRITE ACLs", exc, "ALTER on the cluster"
        ) from None


def fences_file(flow: str) -> Path:
    """The ACLs failovers of ``flow`` created to fence producers (what a failback removes)."""
    source, target = jobs.split_flow(flow)
    return paths.state_dir() / "failover" / f"{source}-{target}" / "fences.json"


def read_fences(flow: str) -> list[dict]:
    """The fences failovers of ``flow`` recorded (``fences.json``), each with its run id."""
    try:
        known = json.loads(fences_file(flow).read_text())
    except (OSError, ValueError):
        return []
    return known if isinstance(known, list) else []


def write_fences(flow: str, fences: list[dict]) -> None:
    """Replace the fences recorded for ``flow`` (``fences.json``) by ``fences``."""
    paths.write_private(fences_file(flow), json.dumps(fences, indent=1) + "\n")


def record_fences(flow: str, run_id: str, acls: list[dict]) -> None:
    """Add the fence ACLs failover run ``run_id`` created to those recorded for ``flow``."""
    known = read_fences(flow)
    stamp = now()
    known += [{**acl, "run_id": run_id, "created": stamp} for acl in acls]
    write_fences(flow, known)
