"""Topic, group and topic-config filters with MirrorMaker 2's semantics, and Java regexes.

MM2 (``MirrorUtils.compilePatternList``) joins a LIST of patterns with ``|`` into one Java regex and
requires a full match; an empty list compiles to nothing and matches nothing. A name passes a
filter when it matches the include list and not the exclude list.

Java's regex dialect is translated to Python's where both mean the same: ``\\Q…\\E`` quoting,
named groups ``(?<n>…)``, ``\\k<n>``, ASCII POSIX classes (``\\p{Lower}`` …), ``\\h``, ``\\v``,
``\\z``, ``\\Z``, ``\\e``, ``\\cX``, ``\\x{…}``, ``\\0`` octal; possessive quantifiers and atomic
groups are native in Python 3.11. Patterns are compiled with ``re.ASCII`` because Java's ``\\w``,
``\\d``, ``\\s`` and case folding are ASCII unless asked otherwise. What Python cannot express
(Unicode and ``java*`` property classes, class unions and intersections, ``\\G``, ``\\R``, ``\\X``,
inline flags in mid-pattern, ``u``/``U``/``d`` flags) and what Java itself rejects (a ``{`` that
is not a repetition, ``(?P…)``, ``(?#…)``) raise :class:`JavaRegexError`. Known residual
difference: Java's ``.`` and ``$`` also treat ``\\r``, U+0085, U+2028 and U+2029 as line ends,
which Kafka topic names cannot contain.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from mirrorflow.mm2 import configdefs
from mirrorflow.mm2.policy import load_class


class JavaRegexError(ValueError):
    """A pattern that is not valid Java, or that Python cannot match the same way."""


_POSIX = {
    "Lower": "a-z",
    "Upper": "A-Z",
    "ASCII": "\\x00-\\x7f",
    "Alpha": "a-zA-Z",
    "Digit": "0-9",
    "Alnum": "a-zA-Z0-9",
    "Punct": "!-/:-@\\[-`{-~",
    "Graph": "!-~",
    "Print": " -~",
    "Blank": " \\t",
    "Cntrl": "\\x00-\\x1f\\x7f",
    "XDigit": "0-9a-fA-F",
    "Space": " \\t\\n\\x0b\\f\\r",
}
_JAVA_SHORTHANDS = {  # class body, and whether the escape is the negated class
    "h": (" \\t\\xa0\\u1680\\u180e\\u2000-\\u200a\\u202f\\u205f\\u3000", False),
    "H": (" \\t\\xa0\\u1680\\u180e\\u2000-\\u200a\\u202f\\u205f\\u3000", True),
    "v": ("\\n\\x0b\\f\\r\\x85\\u2028\\u2029", False),
    "V": ("\\n\\x0b\\f\\r\\x85\\u2028\\u2029", True),
}
_UNSUPPORTED_ESCAPES = {
    "G": "\\G (end of the previous match)",
    "R": "\\R (any line break sequence)",
    "X": "\\X (extended grapheme cluster)",
    "U": "\\U (not an escape in Java)",
}
_REPETITION = re.compile(r"\{[0-9]+(,[0-9]*)?\}")
_INLINE_FLAGS = re.compile(r"\(\?([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])")
_JAVA_FLAGS = set("idmsuxU")
_PYTHON_FLAGS = set("imsx")


def translate_java_regex(pattern: str) -> str:
    """The Python equivalent of a Java regex (to compile with ``re.ASCII``)."""
    out: list[str] = []
    class_body_start = -1  # index of the first character inside the open class, -1 outside
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        in_class = class_body_start >= 0
        if ch == "\\":
            text, i = _escape(pattern, i, in_class)
            out.append(text)
            continue
        if in_class:
            if ch == "[":
                raise JavaRegexError("a nested character class (Java union, e.g. [a[b]])")
            if pattern.startswith("&&", i):
                raise JavaRegexError("a character class intersection (&&)")
            if ch == "]" and i > class_body_start:  # a leading ']' is literal in both dialects
                class_body_start = -1
        elif ch == "[":
            class_body_start = i + (2 if pattern.startswith("^", i + 1) else 1)
        elif ch == "{":
            match = _REPETITION.match(pattern, i)
            if not match:
                raise JavaRegexError(
                    f"'{{' at index {i} is not a repetition {{n}}, {{n,}} or {{n,m}} (Java "
                    "rejects it: Illegal repetition); write \\{ for a literal brace"
                )
            out.append(match.group())
            i = match.end()
            continue
        elif pattern.startswith("(?", i):
            source = _group_opening_source(pattern, i)
            out.append(_group_opening(pattern, i, source))
            i += len(source)
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _group_opening_source(pattern: str, i: int) -> str:
    named = re.compile(r"\(\?<([a-zA-Z][a-zA-Z0-9]*)>").match(pattern, i)
    if named:
        return named.group()
    flags = _INLINE_FLAGS.match(pattern, i)
    return flags.group() if flags else pattern[i : i + 2]


def _group_opening(pattern: str, i: int, source: str) -> str:
    if source.startswith("(?<") and source.endswith(">"):
        return "(?P<" + source[3:]
    if pattern.startswith(("(?P", "(?#"), i):
        raise JavaRegexError(f"{pattern[i : i + 3]} is Python syntax; Java rejects it")
    flags = _INLINE_FLAGS.match(pattern, i)
    if flags and (flags.group(1) or flags.group(2) is not None):
        used = set(flags.group(1) + (flags.group(2) or ""))
        if not used <= _JAVA_FLAGS:
            raise JavaRegexError(f"unknown inline flag in {source}")
        if not used <= _PYTHON_FLAGS:
            raise JavaRegexError(
                f"inline flag {''.join(sorted(used - _PYTHON_FLAGS))} in {source} "
                "(UNIX_LINES / Unicode case or classes) has no Python equivalent"
            )
        if flags.group(3) == ")" and i != 0:
            raise JavaRegexError(
                f"inline flags {source} after the start of the pattern (including a later "
                "list item); scope them instead, e.g. (?i:name)"
            )
    return source


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """Translate the escape starting at ``pattern[i] == '\\\\'``; return it and the next index."""
    if i + 1 >= len(pattern):
        raise JavaRegexError("a trailing backslash")
    code = pattern[i + 1]
    if code == "Q":
        end = pattern.find("\\E", i + 2)
        literal = pattern[i + 2 :] if end < 0 else pattern[i + 2 : end]
        return re.escape(literal), len(pattern) if end < 0 else end + 2
    if code in "pP":
        return _property_class(pattern, i, in_class)
    if code in _JAVA_SHORTHANDS:
        body, negated = _JAVA_SHORTHANDS[code]
        if in_class and negated:
            raise JavaRegexError(f"\\{code} inside a character class")
        return (body if in_class else f"[{'^' if negated else ''}{body}]"), i + 2
    if code in _UNSUPPORTED_ESCAPES:
        raise JavaRegexError(_UNSUPPORTED_ESCAPES[code] + " has no Python equivalent")
    if code == "z":
        return "\\Z", i + 2
    if code == "Z":
        return "(?=(?:\\r\\n|[\\n\\r\\x85\\u2028\\u2029])?\\Z)", i + 2
    if code == "e":
        return "\\x1b", i + 2
    if code == "c" and i + 2 < len(pattern):
        return _char(ord(pattern[i + 2]) ^ 64), i + 3
    if code == "x" and pattern.startswith("{", i + 2):
        end = _closing(pattern, i + 3, "}")
        try:
            value = int(pattern[i + 3 : end], 16)
        except ValueError:
            raise JavaRegexError("a malformed \\x{...} escape") from None
        return _char(value), end + 1
    if code == "0":
        digits = re.match(r"[0-3][0-7]{2}|[0-7]{1,2}", pattern[i + 2 : i + 5])
        if not digits:
            raise JavaRegexError("\\0 must be followed by octal digits in Java")
        return _char(int(digits.group(), 8)), i + 2 + len(digits.group())
    if code == "N" and pattern.startswith("{", i + 2):
        end = _closing(pattern, i + 3, "}")
        return pattern[i : end + 1], end + 1
    if code == "k" and pattern.startswith("<", i + 2):
        end = _closing(pattern, i + 3, ">")
        return f"(?P={pattern[i + 3 : end]})", end + 1
    return pattern[i : i + 2], i + 2


def _property_class(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    negated = pattern[i + 1] == "P"
    if pattern.startswith("{", i + 2):
        end = _closing(pattern, i + 3, "}")
        name, after = pattern[i + 3 : end], end + 1
    else:
        name, after = pattern[i + 2 : i + 3], i + 3
    source = pattern[i:after]
    body = _POSIX.get(name.removeprefix("Is"))
    if body is None:
        raise JavaRegexError(
            f"{source} has no Python equivalent (only the ASCII POSIX classes "
            f"\\p{{Lower}}, \\p{{Alpha}}, … translate); spell out the characters, e.g. [a-z]"
        )
    if in_class and negated:
        raise JavaRegexError(f"{source} inside a character class")
    return (body if in_class else f"[{'^' if negated else ''}{body}]"), after


def _closing(pattern: str, start: int, char: str) -> int:
    end = pattern.find(char, start)
    if end < 0:
        raise JavaRegexError(f"an escape at index {start - 3} is missing its closing {char}")
    return end


def _char(code_point: int) -> str:
    return f"\\U{code_point:08x}" if code_point > 0xFFFF else f"\\u{code_point:04x}"


def compile_java_regex(pattern: str) -> re.Pattern[str]:
    """A Python regex matching exactly what the Java ``pattern`` matches."""
    try:
        return re.compile(translate_java_regex(pattern), re.ASCII)
    except re.error as exc:
        raise JavaRegexError(str(exc)) from None


def compile_pattern_list(patterns: list[str]) -> re.Pattern[str] | None:
    """``MirrorUtils.compilePatternList``: the items joined with ``|``; None (matches nothing)
    for an empty list."""
    return compile_java_regex("|".join(patterns)) if patterns else None


@dataclass(frozen=True)
class PatternList:
    """One LIST setting of patterns (e.g. ``topics.exclude``), matched as MM2 matches it."""

    key: str
    patterns: tuple[str, ...]
    regex: re.Pattern[str] | None

    @classmethod
    def from_config(cls, config: Mapping[str, str], key: str) -> PatternList:
        raw = config.get(key, configdefs.flow_settings()[key].default or "")
        patterns = configdefs.parse_list(raw)
        try:
            return cls(key, tuple(patterns), compile_pattern_list(patterns))
        except JavaRegexError as exc:
            raise JavaRegexError(f"{key} = {raw}: {exc}") from None

    def matches(self, name: str) -> bool:
        return self.regex is not None and self.regex.fullmatch(name) is not None

    def matching_pattern(self, name: str) -> str:
        """The list item that matches ``name`` (the whole list if only the join matches)."""
        for pattern in self.patterns:
            try:
                if compile_java_regex(pattern).fullmatch(name):
                    return pattern
            except JavaRegexError:
                continue
        return ", ".join(self.patterns)


class _IncludeExcludeFilter:
    """``included && !excluded`` over two pattern lists; ``why_not`` explains a rejection."""

    include_key = ""
    exclude_key = ""

    def configure(self, config: Mapping[str, str]) -> None:
        self.include = PatternList.from_config(config, self.include_key)
        self.exclude = PatternList.from_config(config, self.exclude_key)

    def why_not(self, name: str) -> str | None:
        """None if ``name`` passes, else why not (naming the setting and pattern)."""
        if not self.include.matches(name):
            listed = ", ".join(self.include.patterns) or "(empty: matches nothing)"
            return f"not included by {self.include.key} = {listed}"
        if self.exclude.matches(name):
            return f"excluded by {self.exclude.key} pattern {self.exclude.matching_pattern(name)}"
        return None


class TopicFilter:
    """``topic.filter.class``: which source topics a flow replicates (before MM2's own checks)."""

    def configure(self, config: Mapping[str, str]) -> None:
        """Read settings from the flow's connector configuration (default: none)."""

    def should_replicate_topic(self, topic: str) -> bool:
        raise NotImplementedError

    def why_not(self, topic: str) -> str | None:
        """None if ``topic`` passes, else why not."""
        return None if self.should_replicate_topic(topic) else f"rejected by {type(self).__name__}"


class GroupFilter:
    """``group.filter.class``: which consumer groups a flow checkpoints."""

    def configure(self, config: Mapping[str, str]) -> None:
        """Read settings from the flow's connector configuration (default: none)."""

    def should_replicate_group(self, group: str) -> bool:
        raise NotImplementedError

    def why_not(self, group: str) -> str | None:
        """None if ``group`` passes, else why not."""
        return None if self.should_replicate_group(group) else f"rejected by {type(self).__name__}"


class ConfigPropertyFilter:
    """``config.property.filter.class``: which topic config properties are synced."""

    def configure(self, config: Mapping[str, str]) -> None:
        """Read settings from the flow's connector configuration (default: none)."""

    def should_replicate_config_property(self, prop: str) -> bool:
        raise NotImplementedError

    def should_replicate_source_default(self, prop: str) -> bool:
        """Whether a property at its default on the source is set (not deleted) on the target."""
        return False


class DefaultTopicFilter(_IncludeExcludeFilter, TopicFilter):
    include_key, exclude_key = "topics", "topics.exclude"

    def should_replicate_topic(self, topic: str) -> bool:
        return self.why_not(topic) is None


class DefaultGroupFilter(_IncludeExcludeFilter, GroupFilter):
    include_key, exclude_key = "groups", "groups.exclude"

    def should_replicate_group(self, group: str) -> bool:
        return self.why_not(group) is None


class DefaultConfigPropertyFilter(ConfigPropertyFilter):
    """Everything but ``config.properties.exclude``; defaults taken from ``use.defaults.from``."""

    def configure(self, config: Mapping[str, str]) -> None:
        self.exclude = PatternList.from_config(config, "config.properties.exclude")
        default = configdefs.FILTER_ONLY["use.defaults.from"]
        self.use_defaults_from = configdefs.java_trim(config.get("use.defaults.from", default))

    def should_replicate_config_property(self, prop: str) -> bool:
        return not self.exclude.matches(prop)

    def should_replicate_source_default(self, prop: str) -> bool:
        return self.use_defaults_from == "source"


_MIRROR = "org.apache.kafka.connect.mirror."
_FILTERS: dict[str, tuple[type, type]] = {
    "topic.filter.class": (TopicFilter, DefaultTopicFilter),
    "group.filter.class": (GroupFilter, DefaultGroupFilter),
    "config.property.filter.class": (ConfigPropertyFilter, DefaultConfigPropertyFilter),
}


def filter_class(key: str, name: str) -> type:
    """The class a ``*.filter.class`` setting names: MM2's default (ported here) or a Python
    class by dotted path subclassing the matching base class."""
    base, builtin = _FILTERS[key]
    return load_class(configdefs.java_trim(name), {_MIRROR + builtin.__name__: builtin}, base, key)


def load_topic_filter(config: Mapping[str, str]) -> TopicFilter:
    """The filter ``topic.filter.class`` names, configured with the flow's config."""
    return _load(config, "topic.filter.class")


def load_group_filter(config: Mapping[str, str]) -> GroupFilter:
    """The filter ``group.filter.class`` names, configured with the flow's config."""
    return _load(config, "group.filter.class")


def load_config_property_filter(config: Mapping[str, str]) -> ConfigPropertyFilter:
    """The filter ``config.property.filter.class`` names, configured with the flow's config."""
    return _load(config, "config.property.filter.class")


def _load(config: Mapping[str, str], key: str):
    instance = filter_class(key, config.get(key, configdefs.flow_settings()[key].default or ""))()
    instance.configure(config)
    return instance
