"""`mirrorflow render`: DAG files from flow files, stable, secret-free, fresh, importable."""

from __future__ import annotations

import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest

from mirrorflow.airflow import rendering
from mirrorflow.cli import main
from mirrorflow.dr import failback, failover

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SEEDS = ROOT / "tests" / "data" / "seeds"

# Flow files and the DAGs they must give: the examples, and the seeds' active/passive ("a first
# example", seed 000) and active/active (seed 002) configurations as their sources wrote them:
# a mirror and a sync DAG per target cluster, a flow, a failover, a failback and a drill DAG
# per flow.
RENDERED_UNSORTED = {
    "examples/active-passive.properties": [
        "drill__primary__secondary",
        "failover__primary__secondary",
        "failback__primary__secondary",
        "flow__primary__secondary",
        "mirror__secondary",
        "sync__secondary",
    ],
    "examples/active-passive.yaml": [
        "drill__primary__secondary",
        "failover__primary__secondary",
        "failback__primary__secondary",
        "flow__primary__secondary",
        "mirror__secondary",
        "sync__secondary",
    ],
    "examples/active-active.properties": [
        "drill__primary__secondary",
        "failover__primary__secondary",
        "failback__primary__secondary",
        "flow__primary__secondary",
        "drill__secondary__primary",
        "failover__secondary__primary",
        "failback__secondary__primary",
        "flow__secondary__primary",
        "mirror__primary",
        "mirror__secondary",
        "sync__primary",
        "sync__secondary",
    ],
    "tests/data/seeds/000-first-example.properties": [
        "drill__primary__secondary",
        "failover__primary__secondary",
        "failback__primary__secondary",
        "flow__primary__secondary",
        "mirror__secondary",
        "sync__secondary",
    ],
    "tests/data/seeds/002-active-active.properties": [
        "drill__dc1__dc2",
        "failover__dc1__dc2",
        "failback__dc1__dc2",
        "flow__dc1__dc2",
        "drill__dc2__dc1",
        "failover__dc2__dc1",
        "failback__dc2__dc1",
        "flow__dc2__dc1",
        "mirror__dc1",
        "mirror__dc2",
        "sync__dc1",
        "sync__dc2",
    ],
}
RENDERED = {flow_file: sorted(dags) for flow_file, dags in RENDERED_UNSORTED.items()}


def render_cli(*args: str | Path) -> int:
    return main(["render", *map(str, args)])


@pytest.mark.parametrize("flow_file", sorted(RENDERED))
def test_render_writes_a_mirror_dag_per_target_and_a_dag_per_enabled_flow(
    flow_file, tmp_path, capsys
):
    assert render_cli(ROOT / flow_file, "--out", tmp_path) == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [f"{dag_id}.py" for dag_id in RENDERED[flow_file]]
    for name in files:
        text = (tmp_path / name).read_text()
        assert text.startswith(rendering.GENERATED_MARK + "\n")
        assert f"# Flow files: {flow_file}\n" in text  # inside the project: a relative path
        kind = name.split("__")[0]
        assert f"# Template:   templates/{kind}_dag.py.j2\n" in text
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
    assert first == second and len(first) == 12
    again = rendering.render([source])
    assert [d.text.encode() for d in again.dags] == list(first.values())


def test_the_committed_dags_are_the_fresh_rendering_of_the_active_passive_example(
    monkeypatch, capsys
):
    monkeypatch.chdir(ROOT)
    assert render_cli("examples/active-passive.properties", "--out", "dags", "--check") == 0, (
        capsys.readouterr().out
    )
    assert capsys.readouterr().out == "dags: 6 DAG file(s) up to date\n"


