"""Validation names every problem of a topology on one line: file, line, key and a fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mirrorflow.config.topology import load_topology
from mirrorflow.config.validation import exit_code, validate
from mirrorflow.errors import MirrorflowError

SEEDS = Path(__file__).parent / "data" / "seeds"
BASE = """\
    clusters = A, B
    A.bootstrap.servers = a:9092
    B.bootstrap.servers = b:9092
"""


NOT_HONOURED = "not honoured by mirrorflow"


def _findings(*paths: Path, not_honoured: bool = False) -> list[tuple[str, int, str, str]]:
    """(severity, line, key, problem + fix) of each finding about the MirrorMaker 2 config
    (with ``not_honoured``: also those about settings mirrorflow does not act on)."""
    return [
        (f.severity, f.location.line, f.key, f"{f.problem}; fix: {f.fix}")
        for f in validate(load_topology(paths))
        if not_honoured or not f.problem.startswith(NOT_HONOURED)
    ]


AB = """\
clusters = a, b
a.bootstrap.servers = a:9092
b.bootstrap.servers = b:9092
a->b.enabled = true
"""
"""A flow a->b: the first four lines of the flow files below."""


def _ab_file(tmp_path: Path, settings: str) -> Path:
    path = tmp_path / "mm2.properties"
    path.write_text(AB + textwrap.dedent(settings))
    return path


def _check(tmp_path: Path, text: str, name: str = "mm2.properties"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(BASE + text))
    return _findings(path)


# Each seed's typos and misreadings, by line of the copy in tests/data/seeds.
SEED_FINDINGS = {
    "000-file-syntax": [
        ("error", 3, "clusters", "ends in a comment"),
        ("error", 7, "topics", "ends in a comment"),
        ("error", 11, "us-west->us.east.topics", "write `us-west->us-east.topics`"),
        ("error", 11, "us-west->us.east.topics", "ends in a comment"),
    ],
    "000-flow-settings": [
        ("error", 1, "clusters", "add `clusters = us-west, us-east`"),
        ("warning", 12, "us-west->us-east.emit.heartbeats", "did you mean emit.heartbeats.enabled"),
    ],
    "000-active-passive": [
        ("error", 1, "clusters", "add `clusters = primary, secondary`"),
        ("error", 9, "primary->secondary.topics", "ends in a comment"),
    ],
    "000-active-active": [
        ("error", 3, "clusters", "cluster 'us-east' has no bootstrap.servers"),
        ("error", 5, "Us-east.bootstrap.servers", "write `us-east.bootstrap.servers`"),
    ],
    "000-multi-cluster": [
        ("error", line, f"{alias}.bootstrap.servers", "'...' is not host:port")
        for line, alias in enumerate(
            ["west-1", "west-2", "east-1", "east-2", "north-1", "north-2"], 4
        )
    ],
    "001-getting-started": [
        ("warning", 12, "us-west->us-east.emit.heartbeats", "did you mean emit.heartbeats.enabled"),
        ("error", 14, "us-west->us-east.enabled", "ends in a comment"),
    ],
    "001-backup": [
        ("error", 1, "clusters", "add `clusters = backup, primary`"),
        ("error", 4, "backup.ssl.truststore.location", "ends in a comment"),
        ("error", 5, "", "no key before the value"),
        ("error", 6, "backup->primary.enabled", "ends in a comment"),
        ("warning", 7, "primary->backup.topics.blacklist", "removed in MirrorMaker 2 4.0"),
        ("error", 9, "primary->", "not a flow setting"),
    ],
    "002-active-active": [
        ("warning", 12, "dc1->dc2.topics.blacklist", "rename it to dc1->dc2.topics.exclude"),
        ("warning", 12, "dc1->dc2.topics.blacklist", "so MM2 reads 'dc2..*'"),
        ("warning", 17, "dc2->dc1.topics.blacklist", "rename it to dc2->dc1.topics.exclude"),
        ("warning", 17, "dc2->dc1.topics.blacklist", "so MM2 reads 'dc1..*'"),
    ],
    "003-active-passive": [
        ("warning", 13, "us-east->us-west.topics.blacklist", "removed in MirrorMaker 2 4.0"),
        ("warning", 13, "us-east->us-west.topics.blacklist", "reads '.*.internal, .*-chan"),
    ],
    "003-active-active": [
        ("warning", 17, "us-east->us-west.topics.blacklist", "removed in MirrorMaker 2 4.0"),
        ("warning", 17, "us-east->us-west.topics.blacklist", "drops the backslash of \\."),
        ("warning", 18, "us-west->us-east.topics.blacklist", "removed in MirrorMaker 2 4.0"),
        ("warning", 18, "us-west->us-east.topics.blacklist", "drops the backslash of \\."),
        ("warning", 30, "us-east->us-west.sync.topic.configs.exclude", "config.properties.exclude"),
        ("warning", 30, "us-east->us-west.sync.topic.configs.exclude", "write \\\\."),
    ],
    "000-first-example": [],
    "000-client-settings": [],
    "002-dc1-dc2": [],
}


@pytest.mark.parametrize("seed", sorted(SEED_FINDINGS))
def test_each_seed_typo_gets_a_finding_on_its_line(seed):
    found = _findings(SEEDS / f"{seed}.properties")
    assert [(s, line, key) for s, line, key, _ in found] == [
        (s, line, key) for s, line, key, _ in SEED_FINDINGS[seed]
    ]
    for (*_, text), (*_, expected) in zip(found, SEED_FINDINGS[seed], strict=True):
        assert expected in text


def test_findings_print_as_one_line_with_file_line_key_and_fix():
    [finding, *_] = validate(load_topology([SEEDS / "000-active-active.properties"]))
    text = str(finding)
    assert "\n" not in text
    assert text.startswith(f"{SEEDS / '000-active-active.properties'}:3: error: clusters: ")
    assert "; fix: add `us-east.bootstrap.servers = host:9092`" in text


def test_racy_processes_with_different_values_for_one_key_are_an_error():
    racy = [SEEDS / f"000-racy-process{n}.properties" for n in (1, 2)]
    found = _findings(*racy)
    assert found == [
        ("error", 4, "A->B.topics",
         f"'bar' here but 'foo' in {SEEDS / '000-racy-process1.properties'}:7: MM2 processes "
         "given different files fight over the configuration they share through the target "
         "cluster; fix: define the key once, in one file every process uses"),
    ]  # fmt: skip


def test_a_key_repeated_in_one_file_is_a_warning_naming_the_earlier_line(tmp_path):
    found = _check(tmp_path, "topics = a\ntopics = b\n")
    assert found == [
        ("warning", 5, "topics", "defined again ('b'; line 4 says 'a'): Java keeps only this "
         "last one; fix: delete the definition you do not want"),
    ]  # fmt: skip


def test_flows_to_self_are_errors(tmp_path):
    assert _check(tmp_path, "A->A.enabled = true\n")[0][:3] == ("error", 4, "A->A.enabled")


def test_booleans_must_be_exactly_true_or_false(tmp_path):
    found = _check(tmp_path, "A->B.enabled = true \nA->B.emit.heartbeats.enabled = yes\n")
    assert [(s, line) for s, line, *_ in found] == [("error", 4), ("error", 5)]
    assert "Boolean.parseBoolean, which reads it as false" in found[0][3]


@pytest.mark.parametrize(
    ("setting", "severity", "text"),
    [
        ("A->B.emit.checkpoints.interval.seconds = 0", "error", "zero"),
        ("refresh.topics.interval.seconds = -1", "warning",
         "write `refresh.topics.enabled = false` instead"),
        ("A->B.consumer.poll.timeout.ms = -5", "error", "negative"),
        ("A->B.replication.factor = three", "error", "expected a whole number"),
    ],
)  # fmt: skip
def test_zero_negative_and_malformed_numbers_are_reported(tmp_path, setting, severity, text):
    [(found_severity, line, _, problem)] = _check(tmp_path, setting + "\n")
    assert (found_severity, line) == (severity, 4)
    assert text in problem


def test_invalid_and_untranslatable_regexes_are_errors_naming_the_pattern(tmp_path):
    found = _check(tmp_path, "A->B.topics = orders, {bad}\ngroups = \\\\p{javaLowerCase}+\n")
    assert [(s, line, key) for s, line, key, _ in found] == [
        ("error", 4, "A->B.topics"),
        ("error", 5, "groups"),
    ]
    assert "invalid pattern list 'orders, {bad}'" in found[0][3]
    assert "\\p{javaLowerCase} has no Python equivalent" in found[1][3]


def test_identity_policy_on_a_cycle_of_flows_is_an_error(tmp_path):
    identity = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"
    found = _check(
        tmp_path,
        f"A->B.enabled = true\nB->A.enabled = true\nA->B.replication.policy.class = {identity}\n",
    )
    assert found == [
        ("error", 6, "A->B.replication.policy.class",
         "flow A->B uses IdentityReplicationPolicy on the cycle A->B->A: it cannot tell copies "
         "from originals, so records loop forever; fix: use DefaultReplicationPolicy for A->B, "
         "break the cycle, or set provenance.header.enabled = true for every flow on it"),
    ]  # fmt: skip
    one_way = _check(tmp_path, f"A->B.enabled = true\nreplication.policy.class = {identity}\n")
    assert one_way == []


@pytest.mark.parametrize(
    ("setting", "severity", "text"),
    [
        ("A.topics = x", "warning", "topics has no effect on a cluster"),
        ("consumer.isolation.level = read_committed", "warning", "ignores this client"),
        ("use.defaults.from = source", "warning", "set it per flow"),
        ("A.consumer.isolaton.level = x", "warning", "did you mean consumer.isolation.level"),
        ("A->B.replication.policy.class = com.acme.Policy", "error", "Java class"),
        ("C.bootstrap.servers = c:9092", "warning", "add C to `clusters`"),
        ("b.bootstrap.servers = c:9092", "error", "write `B.bootstrap.servers`"),
        ("enabled = true", "warning", "turns on every flow"),
        ("A->B.use.incremental.alter.configs = never", "warning", "removed in MirrorMaker 2 4.0"),
    ],
)
def test_keys_at_the_wrong_level_unknown_or_unusable_are_reported(
    tmp_path, setting, severity, text
):
    [(found_severity, line, key, problem)] = _check(tmp_path, setting + "\n")
    assert (found_severity, line, key) == (severity, 4, setting.split(" = ")[0])
    assert text in problem


def test_exit_codes_tell_errors_from_warnings(tmp_path):
    assert exit_code(validate(load_topology([SEEDS / "000-first-example.properties"]))) == 0
    assert exit_code(validate(load_topology([SEEDS / "002-active-active.properties"]))) == 1
    assert exit_code(validate(load_topology([SEEDS / "000-file-syntax.properties"]))) == 2


def test_settings_mirrorflow_does_not_act_on_are_reported_as_not_honoured(tmp_path):
    path = _ab_file(
        tmp_path,
        """\
            a->b.sync.group.offsets.enabled = true
            a->b.refresh.topics.interval.seconds = 30
            a->b.sync.topic.configs.interval.seconds = 60
            sync.topic.acls.enabled = true
            use.incremental.alter.configs = never
            a->b.errors.tolerance = all
            a->b.offset.lag.max = 10
            tasks.max = 4
            b.offset.flush.interval.ms = 10000
            b.task.shutdown.graceful.timeout.ms = 3000
            b.exactly.once.source.support = enabled
            offset.storage.replication.factor = 1
            b.offset.storage.partitions = 5
            b.client.id = mirror
            offset.storage.topic = my-offsets
            b.status.storage.topic = my-status
            b.topic.creation.enable = false
        """,
    )
    found = {key: problem for _s, _line, key, problem in _findings(path, not_honoured=True)}
    assert set(found) == {
        "use.incremental.alter.configs",
        "a->b.errors.tolerance",
        "tasks.max",
        "offset.storage.topic",
        "b.status.storage.topic",
        "b.topic.creation.enable",
    }, "an honoured setting was reported, or a setting mirrorflow ignores was not"
    assert all(problem.startswith(NOT_HONOURED) for problem in found.values())
    assert "Spark master's cores" in found["tasks.max"]
    assert "mm2-offsets.<source>.internal" in found["offset.storage.topic"]


@pytest.mark.parametrize("level", ["top", "target"])
def test_worker_settings_apply_where_mirrormaker_2_reads_them(tmp_path, level):
    """MirrorMaker 2 builds a herder's worker settings from ``<target>.`` keys and, of the top
    level, only ``offset.storage*``, ``task*`` and a few other prefixes: a top-level
    ``offset.flush.interval.ms`` or ``exactly.once.source.support`` is ignored, by mirrorflow as
    by MirrorMaker 2, and validate says so; at the target, each applies."""
    from mirrorflow.replication.spec import spec_for_flow

    prefix = "" if level == "top" else "b."
    path = _ab_file(
        tmp_path,
        f"""\
            a.consumer.isolation.level = read_committed
            {prefix}offset.flush.interval.ms = 1234
            {prefix}exactly.once.source.support = enabled
            {prefix}task.shutdown.graceful.timeout.ms = 2345
            {prefix}offset.storage.partitions = 7
        """,
    )
    spec = spec_for_flow([path], "a->b")
    mm2 = _mm2_worker_settings(path, spec)
    assert spec.offset_flush_interval_ms == int(mm2["offset.flush.interval.ms"] or 5000)
    assert spec.exactly_once == (mm2["exactly.once.source.support"] == "enabled")
    assert spec.stop_grace_ms == int(mm2["task.shutdown.graceful.timeout.ms"])
    assert spec.offsets_partitions == int(mm2["offset.storage.partitions"])
    # offset.storage* and task*: MirrorMaker 2 takes them from the top level too
    assert (spec.stop_grace_ms, spec.offsets_partitions) == (2345, 7)
    ignored = {key for _s, _line, key, problem in _findings(path) if "at top level" in problem}
    if level == "top":
        assert (spec.offset_flush_interval_ms, spec.exactly_once) == (5000, False)
        assert ignored == {"offset.flush.interval.ms", "exactly.once.source.support"}
    else:
        assert (spec.offset_flush_interval_ms, spec.exactly_once) == (1234, True)
        assert ignored == set()


@pytest.mark.parametrize(
    "settings, interval_ms",
    [
        ("", 100),  # mirrorflow's default; MirrorMaker 2's is poll
        ("a->b.transaction.boundary = poll", 0),
        ("a->b.transaction.boundary = interval\na->b.transaction.boundary.interval.ms = 250", 250),
        ("a->b.transaction.boundary = interval\nb.offset.flush.interval.ms = 1234", 1234),
        ("a->b.transaction.boundary = interval", 60_000),  # Connect's offset flush interval
        ("transaction.boundary = poll", 100),  # MirrorMaker 2 drops it at the top level
    ],
)
def test_an_exactly_once_flow_commits_on_the_transaction_boundary_mirrormaker_2_reads(
    tmp_path, settings, interval_ms
):
    """``S->T.transaction.boundary`` (and its interval) reach MirrorMaker 2's connector as
    Connect's source-connector settings; mirrorflow paces a caught-up exactly-once flow's
    transactions by them, and by its own 100 ms when unset."""
    from mirrorflow.replication.spec import spec_for_flow

    path = _ab_file(
        tmp_path,
        "a.consumer.isolation.level = read_committed\n"
        "b.exactly.once.source.support = enabled\n" + settings + "\n",
    )
    assert spec_for_flow([path], "a->b").transaction_interval_ms == interval_ms
    found = _findings(path, not_honoured=True)
    if settings.startswith("transaction.boundary"):
        assert [(s, k) for s, _line, k, _p in found] == [("warning", "transaction.boundary")]
        assert "unknown key" in found[0][3]
    else:
        assert found == []


@pytest.mark.parametrize(
    "value, problem",
    [
        ("connector", "defines no transaction boundaries"),
        ("batch", "is not one of poll, interval, connector"),
    ],
)
def test_a_transaction_boundary_mirrormaker_2_refuses_is_an_error(tmp_path, value, problem):
    from mirrorflow.replication.spec import spec_for_flow

    path = _ab_file(
        tmp_path,
        f"""\
            a.consumer.isolation.level = read_committed
            b.exactly.once.source.support = enabled
            a->b.transaction.boundary = {value}
            a->b.transaction.boundary.interval.ms = soon
        """,
    )
    found = _findings(path)
    assert [(s, k) for s, _line, k, _p in found] == [
        ("error", "a->b.transaction.boundary"),
        ("error", "a->b.transaction.boundary.interval.ms"),
    ]
    assert problem in found[0][3]
    assert "not a whole number of milliseconds" in found[1][3]
    with pytest.raises(MirrorflowError, match=r"validation error.*a->b\.transaction\.boundary: "):
        spec_for_flow([path], "a->b")


def test_a_top_level_worker_setting_overrides_the_targets_as_in_mirrormaker_2(tmp_path):
    """``workerConfig`` puts top-level ``task*`` and ``offset.storage*`` settings over the
    target's: mirrorflow applies the top-level value and validate names the one overridden."""
    from mirrorflow.replication.spec import spec_for_flow

    path = _ab_file(
        tmp_path,
        """\
            b.task.shutdown.graceful.timeout.ms = 2345
            task.shutdown.graceful.timeout.ms = 3456
            b.offset.storage.partitions = 7
            offset.storage.partitions = 7
        """,
    )
    spec = spec_for_flow([path], "a->b")
    assert spec.stop_grace_ms == 3456
    assert _mm2_worker_settings(path, spec)["task.shutdown.graceful.timeout.ms"] == "3456"
    [(severity, line, key, problem)] = [f for f in _findings(path) if "overridden" in f[3]]
    assert (severity, line, key) == ("warning", 5, "b.task.shutdown.graceful.timeout.ms")
    assert "task.shutdown.graceful.timeout.ms = 3456" in problem and ":6" in problem


def _mm2_worker_settings(path: Path, spec) -> dict[str, str | None]:
    """What MirrorMaker 2's own ``workerConfig`` makes of the file for the spec's flow: the
    worker settings mirrorflow acts on."""
    import javaproperties

    from tests import mm2_oracle

    props = javaproperties.loads(path.read_text())
    oracle = mm2_oracle.shared()
    names = (
        "offset.flush.interval.ms",
        "exactly.once.source.support",
        "task.shutdown.graceful.timeout.ms",
        "offset.storage.partitions",
    )
    return {n: oracle.worker_setting(props, spec.source, spec.target, n) for n in names}
