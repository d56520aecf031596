"""Topic, group and config filters match as MirrorMaker 2 matches, in Java's regex dialect."""

from __future__ import annotations

import pytest

from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2.filters import (
    DefaultTopicFilter,
    JavaRegexError,
    TopicFilter,
    compile_java_regex,
    compile_pattern_list,
    load_config_property_filter,
    load_group_filter,
    load_topic_filter,
)


def test_patterns_must_match_the_whole_name():
    topics = load_topic_filter({"topics": "orders"})
    assert topics.should_replicate_topic("orders")
    assert not topics.should_replicate_topic("orders-eu")
    assert not topics.should_replicate_topic("old-orders")


def test_a_list_is_split_on_commas_and_joined_into_one_regex():
    assert compile_pattern_list(["foo.*", "bar"]).pattern == "foo.*|bar"
    # Joined, "(a" and "b)" make one valid group, as in MM2.
    topics = load_topic_filter({"topics": "(a, b)"})
    assert topics.should_replicate_topic("a") and topics.should_replicate_topic("b")


def test_an_empty_list_matches_nothing():
    assert compile_pattern_list([]) is None
    topics = load_topic_filter({"topics": "  "})
    assert not topics.should_replicate_topic("orders")
    assert topics.why_not("orders") == "not included by topics = (empty: matches nothing)"


def test_a_trailing_comma_adds_an_empty_pattern_that_matches_the_empty_name():
    groups = load_group_filter({"groups": "app,"})
    assert groups.should_replicate_group("app") and groups.should_replicate_group("")


def test_default_exclusions_of_mirrormaker_4():
    topics = load_topic_filter({})
    assert not topics.should_replicate_topic("mm2-offsets.A.internal")
    assert not topics.should_replicate_topic("orders.replica")
    assert not topics.should_replicate_topic("__consumer_offsets")
    assert topics.should_replicate_topic("orders.internal")
    groups = load_group_filter({})
    for group in ("console-consumer-42", "connect-mm2", "__share"):
        assert not groups.should_replicate_group(group)
    assert groups.should_replicate_group("billing")


def test_rejections_name_the_setting_and_the_pattern_that_matched():
    topics = load_topic_filter({"topics": "orders.*, tmp-.*", "topics.exclude": "x, .*-test"})
    assert topics.why_not("orders-test") == "excluded by topics.exclude pattern .*-test"
    assert topics.why_not("users") == "not included by topics = orders.*, tmp-.*"
    assert topics.why_not("tmp-1") is None


def test_config_property_filter_excludes_mm2_defaults_and_reads_use_defaults_from():
    configs = load_config_property_filter({})
    assert not configs.should_replicate_config_property("min.insync.replicas")
    assert configs.should_replicate_config_property("retention.ms")
    assert not configs.should_replicate_source_default("retention.ms")
    source = load_config_property_filter(
        {"config.properties.exclude": "retention\\..*", "use.defaults.from": "source"}
    )
    assert not source.should_replicate_config_property("retention.bytes")
    assert source.should_replicate_config_property("min.insync.replicas")
    assert source.should_replicate_source_default("retention.ms")


@pytest.mark.parametrize(
    ("java", "matches", "rejects"),
    [
        (r"\Qorders.v1\E", "orders.v1", "ordersXv1"),
        (r"(?<env>prod|dev)-\k<env>", "prod-prod", "prod-dev"),
        (r"[\p{Lower}_]+", "a_b", "A_b"),
        (r"\p{Upper}\P{Digit}", "Ax", "A1"),
        (r"\x{41}\0102\e?", "AB", "AC"),
        (r"a\h+b", "a \tb", "a\nb"),
        ("x{2}", "xx", "x{2}"),
        ("(?i)orders", "ORDERS", "orders2"),
        ("a++b|(?>c)d", "aab", "ab+"),
        (r"\w+", "abc_1", "é"),  # Java's \w is ASCII-only
        (r"end\z", "end", "end\n"),
        ("end\\Z\n", "end\n", "end\n\n"),  # \Z: before a final line terminator
    ],
)
def test_java_regex_constructs_translate_to_the_same_matches(java, matches, rejects):
    regex = compile_java_regex(java)
    assert regex.fullmatch(matches)
    assert not regex.fullmatch(rejects)