def test_check_lists_stale_missing_and_extra_files_and_render_repairs_only_generated_ones(
    tmp_path, capsys
):
    source = EXAMPLES / "active-active.properties"
    assert render_cli(source, "--out", tmp_path) == 0
    stale, missing = tmp_path / "mirror__secondary.py", "flow__secondary__primary.py"
    stale.write_text(stale.read_text().replace('"retries": 10', '"retries": 3'))
    (tmp_path / missing).unlink()
    shutil.copy(stale, tmp_path / "flow__old__flow.py")  # a flow that was since removed
    own = tmp_path / "my_own_dag.py"
    own.write_text("# written by hand\n")
    capsys.readouterr()

    assert render_cli(source, "--out", tmp_path, "--check") == 1
    assert capsys.readouterr().out.splitlines() == [
        "stale:   mirror__secondary.py (differs from a fresh rendering)",
        "missing: flow__secondary__primary.py",
        "extra:   flow__old__flow.py (generated, but no enabled flow renders it)",
        f"{tmp_path} is out of date: run `mirrorflow render {source} --out {tmp_path}`",
    ]
    assert render_cli(source, "--out", tmp_path) == 0
    assert render_cli(source, "--out", tmp_path, "--check") == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            *(f"{dag_id}.py" for dag_id in RENDERED["examples/active-active.properties"]),
            "my_own_dag.py",
        ]
    )
    assert own.read_text() == "# written by hand\n"


def test_options_change_the_dags_and_check_compares_with_the_same_options(tmp_path, capsys):
    source = EXAMPLES / "active-passive.properties"
    options = ("--retries", "3", "--spark-conn-id", "spark_x")
    assert render_cli(source, "--out", tmp_path, *options) == 0
    text = (tmp_path / "mirror__secondary.py").read_text()
    assert '"retries": 3,' in text and 'conn_id="spark_x",' in text
    assert "--spark-conn-id spark_x --retries 3 --out <this folder>" in text
    assert render_cli(source, "--out", tmp_path, "--check") == 1
    assert render_cli(source, "--out", tmp_path, "--check", "--retries", "3") == 1
    assert render_cli(source, "--out", tmp_path, "--check", *options) == 0


def test_metrics_port_gives_each_site_job_its_own_port_in_target_order(tmp_path, capsys):
    from airflow.dag_processing.dagbag import DagBag

    source = EXAMPLES / "active-active.properties"
    assert render_cli(source, "--out", tmp_path, "--metrics-port", "9400") == 0
    ports = {}
    for target in ("primary", "secondary"):
        path = tmp_path / f"mirror__{target}.py"
        bag = DagBag(dag_folder=path, safe_mode=True)
        assert bag.import_errors == {}, bag.import_errors
        ((task,),) = [dag.tasks for dag in bag.dags.values()]
        ports[target] = task.metrics_port
        assert f"http://127.0.0.1:{task.metrics_port}/metrics" in path.read_text()
    assert ports == {"primary": 9400, "secondary": 9401}
    assert render_cli(source, "--out", tmp_path, "--check", "--metrics-port", "9400") == 0
    plain = tmp_path / "plain"
    assert render_cli(source, "--out", plain) == 0
    assert "metrics" not in (plain / "mirror__primary.py").read_text()  # off by default
    assert render_cli(source, "--out", plain, "--metrics-port", "70000") == 2


def test_a_drill_schedule_runs_the_drill_dags_non_destructively_on_it(tmp_path, capsys):
    from airflow.dag_processing.dagbag import DagBag

    source = EXAMPLES / "active-passive.properties"
    assert render_cli(source, "--out", tmp_path, "--drill-schedule", "0 3 * * 1") == 0
    path = tmp_path / "drill__primary__secondary.py"
    bag = DagBag(dag_folder=path, safe_mode=True)
    assert bag.import_errors == {}, bag.import_errors
    (dag,) = bag.dags.values()
    assert dag.schedule == "0 3 * * 1"
    assert dag.params["mode"] == "non-destructive"  # what a scheduled run does
    assert "--drill-schedule '0 3 * * 1' --out" in path.read_text()
    assert render_cli(source, "--out", tmp_path, "--check", "--drill-schedule", "0 3 * * 1") == 0
    assert render_cli(source, "--out", tmp_path / "x", "--drill-schedule", "every day") == 2
    assert "--drill-schedule 'every day' is not a cron expression" in capsys.readouterr().err


