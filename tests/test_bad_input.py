"""Bad input never crashes mirrorflow and never reaches a cluster.

Flow files (properties and YAML) are fuzzed with Hypothesis from the seed examples: every one
ends in ``validate``'s findings (file, line, key, fix) or in one error line naming the file,
never in a stack trace; ``explain`` and ``convert`` read the same files without crashing, and
``convert`` keeps every definition. Java regexes and replication policies take any text. Random
command lines of the offline commands end in an exit code, not an exception. A flow file that
``validate`` rejects starts no job, sync or commit: each command that acts on clusters refuses it
in one line before any client connects (a listening socket stands in for the brokers and counts
connections).

``MIRRORFLOW_FUZZ_EXAMPLES`` sets how many inputs each fuzzed test tries (default 200; the
closing note of issue 14 gives a longer run's count).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mirrorflow import cli
from mirrorflow.config import flowfiles
from mirrorflow.config.topology import load_topology
from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2 import configdefs, filters, policy

ROOT = Path(__file__).resolve().parent.parent
SEEDS = sorted((ROOT / "tests" / "data" / "seeds").glob("*.properties"))
EXAMPLES = sorted((ROOT / "examples").glob("*"))
FUZZ = settings(
    max_examples=int(os.environ.get("MIRRORFLOW_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

# --- what a fuzzed flow file is made of ----------------------------------------------------------

SEED_LINES = sorted(
    {
        line
        for path in [*SEEDS, *(p for p in EXAMPLES if p.suffix == ".properties")]
        for line in path.read_text(encoding="iso-8859-1").splitlines()
    }
)
ALIASES = ["primary", "secondary", "us-east", "us-west", "A", "B", "dc.1", ""]
KNOWN = sorted(configdefs.flow_settings())
NASTY = st.sampled_from(
    [
        "true", "false", "TRUE", "true # comment", "1", "0", "-1", "99999999999999999999", "1.5",
        ".*", "orders, payments.*", "(", "[a-", "a{2,1}", "\\p{Alpha}+", "(?<name>x)", "\\Q.\\E",
        "*", "a**", "${file:/nonexistent:key}", "${env:NOPE}", "${x", "org.example.Nope",
        "org.apache.kafka.connect.mirror.IdentityReplicationPolicy", "", " ", "\\", "\\u12",
        "\\u0041", "a\\\n  b", "localhost", "host:port", "[::1]:9092", "h:99999", "é", "\x00",
    ]
)  # fmt: skip
TEXT = st.text(alphabet=st.characters(codec="latin-1"), max_size=40)


@st.composite
def setting_lines(draw: st.DrawFn) -> str:
    alias = draw(st.sampled_from(ALIASES))
    other = draw(st.sampled_from(ALIASES))
    prefix = draw(st.sampled_from(["", f"{alias}.", f"{alias}->{other}.", f"{alias}.consumer."]))
    key = draw(st.one_of(st.sampled_from([*KNOWN, "clusters", "bootstrap.servers"]), TEXT))
    value = draw(st.one_of(NASTY, TEXT, st.lists(st.sampled_from(ALIASES)).map(", ".join)))
    separator = draw(st.sampled_from([" = ", "=", ": ", " ", "\t=\t"]))
    return f"{prefix}{key}{separator}{value}"


@st.composite
def properties_files(draw: st.DrawFn) -> str:
    """A flow file of seed lines, settings with odd values and random text, mixed."""
    lines = draw(
        st.lists(st.one_of(st.sampled_from(SEED_LINES), setting_lines(), TEXT), max_size=30)
    )
    ending = draw(st.sampled_from(["\n", "\r\n", "\r"]))
    return ending.join(lines) + draw(st.sampled_from(["", ending, "\\", "\\" + ending]))


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), TEXT, NASTY)
TREES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(TEXT, NASTY), children, max_size=4),
    ),
    max_leaves=20,
)


@st.composite
def yaml_files(draw: st.DrawFn) -> str:
    """A YAML flow file: the sections with random contents, any tree, or broken text."""
    sections = st.fixed_dictionaries(
        {},
        optional={
            "clusters": st.dictionaries(
                st.sampled_from(ALIASES), st.one_of(TREES, st.just({"bootstrap.servers": "h:1"}))
            ),
            "flows": st.dictionaries(
                st.builds(
                    lambda a, b: f"{a}->{b}", st.sampled_from(ALIASES), st.sampled_from(ALIASES)
                ),
                st.one_of(TREES, st.dictionaries(st.sampled_from(KNOWN), SCALARS)),
            ),
            "settings": st.one_of(TREES, st.dictionaries(st.sampled_from(KNOWN), SCALARS)),
        },
    )
    document = draw(st.one_of(sections, TREES))
    text = yaml.safe_dump(document, allow_unicode=True)
    cut = draw(st.integers(0, len(text)))
    return draw(st.sampled_from([text, text[:cut], text[:cut] + draw(TEXT) + text[cut:]]))


# --- how a command's outcome must look -----------------------------------------------------------


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``mirrorflow ARGV`` in this process: exit code, stdout, stderr (argparse's exits too)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


FINDING = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (error|warning): .+; fix: .+$", re.S)
SUMMARY = re.compile(r"^\d+ errors, \d+ warnings; flows that replicate: .+$")


def assert_findings_or_one_error_line(path: Path, code: int, out: str, err: str) -> None:
    """``validate``'s contract: findings naming the file and a line, then the summary; or,
    for a file it cannot read at all, exit 2 with one error line that names the file."""
    assert "Traceback" not in out + err
    if code == 2 and not out:
        lines = err.splitlines()
        assert lines and lines[0].startswith("mirrorflow: error: "), err
        assert str(path) in lines[0], f"the error does not name the file: {lines[0]}"
        assert len(lines) <= 2 and all(ln.startswith("mirrorflow: ") for ln in lines), err
        return
    assert code in (0, 1, 2), (code, out, err)
    text = out.rstrip("\n")
    summary = text.rsplit("\n", 1)[-1]
    assert SUMMARY.match(summary), out
    body = "\n".join(ln for ln in text[: -len(summary)].split("\n") if not ln.startswith("note: "))
    for finding in re.split(r"\n(?=" + re.escape(str(path)) + r":\d+: )", body.strip("\n")):
        if finding:
            match = FINDING.match(finding)
            assert match and match["file"] == str(path), finding
    assert (code == 2) == (" error: " in body), out


def check_file(path: Path) -> None:
    code, out, err = run_cli("validate", str(path))
    assert_findings_or_one_error_line(path, code, out, err)
    try:
        topology = load_topology([path])
    except MirrorflowError:
        return  # validate said so in one line, checked above
    for flow in topology.flows[:2]:
        code, out, err = run_cli("explain", str(path), flow.name)
        assert code in (0, 2) and "Traceback" not in err, err
    code, out, err = run_cli("convert", str(path), "--include-secrets")
    assert code in (0, 2) and "Traceback" not in err, err


@contextlib.contextmanager
def flow_file(text: str, suffix: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / f"mm2{suffix}"
        path.write_bytes(text.encode("iso-8859-1", errors="replace"))
        yield path


# --- the fuzzed tests ----------------------------------------------------------------------------


@FUZZ
@given(properties_files())
def test_fuzzed_properties_files_end_in_findings_or_one_error_line(text):
    with flow_file(text, ".properties") as path:
        check_file(path)


@FUZZ
@given(yaml_files())
def test_fuzzed_yaml_files_end_in_findings_or_one_error_line(text):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "flows.yaml"
        path.write_text(text, encoding="utf-8")
        check_file(path)


@FUZZ
@given(st.lists(setting_lines(), max_size=20))
def test_convert_to_yaml_and_back_keeps_every_definition(lines):
    """What a properties file defines (its last value per key) survives YAML and back."""
    with flow_file("clusters = primary, us-east, dc.1\n" + "\n".join(lines), ".properties") as path:
        try:
            topology = load_topology([path])
        except MirrorflowError:
            return
        yaml_path = path.with_suffix(".yaml")
        yaml_path.write_text(flowfiles.to_yaml(topology.definitions, topology.aliases))
        again = load_topology([yaml_path])
        # `clusters` is written from the aliases it lists, spaced as MirrorMaker 2 reads them.
        assert again.aliases == topology.aliases
        expected = {d.key: d.value for d in topology.definitions if d.key != "clusters"}
        assert {d.key: d.value for d in again.definitions if d.key != "clusters"} == expected


@FUZZ
@given(st.text(max_size=30))
def test_any_text_as_a_java_regex_compiles_or_is_refused_as_one(pattern):
    with contextlib.suppress(filters.JavaRegexError):
        filters.compile_java_regex(pattern)


@FUZZ
@given(
    separator=st.text(min_size=1, max_size=3),
    alias=st.text(min_size=1, max_size=10),
    topic=st.text(min_size=1, max_size=20),
)
def test_the_default_policy_names_a_remote_topic_it_can_trace_back(separator, alias, topic):
    """MirrorMaker 2 splits a remote name at the first separator (Java's ``split``, which drops
    trailing empty parts): where that finds the alias, the source and the topic come back."""
    chosen = policy.DefaultReplicationPolicy()
    chosen.configure({policy.SEPARATOR: separator})
    remote = chosen.format_remote_topic(alias, topic)
    chosen.is_internal_topic(remote)
    chosen.original_topic(remote)
    first_separator_ends_the_alias = (alias + separator).find(separator) == len(alias)
    if first_separator_ends_the_alias and topic.replace(separator, ""):
        assert chosen.topic_source(remote) == alias
        assert chosen.upstream_topic(remote) == topic


OFFLINE = ["validate", "explain", "convert", "render"]
TOKENS = [
    "--json", "--clusters", "primary", "--to", "yaml", "properties", "--check", "--master",
    "local[*]", "spark://h:7077", "yarn", "primary->secondary", "a->b", "--retries", "-1", "x",
    "--retry-delay", "0", "--spark-conn-id", "", "--help-me", "--include-secrets", "nope.yaml",
]  # fmt: skip


@FUZZ
@given(
    command=st.sampled_from(OFFLINE),
    args=st.lists(
        st.one_of(st.sampled_from(TOKENS), st.sampled_from([str(p) for p in EXAMPLES]), TEXT),
        max_size=8,
    ),
)
def test_fuzzed_command_lines_of_the_offline_commands_end_in_an_exit_code(command, args):
    with tempfile.TemporaryDirectory() as out:
        extra = ["--out", out] if command == "render" else []
        code, stdout, stderr = run_cli(command, *args, *extra)
    assert code in (0, 1, 2), (code, stderr)
    assert "Traceback" not in stdout + stderr


# --- rejected files reach no cluster -------------------------------------------------------------


@pytest.fixture
def broker_stand_in() -> Iterator[tuple[str, list]]:
    """A socket listening where the flow files' brokers are: it counts who connects."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    accepted: list = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                accepted.append(server.accept())

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}", accepted
    finally:
        stop.set()
        thread.join()
        server.close()


