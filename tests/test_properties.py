"""Java .properties files are read as java.util.Properties reads them, with each key's line."""

from __future__ import annotations

import pytest

from mirrorflow.config import properties
from mirrorflow.errors import MirrorflowError


def _pairs(text: str) -> list[tuple[str, str, int]]:
    return [(p.key, p.value, p.location.line) for p in properties.parse(text, "f")]


def test_equals_colon_and_whitespace_all_separate_key_from_value():
    text = "a=1\nb : 2\nc 3\nd\t=\t4\ne\n"
    assert _pairs(text) == [
        ("a", "1", 1),
        ("b", "2", 2),
        ("c", "3", 3),
        ("d", "4", 4),
        ("e", "", 5),
    ]


def test_continuation_joins_lines_dropping_leading_whitespace_and_keeps_the_first_line():
    text = (
        "jaas = org.apache.kafka.common.security.plain.PlainLoginModule required \\\n"
        '   username="mm2" password="s";\n'
        "next = 1\n"
    )
    assert _pairs(text) == [
        ("jaas", 'org.apache.kafka.common.security.plain.PlainLoginModule required username="mm2" '
         'password="s";', 1),
        ("next", "1", 3),
    ]  # fmt: skip


def test_comments_start_only_at_the_beginning_of_a_line():
    text = "# comment\n  ! also a comment\ntopics = .*   # not a comment\n"
    assert _pairs(text) == [("topics", ".*   # not a comment", 3)]


def test_escapes_are_resolved_in_keys_and_values():
    text = "a\\ b\\:c = x\\ty\\u0041\\=\\\\\n"
    assert _pairs(text) == [("a b:c", "x\tyA=\\", 1)]


def test_windows_line_endings_count_lines_like_unix_ones():
    assert _pairs("a=1\r\n\r\nb=2\r\n") == [("a", "1", 1), ("b", "2", 3)]


def test_every_definition_of_a_repeated_key_is_kept_in_file_order():
    assert _pairs("k=1\nk=2\n") == [("k", "1", 1), ("k", "2", 2)]


def test_files_are_decoded_as_iso_8859_1_like_mirrormaker(tmp_path):
    path = tmp_path / "mm2.properties"
    path.write_bytes("group = café\n".encode())
    [prop] = properties.load(path)
    assert prop.value == "cafÃ©"  # what MM2 sees for UTF-8 bytes


def test_malformed_unicode_escape_is_an_error_naming_file_and_line():
    with pytest.raises(MirrorflowError, match=r"^f:2: malformed \\uXXXX escape"):
        properties.parse("a=1\nb=\\u12\n", "f")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("plain.key", "host:9092,other:9092"),
        ("key with spaces:and=signs", "value with # and ! inside"),
        ("#starts-like-a-comment", "  leading spaces"),
        ("tabs\tand\nnewlines", "back\\slash\r\f"),
        ("unicode", "café ☕ 😀"),
        ("empty", ""),
    ],
)
def test_formatted_lines_read_back_to_the_same_key_and_value(key, value):
    [prop] = properties.parse(properties.format_line(key, value) + "\n")
    assert (prop.key, prop.value) == (key, value)
