"""Where mirrorflow keeps things: its resources, the project, the download cache, runtime state.

mirrorflow runs from a checkout (``make``, the tests, the demo) or installed from its wheel:

* **Resources** (``templates/``, ``spark_jobs/``, ``jvm/``) are top-level folders of the checkout;
  the wheel carries them as package data in ``mirrorflow/_resources/``. :func:`resource` finds
  them either way.
* **The project root** is where flow files' relative paths (in generated DAGs) are read from and
  where mirror jobs run: the checkout; installed, ``$MIRRORFLOW_PROJECT``, else the current
  directory.
* **State** (broker data, flows' control files, a demo's Airflow home): ``$MIRRORFLOW_STATE``,
  else ``.mirrorflow/`` in the checkout; installed, ``$XDG_STATE_HOME/mirrorflow`` (default
  ``~/.local/state/mirrorflow``).
* **The cache** of heavy downloads (Maven artifacts, the Python environment) lives outside any
  checkout, so fresh clones reuse it.

Every file that holds a secret (a password, a shared key) is mode 0600 inside a directory of mode
0700 (:func:`private_dir`), whatever the umask, and is so from its creation on. One way each:

* :func:`write_private`: a whole file written at once (replaced atomically);
* :func:`open_private`: a file written as it goes (a log a process writes or appends to);
* :func:`make_private`: a file another program wrote (keytool's stores, Airflow's database)
  in a private directory, where nobody else could reach it meanwhile, narrowed to 0600.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent
"""The directory holding the ``mirrorflow`` package: the checkout, or site-packages."""
_PACKAGED = PACKAGE_DIR / "_resources"


def in_checkout() -> bool:
    """Whether mirrorflow runs from a source checkout (not from an installed wheel)."""
    return (PROJECT_ROOT / "pyproject.toml").is_file() and not _PACKAGED.is_dir()


def resource(name: str) -> Path:
    """A resource folder or file (``templates``, ``spark_jobs/mirror.py``, ``jvm``): from the
    wheel's package data when installed, else from the checkout."""
    packaged = _PACKAGED / name
    return packaged if packaged.exists() else PROJECT_ROOT / name


def project_root() -> Path:
    """Where relative flow-file paths are read from and mirror jobs run."""
    if in_checkout():
        return PROJECT_ROOT
    if env := os.environ.get("MIRRORFLOW_PROJECT"):
        return Path(env).resolve()
    return Path.cwd().resolve()


def cache_dir() -> Path:
    """The download cache: ``$MIRRORFLOW_CACHE``, else ``$XDG_CACHE_HOME/mirrorflow``."""
    if env := os.environ.get("MIRRORFLOW_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mirrorflow"


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Runtime state: ``$MIRRORFLOW_STATE``, else ``.mirrorflow/`` in the checkout, else
    ``$XDG_STATE_HOME/mirrorflow``; read from ``environ`` (another process's) or this one's."""
    environ = os.environ if environ is None else environ
    if env := environ.get("MIRRORFLOW_STATE"):
        return Path(env)
    if in_checkout():
        return PROJECT_ROOT / ".mirrorflow"
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "mirrorflow"


def content_hash(files: Iterable[Path], length: int = 12) -> str:
    """A short hash of the files' names and contents, used to key cache entries."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:length]


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner can enter (0700, whatever the umask); created
    with its parents if missing."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def write_private(path: Path, content: str | bytes) -> Path:
    """Write ``content`` (text, or bytes as they are) to ``path`` readable by its owner only:
    mode 0600, in a 0700 directory, whatever the umask. The file is replaced atomically, so a
    reader never sees half of it and an earlier file's wider mode does not survive."""
    path = Path(path)
    private_dir(path.parent)
    return write_atomically(path, content, 0o600)


def open_private(path: Path, mode: str = "w") -> IO[Any]:
    """``path`` opened for writing as it goes (``mode``: ``"w"``, ``"a"``, ``"wb"`` or ``"ab"``:
    truncated or appended to), readable by its owner only: mode 0600 from its creation, in a
    0700 directory, whatever the umask; an existing file's wider mode is narrowed before anything
    is written. For a log a process writes (its standard output); a file written at once goes
    through :func:`write_private`."""
    if mode not in ("w", "a", "wb", "ab"):
        raise ValueError(f"open_private opens for writing or appending, not {mode!r}")
    path = Path(path)
    private_dir(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    out = os.fdopen(os.open(path, flags, 0o600), mode)
    try:
        # O_CREAT's mode is masked by the umask, and ignored if the file existed.
        os.fchmod(out.fileno(), 0o600)
    except BaseException:
        out.close()
        raise
    return out


def make_private(path: Path) -> Path:
    """``path``, a file another program wrote (keytool, Airflow), narrowed to mode 0600. Only for
    files inside a :func:`private_dir`, where nobody else could open them before; a file mirrorflow
    writes itself goes through :func:`write_private` or :func:`open_private`."""
    path = Path(path)
    os.chmod(path, 0o600)
    return path


def write_atomically(path: Path, content: str | bytes, mode: int) -> Path:
    """Replace ``path`` with ``content`` (text, or bytes as they are) at once (a reader never
    sees half of it), the file of ``mode`` whatever the umask and whatever mode an earlier file
    had."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb" if isinstance(content, bytes) else "w") as out:
            os.fchmod(fd, mode)  # O_CREAT's mode is masked by the umask, ignored if it existed
            out.write(content)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path