def test_render_refuses_flow_files_with_validation_errors_and_writes_nothing(tmp_path, capsys):
    # The Kafka docs' active/passive snippet has no `clusters` line: MM2 would not start.
    assert render_cli(SEEDS / "000-active-passive.properties", "--out", tmp_path) == 2
    err = capsys.readouterr().err
    assert "the flow files have 2 validation error(s), so no DAG is rendered" in err
    assert "error: clusters: missing" in err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_a_hand_written_file_with_a_generated_name_is_never_overwritten(tmp_path, capsys):
    mine = tmp_path / "mirror__secondary.py"
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
    ids = [
        "drill__primary__backup",
        "failover__primary__backup",
        "flow__primary__backup",
        "mirror__backup",
        "sync__backup",
    ]
    assert [d.dag_id for d in result.dags if d.kind != "failback"] == ids
    for dag in result.dags:
        for secret in (password, host, "backup-host", "alice", "jaas", "SASL", "truststore"):
            assert secret not in dag.text
    drill_dag, failover_dag, flow_dag, mirror_dag, _sync_dag = (
        d.text for d in result.dags if d.kind != "failback"
    )
    assert str(flow_file) in drill_dag and 'FLOW = "primary->backup"' in drill_dag
    assert str(flow_file) in failover_dag and 'FLOW = "primary->backup"' in failover_dag
    assert str(flow_file) in mirror_dag  # outside the project: the absolute path
    # Every string literal in the files is a name, a path or fixed text from the template.
    assert 'FLOW = "primary->backup"' in flow_dag
    assert '"primary->backup": "flow__primary__backup",' in mirror_dag


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
            kind, *names = dag.dag_id.split("__")
            assert {"mirrorflow", f"kind:{kind}"} <= set(dag.tags)
            assert seconds < 10, f"{path.name} took {seconds:.1f}s to parse"
            tasks = {task.task_id: task for task in dag.tasks}
            if kind == "sync":  # the site's syncs, on a schedule, with a dry run
                (target,) = names
                assert dag.schedule == timedelta(seconds=rendering.DEFAULT_SYNC_DAG_INTERVAL_S)
                assert set(dag.params) == {"dry_run"}
                # The examples' flows sync topics and emit checkpoints (MirrorMaker 2's defaults).
                assert set(tasks) == {"sync", "groups"}
                assert type(tasks["sync"]).__name__ == "SyncOperator"
                assert type(tasks["groups"]).__name__ == "GroupSyncOperator"
                for task in tasks.values():
                    assert task.flows and all(f.endswith(f"->{target}") for f in task.flows)
                assert not dag.task_dict["groups"].upstream_task_ids  # independent of `sync`
                continue
            if kind == "failover":  # the runbook, one task per step, triggered by hand
                flow = "{}->{}".format(*names)
                assert dag.schedule is None and dag.max_active_runs == 1
                # the runbook's steps in its order (mirrorflow.dr.failover)
                assert [t.task_id for t in dag.topological_sort()] == list(failover.STEPS)
                assert set(dag.params) == {
                    "mode",
                    "group_pattern",
                    "fence_principals",
                    "dry_run",
                    "catch_up_timeout_seconds",
                    "stop_timeout_seconds",
                    "failover_run",
                }
                assert dag.params["mode"] == "planned" and dag.params["group_pattern"] == ".*"
                assert dag.params["stop_timeout_seconds"] == 30 and dag.params["failover_run"] == ""
                modes = dag.params.get_param("mode").schema["enum"]
                assert modes == ["planned", "emergency", "auto", "rollback", "measure-rpo"]
                for task in tasks.values():
                    assert type(task).__name__ == "FailoverStepOperator" and task.flow == flow
                # A skipped step (an emergency's fencing, the failover's own steps in mode
                # rollback) never skips those after it: they decide for themselves.
                for step in ("fence-producers", "catch-up", "stop-mirror", "final-sync"):
                    assert tasks[step].trigger_rule == "none_failed"
                assert tasks["rollback"].trigger_rule == "none_failed"
                assert tasks["measure-rpo"].trigger_rule == "none_failed"
                assert tasks["report"].trigger_rule == "all_done"
                continue
            if kind == "failback":  # back after a failover, one task per step, by hand
                flow = "{}->{}".format(*names)
                assert dag.schedule is None and dag.max_active_runs == 1
                # the failback's steps in its order (mirrorflow.dr.failback)
                assert [t.task_id for t in dag.topological_sort()] == list(failback.STEPS)
                assert set(dag.params) == {
                    "group_pattern",
                    "fence_principals",
                    "dry_run",
                    "failover_run_id",
                }
                for task in tasks.values():
                    assert type(task).__name__ == "FailbackStepOperator" and task.flow == flow
                assert tasks["report"].trigger_rule == "all_done"
                continue
            if kind == "drill":  # the DR drill, one task per step, triggered by hand
                flow = "{}->{}".format(*names)
                assert dag.schedule is None and dag.max_active_runs == 1
                runbook = ["preflight", "fence-producers", "catch-up", "stop-mirror"]
                assert [t.task_id for t in dag.topological_sort()] == [
                    "preflight",
                    "traffic",
                    # a destructive drill's failover: the failover DAG's own tasks
                    *(f"emergency-failover.{s}" for s in [*runbook, "final-sync"]),
                    "failover",
                    "verify",
                    "emergency-failover-report",  # after the first read: not in the RTO
                    "restore",
                    "report",
                ]
                assert set(dag.params) == {
                    "mode",
                    "canaries",
                    "group_prefix",
                    "dry_run",
                    "traffic_seconds",
                    "rate",
                }
                assert dag.params["mode"] == "non-destructive"
                for task in tasks.values():
                    operator = type(task).__name__
                    assert task.flow == flow
                    assert operator == (
                        "DrillFailoverStepOperator"
                        if task.task_id.startswith("emergency-failover")
                        else "DrillStepOperator"
                    )
                assert tasks["failover"].trigger_rule == "all_done"  # collects a failure too
                assert tasks["emergency-failover-report"].trigger_rule == "all_done"
                assert tasks["restore"].trigger_rule == "all_done"
                assert tasks["report"].trigger_rule == "all_done"
                continue
            (task,) = dag.tasks
            if kind == "mirror":  # the site: every flow into it, in one job, always on
                (target,) = names
                assert dag.schedule == "@continuous" and dag.max_active_runs == 1
                assert type(task).__name__ == "MirrorFlowOperator"
                assert task.flows and all(f.endswith(f"->{target}") for f in task.flows)
                assert task.flow_dags == {
                    f: "flow__{}__{}".format(*f.split("->")) for f in task.flows
                }
                assert task.execution_timeout is None
                assert task.retries == 10 and task.retry_exponential_backoff == 2.0
            else:  # a flow's switch: unpaused at creation, runs only when triggered
                flow = "{}->{}".format(*names)
                assert kind == "flow" and dag.schedule is None
                assert dag.is_paused_upon_creation is False
                assert f"flow:{flow}" in dag.tags and f"flow `{flow}`" in dag.doc_md
                assert set(dag.params) == {"starting_offsets", "starting_timestamp", "restart"}
                assert type(task).__name__ == "FlowControlOperator" and task.flow == flow
    record_property("dag_parse_times", report)
    with capsys.disabled():
        print("\nDAG parse times (DagBag, one file each):\n" + "\n".join(report))


