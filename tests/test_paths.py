"""mirrorflow.paths' private files: mode 0600 from their creation on, whatever the umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from mirrorflow import paths


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """A umask that would leave every new file open to all."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("open_umask")
def test_write_private_writes_bytes_as_they_are_and_text(tmp_path):
    blob = bytes(range(256))
    stored = paths.write_private(tmp_path / "keys" / "store.p12", blob)
    text = paths.write_private(tmp_path / "keys" / "secret.json", '{"a": "é"}\n')
    assert stored.read_bytes() == blob
    assert text.read_text() == '{"a": "é"}\n'
    for path in (stored, text):
        assert mode(path) == 0o600
    assert mode(tmp_path / "keys") == 0o700
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["secret.json", "store.p12"]


@pytest.mark.usefixtures("open_umask")
def test_open_private_is_private_before_anything_is_written(tmp_path):
    log = tmp_path / "logs" / "service.log"
    with paths.open_private(log, "wb") as out:
        assert mode(log) == 0o600  # already, while it is empty and open
        assert mode(log.parent) == 0o700
        out.write(b"first\n")
    with paths.open_private(log, "a") as out:
        out.write("second\n")
    assert log.read_text() == "first\nsecond\n"
    with paths.open_private(log, "w") as out:
        out.write("again\n")
    assert log.read_text() == "again\n"
    assert mode(log) == 0o600


@pytest.mark.usefixtures("open_umask")
def test_open_private_narrows_an_existing_files_mode_before_it_writes(tmp_path):
    log = tmp_path / "service.log"
    log.write_text("kept\n")
    log.chmod(0o644)
    with paths.open_private(log, "ab") as out:
        assert mode(log) == 0o600
        out.write(b"appended\n")
    assert log.read_text() == "kept\nappended\n"


def test_open_private_only_writes(tmp_path):
    for wrong in ("r", "r+", "x", "w+"):
        with pytest.raises(ValueError, match="writing or appending"):
            paths.open_private(tmp_path / "log", wrong)
    assert not (tmp_path / "log").exists()


def test_make_private_narrows_a_file_another_program_wrote(tmp_path):
    written = paths.private_dir(tmp_path / "home") / "airflow.db"
    written.write_text("tables")
    written.chmod(0o644)
    assert paths.make_private(written) == written
    assert mode(written) == 0o600
    assert written.read_text() == "tables"
    with pytest.raises(FileNotFoundError):
        paths.make_private(tmp_path / "home" / "missing")
