"""The validate, explain, plan and convert commands as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mirrorflow.cli import main

SEEDS = Path(__file__).parent / "data" / "seeds"
EXAMPLES = Path(__file__).parent.parent / "examples"


def test_validate_exits_0_when_clean_1_with_warnings_and_2_with_errors(capsys):
    assert main(["validate", str(SEEDS / "000-first-example.properties")]) == 0
    assert capsys.readouterr().out == (
        "note: new topics and partitions are looked for every 30 s (mirrorflow's default "
        "refresh.topics.interval.seconds; MirrorMaker 2's: 600): primary->secondary\n"
        "note: aborted transactions are not copied (the source is read read_committed, "
        "mirrorflow's default; MirrorMaker 2 copies them as data, as "
        "consumer.isolation.level = read_uncommitted does): primary->secondary\n"
        "0 errors, 0 warnings; flows that replicate: primary->secondary\n"
    )
    assert main(["validate", str(SEEDS / "002-active-active.properties")]) == 1
    assert main(["validate", str(SEEDS / "000-active-active.properties")]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[-2].endswith("error: Us-east.bootstrap.servers: names the cluster 'Us-east', "
                            "which is not in `clusters`: MM2 ignores it; fix: write "
                            "`us-east.bootstrap.servers`")  # fmt: skip
    assert (
        out[-1] == "2 errors, 0 warnings; flows that replicate: us-west->us-east, us-east->us-west"
    )


def test_validate_json_lists_findings_and_flows(capsys):
    assert main(["validate", "--json", str(SEEDS / "001-getting-started.properties")]) == 2
    report = json.loads(capsys.readouterr().out)
    # One typo and one error (its checkpoint settings are honoured now).
    assert (report["errors"], report["warnings"], report["flows"]) == (1, 1, [])
    assert report["findings"][1]["location"].endswith("001-getting-started.properties:14")


def test_validate_honours_clusters_like_mirrormaker(capsys):
    path = str(SEEDS / "000-multi-cluster.properties")
    assert main(["validate", path, "--clusters", "north-1", "north-2"]) == 2
    assert (
        capsys.readouterr()
        .out.splitlines()[-1]
        .endswith(
            "flows that replicate: west-1->north-1, east-1->north-1, north-1->north-2, "
            "north-2->north-1"
        )
    )


def test_a_missing_file_is_one_error_line_and_exit_2(capsys, tmp_path):
    assert main(["validate", str(tmp_path / "nope.properties")]) == 2
    assert capsys.readouterr().err.startswith("mirrorflow: error: cannot read ")


def test_explain_shows_each_setting_with_its_layer_and_hides_secrets(capsys):
    path = SEEDS / "002-dc1-dc2.properties"
    assert main(["explain", str(path), "dc1->dc2"]) == 0
    out = capsys.readouterr().out
    assert "mm2-secret" not in out
    lines = out.splitlines()
    assert lines[0] == "flow dc1->dc2 replicates (enabled = true)"
    assert any(
        line.split() == ["topics", "=", "orders.*,", "events.*,", "users.*", "<-", "flow",
                         "dc1->dc2", f"({path}:20,", "as", "dc1->dc2.topics)"]
        for line in lines
    )  # fmt: skip
    assert any(line.split()[:4] == ["tasks.max", "=", "1", "<-"] for line in lines)
    assert '  sasl.jaas.config   = org.apache.kafka.common.security.plain.PlainLoginModule ' \
           'required username="mm2" password="********";' in out  # fmt: skip


def test_explain_json_and_a_flow_without_herder(capsys):
    path = str(SEEDS / "003-active-passive.properties")
    assert main(["explain", path, "us-west->us-east", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["replicates"] is False
    assert report["settings"]["enabled"] == {
        "value": "false", "layer": "flow us-west->us-east",
        "location": f"{path}:9", "key": "us-west->us-east.enabled",
    }  # fmt: skip
    assert report["clients"]["target.producer"]["bootstrap.servers"]["layer"] == "cluster us-east"


def test_explain_refuses_an_unknown_flow_with_the_closest_alias(capsys):
    assert main(["explain", str(SEEDS / "002-dc1-dc2.properties"), "dc1->DC3"]) == 2
    assert "no cluster 'DC3' in `clusters`" in capsys.readouterr().err


def test_convert_turns_properties_into_yaml_and_back(capsys, tmp_path):
    assert main(["convert", str(EXAMPLES / "active-passive.properties")]) == 0
    yaml_text = capsys.readouterr().out
    assert yaml_text == (EXAMPLES / "active-passive.yaml").read_text()
    yaml_path = tmp_path / "flows.yaml"
    yaml_path.write_text(yaml_text)
    assert main(["convert", str(yaml_path)]) == 0
    back = tmp_path / "back.properties"
    back.write_text(capsys.readouterr().out)
    assert main(["convert", str(back), "--to", "yaml"]) == 0
    assert capsys.readouterr().out == yaml_text


def test_convert_masks_literal_secrets_unless_asked(capsys):
    path = str(SEEDS / "000-client-settings.properties")
    assert main(["convert", path]) == 0
    captured = capsys.readouterr()
    assert "my-secret-password" not in captured.out
    assert "ssl.keystore.password: '********'" in captured.out
    assert "secret values masked (us-east.ssl.truststore.password" in captured.err
    assert main(["convert", path, "--include-secrets"]) == 0
    assert "ssl.keystore.password: my-secret-password" in capsys.readouterr().out


@pytest.mark.kafka
def test_plan_json_against_the_sandbox(capsys, sandbox, tmp_path, topic_name):
    from tests.conftest import create_topics

    topic = topic_name("orders")
    create_topics(sandbox["primary"], topic, partitions=2)
    lines = ["clusters = primary, secondary", "primary->secondary.enabled = true"]
    for alias in ("primary", "secondary"):
        lines += [f"{alias}.{k} = {v}" for k, v in sandbox[alias].java_client_config().items()]
    path = tmp_path / "mm2.properties"
    path.write_text("\n".join(lines) + "\n")
    assert main(["plan", str(path), "--json", "--timeout", "10"]) == 0
    [flow] = json.loads(capsys.readouterr().out)["flows"]
    assert {"topic": topic, "partitions": 2, "remote": f"primary.{topic}",
            "remote_partitions": None} in flow["topics"]  # fmt: skip
