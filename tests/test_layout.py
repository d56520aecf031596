"""The code map in docs/development.md (*Layout*) matches the tree: every top-level folder and
file, every folder of ``mirrorflow/`` and every module in it is listed, and every path the table
names exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "development.md"
ROW = re.compile(r"^\| `([^`]+)` \| (.*) \|$")
CODE = re.compile(r"`([^`]+)`")
# A code span is taken for a path when it is one word of these characters and either holds a
# slash or ends like a file of the checkout; `trend.json` (a file a job writes) or
# `mirrorflow render` are not.
PATH_LIKE = re.compile(r"^[\w.*/-]+$")
FILE_ENDINGS = (".py", ".j2", ".java", ".xml", ".sh", ".yaml", ".toml", ".md", ".properties")


def layout() -> dict[str, str]:
    """The table's rows: path -> what it holds."""
    text = PAGE.read_text()
    assert "\n## Layout\n" in text, f"{PAGE} has no section 'Layout'"
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            assert match[1] not in rows, f"{match[1]} has two rows"
            rows[match[1]] = match[2]
    assert rows, f"no table under 'Layout' in {PAGE}"
    return rows


def tree() -> list[str]:
    """The checkout's files: tracked, and new ones not ignored (a module not added yet counts)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout: {e}")
    return sorted(f for f in set(listed) if (ROOT / f).is_file())


def folder(path: str) -> Path:
    """The folder a row speaks of: the row's path, or its file's folder."""
    return ROOT / path if path.endswith("/") else (ROOT / path).parent


def names(row: str, description: str) -> set[str]:
    """The code spans of a row."""
    return set(CODE.findall(description)) | {row}


def test_the_layout_table_lists_every_folder_package_and_module() -> None:
    rows = layout()
    files = tree()
    missing = []
    for top in sorted({f.split("/", 1)[0] for f in files if "/" in f}):
        if not any(r == f"{top}/" or r.startswith(f"{top}/") for r in rows):
            missing.append(f"{top}/ (a top-level folder)")
    for name in sorted(f for f in files if "/" not in f and not f.startswith(".")):
        if name not in rows:
            missing.append(f"{name} (a top-level file)")
    library = [f for f in files if f.startswith("mirrorflow/")]
    for directory in sorted({f.rsplit("/", 1)[0] + "/" for f in library}):
        if directory not in rows:
            missing.append(f"{directory} (a folder of the library: a row of its own)")
            continue
        named = names(directory, rows[directory])
        for f in library:
            base = f.rsplit("/", 1)[1]
            in_row = f.rsplit("/", 1)[0] + "/" == directory and base != "__init__.py"
            if in_row and base not in named:
                missing.append(f"{f} (in the row of {directory})")
    assert missing == [], "docs/development.md's Layout misses:\n" + "\n".join(missing)


def test_the_layout_table_names_nothing_that_does_not_exist() -> None:
    rows = layout()
    absent = []
    for row, description in rows.items():
        if not (ROOT / row).exists() or (row.endswith("/") and not (ROOT / row).is_dir()):
            absent.append(f"row {row}")
            continue
        base = folder(row)
        for name in sorted(set(CODE.findall(description))):
            if not PATH_LIKE.match(name) or re.fullmatch(r"\.\w+", name):  # `.properties`
                continue
            if "/" not in name and not name.endswith(FILE_ENDINGS):
                continue
            candidates = [base / name, ROOT / name]
            if any(c.exists() for c in candidates):
                continue
            if any(base.glob(name)) or any(base.rglob(name.rstrip("/"))):
                continue
            absent.append(f"{name} (in the row of {row})")
    assert absent == [], "docs/development.md's Layout names what is not there:\n" + "\n".join(
        absent
    )
