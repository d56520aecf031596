"""Where mirrorflow keeps things: the project checkout, the download cache, runtime state.

Heavy downloads (Maven artifacts, the Python environment) live in a cache outside the
checkout so fresh clones reuse them; runtime state (broker data, logs, connection files)
lives in a state directory that each command or test session chooses.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """The download cache: ``$MIRRORFLOW_CACHE``, else ``$XDG_CACHE_HOME/mirrorflow``."""
    if env := os.environ.get("MIRRORFLOW_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mirrorflow"


def state_dir() -> Path:
    """Runtime state: ``$MIRRORFLOW_STATE``, else ``.mirrorflow/`` in the project checkout."""
    if env := os.environ.get("MIRRORFLOW_STATE"):
        return Path(env)
    return PROJECT_ROOT / ".mirrorflow"


def content_hash(files: Iterable[Path], length: int = 12) -> str:
    """A short hash of the files' names and contents, used to key cache entries."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:length]
