"""`mirrorflow render`: DAG files from flow files, stable, secret-free, fresh, importable."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from mirrorflow.airflow import rendering
from mirrorflow.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SEEDS = ROOT / "tests" / "data" / "seeds"

# Flow files and the DAGs they must give: the examples, and the seeds' active/passive ("a first
# example", seed 000) and active/active (seed 002) configurations as their sources wrote them.
RENDERED = {
    "examples/active-passive.properties": ["mirror__primary__secondary"],
    "examples/active-passive.yaml": ["mirror__primary__secondary"],
    "examples/active-active.properties": [
        "mirror__primary__secondary",
        "mirror__secondary__primary",
    ],
    "tests/data/seeds/000-first-example.properties": ["mirror__primary__secondary"],
    "tests/data/seeds/002-active-active.properties": ["mirror__dc1__dc2", "mirror__dc2__dc1"],
}


def render_cli(*args: str | Path) -> int:
    return main(["render", *map(str, args)])


@pytest.mark.parametrize("flow_file", sorted(RENDERED))
def test_render_writes_one_mirror_dag_per_enabled_flow(flow_file, tmp_path, capsys):
    assert render_cli(ROOT / flow_file, "--out", tmp_path) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"{dag_id}.py" for dag_id in RENDERED[flow_file]]
    for name in files:
        text = (tmp_path / name).read_text()
        assert text.startswith(rendering.GENERATED_MARK + "\n")
        assert f"# Flow files: {flow_file}\n" in text  # inside the project: a relative path
        assert "# Template:   templates/mirror_dag.py.j2\n" in text
    out = capsys.readouterr().out
    assert out.count(": written (flow ") == len(files)


def test_rendering_is_byte_identical_whatever_the_folder_or_working_directory(
    tmp_path, monkeypatch
):
    source = EXAMPLES / "active-active.properties"
    assert render_cli(source, "--out", tmp_path / "a") == 0
    monkeypatch.chdir(EXAMPLES)  # a relative path from elsewhere names the same file
    assert render_cli("active-active.properties", "--out", tmp_path / "b") == 0
    assert render_cli(source, "--out", tmp_path / "b") == 0  # a second render changes nothing
    first = {p.name: p.read_bytes() for p in sorted((tmp_path / "a").iterdir())}
    second = {p.name: p.read_bytes() for p in sorted((tmp_path / "b").iterdir())}
    assert first == second and len(first) == 2
    again = rendering.render([source])
    assert [d.text.encode() for d in again.dags] == list(first.values())


def test_the_committed_dags_are_the_fresh_rendering_of_the_active_passive_example(
    monkeypatch, capsys
):
    monkeypatch.chdir(ROOT)
    assert render_cli("examples/active-passive.properties", "--out", "dags", "--check") == 0, (
        capsys.readouterr().out
    )
    assert capsys.readouterr().out == "dags: 1 DAG file(s) up to date\n"


def test_check_lists_stale_missing_and_extra_files_and_render_repairs_only_generated_ones(
    tmp_path, capsys
):
    source = EXAMPLES / "active-active.properties"
    assert render_cli(source, "--out", tmp_path) == 0
    stale, missing = tmp_path / "mirror__primary__secondary.py", "mirror__secondary__primary.py"
    stale.write_text(stale.read_text().replace('"retries": 10', '"retries": 3'))
    (tmp_path / missing).unlink()
    shutil.copy(stale, tmp_path / "mirror__old__flow.py")  # a flow that was since removed
    own = tmp_path / "my_own_dag.py"
    own.write_text("# written by hand\n")
    capsys.readouterr()

    assert render_cli(source, "--out", tmp_path, "--check") == 1
    assert capsys.readouterr().out.splitlines() == [
        "stale:   mirror__primary__secondary.py (differs from a fresh rendering)",
        "missing: mirror__secondary__primary.py",
        "extra:   mirror__old__flow.py (generated, but no enabled flow renders it)",
        f"{tmp_path} is out of date: run `mirrorflow render {source} --out {tmp_path}`",
    ]
    assert render_cli(source, "--out", tmp_path) == 0
    assert render_cli(source, "--out", tmp_path, "--check") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "mirror__primary__secondary.py",
        "mirror__secondary__primary.py",
        "my_own_dag.py",
    ]
    assert own.read_text() == "# written by hand\n"


def test_options_change_the_dags_and_check_compares_with_the_same_options(tmp_path, capsys):
    source = EXAMPLES / "active-passive.properties"
    options = ("--retries", "3", "--spark-conn-id", "spark_x")
    assert render_cli(source, "--out", tmp_path, *options) == 0
    text = (tmp_path / "mirror__primary__secondary.py").read_text()
    assert '"retries": 3,' in text and 'conn_id="spark_x",' in text
    assert "--spark-conn-id spark_x --retries 3 --out <this folder>" in text
    assert render_cli(source, "--out", tmp_path, "--check") == 1
    assert render_cli(source, "--out", tmp_path, "--check", "--retries", "3") == 1
    assert render_cli(source, "--out", tmp_path, "--check", *options) == 0


def test_render_refuses_flow_files_with_validation_errors_and_writes_nothing(tmp_path, capsys):
    # The Kafka docs' active/passive snippet has no `clusters` line: MM2 would not start.
    assert render_cli(SEEDS / "000-active-passive.properties", "--out", tmp_path) == 2
    err = capsys.readouterr().err
    assert "the flow files have 2 validation error(s), so no DAG is rendered" in err
    assert "error: clusters: missing" in err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_a_hand_written_file_with_a_generated_name_is_never_overwritten(tmp_path, capsys):
    mine = tmp_path / "mirror__primary__secondary.py"
    mine.write_text("# mine\n")
    assert render_cli(EXAMPLES / "active-passive.properties", "--out", tmp_path) == 2
    assert "was not generated by mirrorflow render" in capsys.readouterr().err
    assert mine.read_text() == "# mine\n"


def test_generated_dags_hold_no_secrets_only_flow_names_and_paths(tmp_path):
    password, host = "pa55-w0rd-never-shown", "broker-secret-host.example:9092"
    flow_file = tmp_path / "mm2.properties"
    flow_file.write_text(
        "clusters = primary, backup\n"
        f"primary.bootstrap.servers = {host}\n"
        "backup.bootstrap.servers = backup-host.example:9092\n"
        "security.protocol = SASL_SSL\n"
        "sasl.mechanism = PLAIN\n"
        "sasl.jaas.config = org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="alice" password="{password}";\n'
        f"ssl.truststore.password = {password}\n"
        "primary->backup.enabled = true\n"
        "primary->backup.topics = payments.*\n"
    )
    result = rendering.render([flow_file])
    assert [d.dag_id for d in result.dags] == ["mirror__primary__backup"]
    text = result.dags[0].text
    for secret in (password, host, "backup-host", "alice", "jaas", "SASL", "truststore"):
        assert secret not in text
    assert str(flow_file) in text  # outside the project: the absolute path
    # Every string literal in the file is a name, a path or fixed text from the template.
    assert 'FLOW = "primary->backup"' in text


def test_generated_dags_import_into_airflow_without_errors(tmp_path, record_property, capsys):
    from airflow.dag_processing.dagbag import DagBag

    folders = {}
    for flow_file in sorted(RENDERED):
        folder = tmp_path / flow_file.replace("/", "_")
        assert render_cli(ROOT / flow_file, "--out", folder) == 0
        folders[flow_file] = folder
    folders["dags/ (committed)"] = ROOT / "dags"
    capsys.readouterr()
    report = []
    for label, folder in folders.items():
        for path in sorted(folder.glob("*.py")):
            started = time.perf_counter()
            bag = DagBag(dag_folder=path, safe_mode=True)
            seconds = time.perf_counter() - started
            assert bag.import_errors == {}, bag.import_errors
            report.append(f"{seconds * 1000:7.0f} ms  {label}: {path.name}")
            (dag,) = bag.dags.values()
            assert dag.dag_id == path.stem
            _, source, target = dag.dag_id.split("__")
            flow = f"{source}->{target}"
            assert dag.schedule == "@continuous"
            assert dag.max_active_runs == 1
            assert {"mirrorflow", "kind:mirror", f"flow:{flow}"} <= set(dag.tags)
            assert f"flow `{flow}`" in dag.doc_md
            assert set(dag.params) == {"starting_offsets", "starting_timestamp", "restart"}
            (task,) = dag.tasks
            assert type(task).__name__ == "MirrorFlowOperator"
            assert (task.flow, task.execution_timeout) == (flow, None)
            assert task.retries == 10 and task.retry_exponential_backoff == 2.0
            assert seconds < 10, f"{path.name} took {seconds:.1f}s to parse"
    record_property("dag_parse_times", report)
    with capsys.disabled():
        print("\nDAG parse times (DagBag, one file each):\n" + "\n".join(report))
