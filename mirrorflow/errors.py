"""The one exception type mirrorflow raises for problems a user can fix.

Every error names its culprit (a file and line, a cluster, a flag, a process) and what to do
about it; the command line prints it as one line instead of a stack trace.
"""

from __future__ import annotations


class MirrorflowError(Exception):
    """A problem the user can act on: ``message`` says what is wrong, ``hint`` what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ClusterUnreachable(MirrorflowError):
    """A cluster did not answer in time: worth trying again later, unlike other errors."""