BROKEN = {
    "invalid topics regex": "primary->secondary.topics = orders(\n",
    "comment in a value": "primary->secondary.sync.topic.acls.enabled = false # later\n",
    "identity policy on a cycle": (
        "secondary->primary.enabled = true\n"
        "replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n"
    ),
    "flow to an unknown alias": "primary->secundary.enabled = true\n",
}
COMMANDS = {
    "mirror": ["mirror", "{file}", "--flow", "primary->secondary", "--once"],
    "sync": ["sync", "{file}", "--flow", "primary->secondary"],
    "sync-groups": ["sync-groups", "{file}", "--flow", "primary->secondary"],
    "translate": ["translate", "{file}", "--flow", "primary->secondary", "--group", "g"],
    "checkpoints": ["checkpoints", "{file}", "--flow", "primary->secondary"],
}


@pytest.mark.parametrize("problem", sorted(BROKEN))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_flow_file_validate_rejects_is_refused_before_any_client_connects(
    problem, command, broker_stand_in, tmp_path
):
    address, accepted = broker_stand_in
    path = tmp_path / "mm2.properties"
    path.write_text(
        "clusters = primary, secondary\n"
        f"primary.bootstrap.servers = {address}\n"
        f"secondary.bootstrap.servers = {address}\n"
        "primary->secondary.enabled = true\n" + BROKEN[problem]
    )
    code, out, err = run_cli(*(a.format(file=path) for a in COMMANDS[command]))
    assert code == 2, (out, err)
    first = err.splitlines()[0]
    assert first.startswith("mirrorflow: error: ") and "Traceback" not in err
    assert f"{path}:" in first, f"the error does not name the file and line: {first}"
    assert not accepted, f"{command} connected to a cluster with a rejected flow file"
