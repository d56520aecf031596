"""A validation finding: where, which key, what is wrong and how to fix it, one line each."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Literal

from mirrorflow.config.properties import Location, Property

Severity = Literal["error", "warning"]
#: A value's trailing ``# comment`` or ``// comment``, which Java's properties keep in the value.
TRAILING_COMMENT = re.compile(r"\s(#|//)")


@dataclass(frozen=True)
class Finding:
    """One problem: where, which key, what is wrong and how to fix it."""

    severity: Severity
    location: Location
    key: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.location}: {self.severity}: {self.key}: {self.problem}; fix: {self.fix}"

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "location": str(self.location)}


def at(prop: Property, severity: Severity, problem: str, fix: str) -> Finding:
    """A finding at ``prop``'s definition."""
    return Finding(severity, prop.location, prop.key, problem, fix)