@pytest.mark.parametrize(
    ("java", "reason"),
    [
        (r"\p{javaLowerCase}+", r"\\p\{javaLowerCase\} has no Python equivalent"),
        (r"\p{L}", r"\\p\{L\} has no Python equivalent"),
        ("[a-z&&[^e]]", "intersection"),
        ("[a[b]]", "nested character class"),
        ("orders|(?i)payments", "inline flags .* after the start"),
        ("(?u)x", "no Python equivalent"),
        (r"\Ga", r"\\G"),
        ("{orders}", "Illegal repetition"),
        ("a{,3}", "Illegal repetition"),
        ("(?P<n>x)", "Python syntax"),
        ("(unclosed", "missing \\)"),
        ("(?<=a+)b", "look-behind requires fixed-width"),
    ],
)
def test_what_python_cannot_express_or_java_rejects_is_refused(java, reason):
    with pytest.raises(JavaRegexError, match=reason):
        compile_java_regex(java)


def test_filters_report_an_invalid_pattern_with_its_key_and_value():
    with pytest.raises(JavaRegexError, match=r"^topics.exclude = \{bad\}: '\{' at index 0"):
        load_topic_filter({"topics.exclude": "{bad}"})


class OnlyEvenLengthTopics(TopicFilter):
    def should_replicate_topic(self, topic: str) -> bool:
        return len(topic) % 2 == 0


def test_custom_filters_load_by_python_dotted_path_and_explain_rejections():
    topics = load_topic_filter({"topic.filter.class": f"{__name__}.OnlyEvenLengthTopics"})
    assert topics.should_replicate_topic("ab")
    assert topics.why_not("abc") == "rejected by OnlyEvenLengthTopics"


def test_mm2s_default_filter_class_name_selects_the_port():
    name = "org.apache.kafka.connect.mirror.DefaultTopicFilter"
    assert isinstance(load_topic_filter({"topic.filter.class": name}), DefaultTopicFilter)
    with pytest.raises(MirrorflowError, match="Java class mirrorflow cannot run"):
        load_topic_filter({"topic.filter.class": "com.acme.TopicFilter"})


class CountingTopics(TopicFilter):
    """A plugged-in filter that may change its mind: it counts its questions."""

    asked: list[str] = []

    def should_replicate_topic(self, topic: str) -> bool:
        CountingTopics.asked.append(topic)
        return True


def test_a_flow_decides_a_topic_once_with_mm2s_classes_and_asks_a_plugged_in_one_each_time(
    tmp_path, monkeypatch
):
    """A job asks for every topic of its source at each refresh and for each heartbeat topic at
    each beat: MirrorMaker 2's policy and filter (ported, pure) answer once per topic; a Python
    class plugged in is asked every time, as MirrorMaker 2 asks its classes."""
    from mirrorflow.config.topology import load_topology

    asked: list[str] = []
    why_not = DefaultTopicFilter.why_not

    def counted(self, topic):
        asked.append(topic)
        return why_not(self, topic)

    monkeypatch.setattr(DefaultTopicFilter, "why_not", counted)
    flows = tmp_path / "mm2.properties"
    flows.write_text(
        "clusters = a, b\na.bootstrap.servers = x:1\nb.bootstrap.servers = y:1\n"
        "a->b.enabled = true\na->b.topics = orders.*\n"
    )
    flow = load_topology([flows]).flow("a->b")
    for _ in range(3):
        assert flow.should_replicate_topic("orders")
        assert not flow.should_replicate_topic("payments")
        assert flow.why_not_replicated("b.orders") == "cycle: it already came from b"
    assert sorted(asked) == ["orders", "payments"]

    plugged = tmp_path / "plugged.properties"
    plugged.write_text(flows.read_text() + f"a->b.topic.filter.class = {__name__}.CountingTopics\n")
    flow = load_topology([plugged]).flow("a->b")
    for _ in range(3):
        assert flow.should_replicate_topic("orders")
    assert CountingTopics.asked == ["orders"] * 3