def test_every_flow_into_a_cluster_runs_in_its_mirror_dag_and_keeps_a_dag_of_its_own(tmp_path):
    # Seed 000's multi-cluster topology: 12 flows into 6 clusters (west-1 receives three).
    seed = (SEEDS / "000-multi-cluster.properties").read_text()
    flow_file = tmp_path / "multi-cluster.properties"
    flow_file.write_text(seed.replace("bootstrap.servers = ...", "bootstrap.servers = h:9092"))
    result = rendering.render([flow_file])
    mirror = {d.dag_id: d for d in result.dags if d.kind == "mirror"}
    flow_dags = sorted(d.dag_id for d in result.dags if d.kind == "flow")
    assert len(flow_dags) == 12 and len(mirror) == 6
    assert mirror["mirror__west-1"].flows == ("east-1->west-1", "north-1->west-1", "west-2->west-1")
    assert sorted(f for d in mirror.values() for f in d.flows) == sorted(
        "{}->{}".format(*dag_id.split("__")[1:]) for dag_id in flow_dags
    )
    text = mirror["mirror__west-1"].text
    for flow in mirror["mirror__west-1"].flows:
        source = flow.split("->")[0]
        assert f'"{flow}": "flow__{source}__west-1",' in text


def test_sites_co_located_by_mirror_application_share_one_mirror_dag(tmp_path, capsys):
    """Seed 000's 12 flows, every one in one application (``mirror.application`` at top level)
    but east-1's, which a flow-level setting keeps in an application of its own: two mirror
    DAGs; the flow and failover DAGs name theirs; the sync DAGs stay one per target."""
    seed = (SEEDS / "000-multi-cluster.properties").read_text()
    flow_file = tmp_path / "multi-cluster.properties"
    flow_file.write_text(
        seed.replace("bootstrap.servers = ...", "bootstrap.servers = h:9092")
        + "\nmirror.application = dc1\neast-1->west-1.mirror.application = solo\n"
    )
    result = rendering.render([flow_file])
    mirror = {d.dag_id: d for d in result.dags if d.kind == "mirror"}
    assert sorted(mirror) == ["mirror__dc1", "mirror__solo"]
    assert mirror["mirror__solo"].flows == ("east-1->west-1",)
    flows = sorted(d.flows[0] for d in result.dags if d.kind == "flow")
    assert sorted(mirror["mirror__dc1"].flows) == [f for f in flows if f != "east-1->west-1"]
    text = mirror["mirror__dc1"].text
    targets = sorted({f.split("->")[1] for f in mirror["mirror__dc1"].flows})
    assert len(targets) == 6 and all(f'"target:{t}",' in text for t in targets)
    assert "whose `mirror.application` is\n**dc1**" in text
    by_id = {d.dag_id: d.text for d in result.dags}
    assert "by the mirror job of DAG `mirror__solo`" in by_id["flow__east-1__west-1"]
    assert "in the mirror job of `mirror__dc1`" in by_id["failover__west-2__west-1"]
    assert len([d for d in result.dags if d.kind == "sync"]) == 6
    # A name Airflow cannot take in a DAG id is refused, in one line, before anything renders.
    flow_file.write_text(flow_file.read_text() + "mirror.application = dc 1\n")
    assert render_cli(flow_file, "--out", tmp_path / "dags") == 2
    err = capsys.readouterr().err
    assert "'dc 1' cannot name a mirror DAG (mirror__<name>)" in err
    assert not (tmp_path / "dags").exists()


