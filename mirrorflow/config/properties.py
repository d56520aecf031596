"""Java ``.properties`` files, read exactly as MirrorMaker 2 reads them, keeping where each key is.

MirrorMaker 2 loads its file with ``java.util.Properties.load(InputStream)``: bytes are ISO-8859-1,
keys end at the first unescaped ``=``, ``:`` or whitespace, ``\\`` continues a line, ``#`` and ``!``
start comments only at the beginning of a line, and the last definition of a key wins. Parsing is
done by the ``javaproperties`` library; this module adds the file and line of every definition
(for findings) and writes files back with as little escaping as Java needs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import javaproperties

from mirrorflow.errors import MirrorflowError

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Location:
    """Where a setting was defined: a file and a 1-based line."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Property:
    """One ``key = value`` definition as Java reads it (escapes resolved, continuations joined);
    ``source`` is the text as written, for a properties file."""

    key: str
    value: str
    location: Location
    source: str | None = None


def parse(text: str, file: str = "<string>") -> list[Property]:
    """Every definition in ``text``, in file order (duplicates kept: the last one wins in Java)."""
    found: list[Property] = []
    line = 1
    try:
        for element in javaproperties.parse(text):
            if isinstance(element, javaproperties.KeyValue):
                location = Location(file, line)
                found.append(Property(element.key, element.value, location, element.source))
            line += len(_LINE_BREAK.findall(element.source))
    except javaproperties.InvalidUEscapeError as exc:
        raise MirrorflowError(
            f"{file}:{line}: malformed \\uXXXX escape {exc.escape!r}; Java refuses the whole file",
            "write exactly four hex digits after \\u, or \\\\u for a literal backslash-u",
        ) from None
    return found


def load(path: Path) -> list[Property]:
    """The definitions in a properties file, decoded as ISO-8859-1 like MirrorMaker 2 does."""
    try:
        data = path.read_bytes()
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        reason = getattr(exc, "strerror", None) or str(exc)
        raise MirrorflowError(
            f"cannot read {path!s:.200}: {reason}", "check the path and its permissions"
        ) from None
    return parse(data.decode("iso-8859-1"), str(path))


def format_line(key: str, value: str) -> str:
    """``key = value`` escaped so that Java reads back exactly ``key`` and ``value``."""
    return f"{_escape(key, is_key=True)} = {_escape(value, is_key=False)}"


_SPECIAL = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}


def _escape(text: str, *, is_key: bool) -> str:
    out = []
    for i, ch in enumerate(text):
        if ch in _SPECIAL:
            out.append(_SPECIAL[ch])
        elif (is_key and ch in " =:") or (i == 0 and ch in " #!"):
            out.append("\\" + ch)
        elif not " " <= ch <= "~":
            out.append("".join(f"\\u{unit:04x}" for unit in _utf16_units(ch)))
        else:
            out.append(ch)
    return "".join(out)


def _utf16_units(ch: str) -> list[int]:
    data = ch.encode("utf-16-be")
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]
