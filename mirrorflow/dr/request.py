"""What a run of a disaster-recovery workflow is asked to do (:class:`DRRequest`), from a DAG
run's Params or a command's options, checked before any step runs: the flow, its files, the run's
id, and for the workflows that move consumer groups (:class:`GroupsRequest`: the failover's and
the failback's) the group pattern, the principals to fence and whether it is a dry run."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from mirrorflow import paths
from mirrorflow.errors import MirrorflowError
from mirrorflow.replication.spec import MirrorSpec, spec_for_flow
from mirrorflow.runtime import jobs


def check_group_pattern(pattern: str) -> None:
    """A consumer-group pattern must be a Python regex; else one line naming it."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise MirrorflowError(
            f"group pattern {pattern!r} is not a regular expression: {exc}",
            "write a Python regex, e.g. billing.* or .*",
        ) from None


def check_principals(principals: Sequence[str]) -> None:
    """Principals to fence must be names (``alice`` or ``User:alice``); else one line."""
    for principal in principals:
        if not re.fullmatch(r"(User:)?[^\s:,]+", principal):
            raise MirrorflowError(
                f"fence principal {principal!r} is not a principal name",
                "write it as alice or User:alice",
            )


def kafka_principals(principals: Sequence[str]) -> list[str]:
    """The principals as Kafka names them (``User:alice``), sorted, once each."""
    return sorted({p if p.startswith("User:") else f"User:{p}" for p in principals})


def param_list(value: str | Iterable[object] | None) -> tuple[str, ...]:
    """A list Param (or a string of names separated by commas or white space) as strings."""
    items = value or []
    if isinstance(items, str):
        items = [p for p in items.replace(",", "\n").split() if p]
    return tuple(str(p) for p in items)


@dataclass(frozen=True)
class DRRequest:
    """What a run of a workflow was asked to do: the flow ``S->T``, its flow files, the run's
    id (its DAG run id), and (keyword only) the flows' state directory of the mirror job
    (default ``$MIRRORFLOW_STATE/flows``). Each workflow adds its own options."""

    flow: str
    flow_files: tuple[str, ...]
    run_id: str
    state_dir: str | None = field(default=None, kw_only=True)
    if TYPE_CHECKING:
        # The run's mode, read-only: a field of the workflows that have modes (failover,
        # drill), a class constant of the others (failback). Declared for the type checker
        # only: as a field here it would be one of every request.
        @property
        def mode(self) -> str: ...

    # The DAG's Params the request reads: field -> (Param, conversion, default when unset).
    PARAMS: ClassVar[dict[str, tuple[str, Callable[[Any], Any], Any]]] = {}

    def __post_init__(self) -> None:
        jobs.split_flow(self.flow)

    def record(self) -> dict[str, Any]:
        """The options as the run record keeps them (besides the flow files)."""
        raise NotImplementedError

    @classmethod
    def from_params(cls, params: dict[str, Any], **fixed: Any) -> Self:
        """The request of a DAG run with Params ``params`` (``fixed``: flow, flow_files,
        run_id, state_dir), as :attr:`PARAMS` reads them."""
        read = {
            name: convert(params.get(param) or default)
            for name, (param, convert, default) in cls.PARAMS.items()
        }
        return cls(**read, **fixed)

    @property
    def source(self) -> str:
        return jobs.split_flow(self.flow)[0]

    @property
    def target(self) -> str:
        return jobs.split_flow(self.flow)[1]

    def flows_state_dir(self) -> Path:
        return Path(self.state_dir) if self.state_dir else jobs.default_state_dir()

    def flow_dir(self) -> Path:
        return jobs.JobFiles.for_flow(self.flow, self.state_dir).flow_dir(self.flow)

    def flow_paths(self) -> list[Path]:
        """The flow files; a missing one fails, naming it."""
        files = [Path(p) for p in self.flow_files]
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise MirrorflowError(f"flow file(s) not found: {', '.join(missing)}")
        return files

    def spec(self) -> MirrorSpec:
        """The flow's spec; ``${file:…}`` references resolve from the project root, as for the
        mirror job."""
        return spec_for_flow(self.flow_paths(), self.flow, base_dir=paths.project_root())


@dataclass(frozen=True)
class GroupsRequest(DRRequest):
    """A request that moves the consumer groups matching ``group_pattern`` (among those the
    flow checkpoints) and may first fence producers (``fence_principals`` denied WRITE): the
    failover's and the failback's. A dry run computes and reports everything, changes nothing."""

    group_pattern: str = ".*"
    fence_principals: tuple[str, ...] = ()
    dry_run: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_group_pattern(self.group_pattern)
        check_principals(self.fence_principals)

    PARAMS = {
        "group_pattern": ("group_pattern", str, ".*"),
        "fence_principals": ("fence_principals", param_list, ()),
        "dry_run": ("dry_run", bool, False),
    }

    @property
    def principals(self) -> list[str]:
        """The principals to fence, as Kafka names them (``User:alice``)."""
        return kafka_principals(self.fence_principals)

    def record(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "group_pattern": self.group_pattern,
            "fence_principals": self.principals,
            "dry_run": self.dry_run,
        }