def test_the_sync_dag_runs_at_the_shortest_sync_interval_its_flows_set(tmp_path):
    flow_file = tmp_path / "mm2.properties"
    lines = [
        "clusters = a, b, c",
        *(f"{c}.bootstrap.servers = {c}:9092" for c in "abc"),
        "a->c.enabled = true",
        "b->c.enabled = true",
        "b->c.sync.topic.acls.interval.seconds = 30",
        "a->c.sync.topic.configs.interval.seconds = 45",
        "a->b.enabled = true",
        "a->b.sync.topic.configs.enabled = false",
        "a->b.sync.topic.acls.enabled = false",
        "a->b.emit.checkpoints.enabled = false",
    ]
    flow_file.write_text("\n".join(lines) + "\n")
    dags = {d.dag_id: d for d in rendering.render([flow_file]).dags}
    assert "sync__b" not in dags, "a site whose flows sync nothing got a sync DAG"
    assert "schedule=datetime.timedelta(seconds=30)," in dags["sync__c"].text
    assert dags["sync__c"].flows == ("a->c", "b->c")


def test_checkpoints_give_a_groups_task_and_never_a_schedule_under_a_minute_of_their_own(
    tmp_path,
):
    flow_file = tmp_path / "mm2.properties"
    lines = [
        "clusters = a, b, c",
        *(f"{c}.bootstrap.servers = {c}:9092" for c in "abc"),
        # Into c: a->c syncs topics only, b->c checkpoints every 5 s and syncs group offsets.
        "a->c.enabled = true",
        "a->c.emit.checkpoints.enabled = false",
        "b->c.enabled = true",
        "b->c.emit.checkpoints.interval.seconds = 5",
        "b->c.sync.group.offsets.enabled = true",
        "b->c.sync.group.offsets.interval.seconds = 1",
        # Into b: checkpoints only (MirrorMaker 2's default), every 2 minutes.
        "a->b.enabled = true",
        "a->b.sync.topic.configs.enabled = false",
        "a->b.sync.topic.acls.enabled = false",
        "a->b.emit.checkpoints.interval.seconds = 120",
        # Into a: a short topic sync interval still sets the schedule.
        "c->a.enabled = true",
        "c->a.sync.topic.configs.interval.seconds = 20",
        "c->a.emit.checkpoints.interval.seconds = 1",
    ]
    flow_file.write_text("\n".join(lines) + "\n")
    dags = {d.dag_id: d.text for d in rendering.render([flow_file]).dags}

    site_c = dags["sync__c"]
    assert "schedule=datetime.timedelta(seconds=60)," in site_c  # not 5, not 1
    assert 'SYNC_FLOWS = [\n    "a->c",\n    "b->c",\n]' in site_c
    assert 'CHECKPOINT_FLOWS = [\n    "b->c",\n]' in site_c
    assert 'SyncOperator(task_id="sync", flows=SYNC_FLOWS' in site_c
    assert 'GroupSyncOperator(task_id="groups", flows=CHECKPOINT_FLOWS' in site_c
    assert "**Task `groups`** (for `b->c`)" in site_c
    assert "idle groups, never into a group" in site_c  # b->c syncs group offsets

    site_b = dags["sync__b"]  # only checkpoints: no topic sync task, no unused import
    assert "schedule=datetime.timedelta(seconds=120)," in site_b
    assert "SYNC_FLOWS =" not in site_b and 'task_id="sync"' not in site_b
    assert "from mirrorflow.airflow.operators import GroupSyncOperator\n" in site_b
    assert "--checkpoints-only" in site_b  # no flow into b syncs group offsets

    assert "schedule=datetime.timedelta(seconds=20)," in dags["sync__a"]


def test_the_dr_dags_take_their_tasks_and_defaults_from_the_runbooks(monkeypatch, tmp_path):
    """A step added to a runbook, or a Param default changed there, is in the next rendering:
    the DAG cannot drift from the workflow it runs."""
    monkeypatch.setattr(failback.WORKFLOW, "steps", (*failback.STEPS[:-1], "extra", "report"))
    monkeypatch.setitem(failover.FailoverRequest.PARAMS, "mode", ("mode", str, "auto"))
    monkeypatch.setitem(
        failover.FailoverRequest.PARAMS,
        "stop_timeout_s",
        ("stop_timeout_seconds", float, 45),
    )
    assert render_cli(EXAMPLES / "active-passive.properties", "--out", tmp_path) == 0
    failback_dag = (tmp_path / "failback__primary__secondary.py").read_text()
    assert '("resume", "none_failed"),\n            ("extra", "none_failed"),\n' in failback_dag
    assert '("report", "all_done"),' in failback_dag
    failover_dag = (tmp_path / "failover__primary__secondary.py").read_text()
    assert '"mode": Param(\n            "auto",' in failover_dag
    assert '"stop_timeout_seconds": Param(\n            45,' in failover_dag
