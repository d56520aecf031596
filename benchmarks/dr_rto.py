"""DR benchmark: the RTO of an emergency failover, and of a destructive drill of the same flow,
with the source broker really killed (SIGKILL) while the site's mirror job copies.

The scenario is the one ``tests/test_failover_storm.py`` checks for correctness, run for time: a
site job (``mirrorflow mirror``, one Spark application) runs ``primary->secondary`` and
``tertiary->secondary``; producers write to both sources all along (``--rate`` records per second
to ``primary``'s ``orders``). Per run:

* ``cli``: a consumer group reads ``orders`` on ``primary`` for a few seconds, commits, stops;
  its commit is checkpointed once the flow has copied it (as the job does every
  ``emit.checkpoints.interval.seconds``); ``primary``'s broker is killed; at once (the trigger)
  ``mirrorflow failover --mode emergency --groups <group>`` runs the runbook in a new process;
  when it ends, a consumer of the group on ``secondary`` subscribes to ``primary.orders``: the
  **RTO** is from the trigger to its first record. The failover's own step times come from its
  report. ``primary`` then comes back, ``--mode measure-rpo`` counts what the cut left behind
  (the **measured RPO**, beside the estimate the failover made without the source), the hold is
  released and the flow catches up.
* ``dag``: the same, with the failover DAG (``dag.test()`` in a new Python process, as
  ``tests/dag_harness.py`` runs DAGs; the trigger is that process's start).
* ``drill``: the drill DAG in destructive mode (``dag.test()``): its RTO (from the kill, which it
  makes itself, to the drill group's first read on the target) and RPO from its report, and the
  inner failover's step times.
* ``airflow-dag`` and ``airflow-drill``: the same DAGs run as a user runs them, by Airflow's
  services (api-server, dag-processor, scheduler with the LocalExecutor: a process per task),
  triggered through its REST API as the UI's Trigger button does; the failover's trigger is that
  request.

Results go to ``benchmarks/results/dr-<time>.json`` and a table is printed. Run it on a quiet
machine (the load average is recorded):

    venv=$(scripts/bootstrap.sh)
    PATH=$venv/bin:$PATH PYTHONPATH=$PWD $venv/bin/python benchmarks/dr_rto.py --runs 5
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import quote

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from mirrorflow.airflow import rendering
from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.devtools.local_airflow import Api, LocalAirflow
from mirrorflow.dr.drill_traffic import DRILL_TOPIC
from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import write_private
from mirrorflow.replication.group_offset_sync import run_group_sync
from mirrorflow.replication.remote_cluster import flow_positions
from mirrorflow.replication.spec import spec_for_flow
from mirrorflow.runtime import guard, jobs, launch

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"
FLOW, OTHER = "primary->secondary", "tertiary->secondary"
TOPIC, OTHER_TOPIC, PARTITIONS = "orders", "stock", 4
EXACTLY_ONCE = [
    "secondary.exactly.once.source.support = enabled",
    "primary.consumer.isolation.level = read_committed",
    "tertiary.consumer.isolation.level = read_committed",
]


def log(message: str) -> None:
    print(f"[{dt.datetime.now(dt.UTC):%H:%M:%S}] {message}", flush=True)


class Writer(threading.Thread):
    """Writes to a topic at ``rate`` records per second until stopped. While its cluster is
    away, what it could not deliver within 5 s is dropped (as a producer failing over would
    give up on the old site): a record written to the source after it came back has a
    timestamp of then, so the RPO measured once it is back counts what was acknowledged before
    the cut and not copied, nothing buffered meanwhile."""

    def __init__(self, cluster: sandbox_mod.Cluster, topic: str, rate: int, partitions: int):
        super().__init__(daemon=True)
        self.producer = Producer(
            {
                **cluster.client_config(),
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 5_000,
                "logger": _quiet(),
            }
        )
        self.topic, self.rate, self.partitions = topic, rate, partitions
        self.stopped = threading.Event()

    def run(self) -> None:
        i, following = 0, time.monotonic()
        while not self.stopped.is_set():
            with contextlib.suppress(BufferError):
                self.producer.produce(
                    self.topic, key=b"k%d" % i, value=b"v" * 100, partition=i % self.partitions
                )
                i += 1
            self.producer.poll(0)
            following += 1 / self.rate
            time.sleep(max(0.0, following - time.monotonic()))

    def stop(self) -> None:
        self.stopped.set()
        self.join(10)
        self.producer.flush(30)


def _quiet():
    import logging

    quiet = logging.getLogger("benchmark.clients")
    quiet.setLevel(logging.CRITICAL)
    return quiet


def first_read(cluster: sandbox_mod.Cluster, topic: str, group: str, timeout: float) -> float:
    """A consumer of ``group`` subscribes to ``topic`` and reads: when its first record came."""
    consumer = Consumer(
        {
            **cluster.client_config(),
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
            "isolation.level": "read_committed",
            "logger": _quiet(),
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                return time.time()
        raise RuntimeError(f"group {group} read nothing on {topic} within {timeout:.0f}s")
    finally:
        consumer.close()


def read_and_commit(cluster: sandbox_mod.Cluster, topic: str, group: str, seconds: float) -> None:
    consumer = Consumer(
        {
            **cluster.client_config(),
            "group.id": group,
            "auto.offset.reset": "latest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "logger": _quiet(),
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(500, 0.2):
                if message.error() is None:
                    consumer.commit(asynchronous=False)
                    break
    finally:
        consumer.close()


def committed(cluster: sandbox_mod.Cluster, topic: str, group: str) -> dict:
    from confluent_kafka import TopicPartition

    consumer = Consumer({**cluster.client_config(), "group.id": group, "logger": _quiet()})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], 30)
        return {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}
    finally:
        consumer.close()


def positions(spec) -> dict:
    try:
        return flow_positions(spec)
    except MirrorflowError:
        return {}


def wait(condition, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


class Scenario:
    """The clusters, the flow file, the site job, the writers and an Airflow home, for one
    delivery mode."""

    def __init__(self, work: Path, delivery: str, rate: int) -> None:
        self.work, self.delivery, self.rate = work, delivery, rate
        self.state = work / "state"
        self.flows = self.state / "flows"
        self.box: sandbox_mod.Sandbox | None = None
        self.job: subprocess.Popen | None = None
        self.writers: list[Writer] = []
        self.airflow = LocalAirflow(
            work / "airflow",
            self.state,
            settings={"MIRRORFLOW_SANDBOX": str(work / "sandbox")},  # the drill kills in it
        )

    def start(self) -> None:
        names = ["primary", "secondary", "tertiary"]
        base = sandbox_mod.free_port_block(len(names) * sandbox_mod.PORTS_PER_CLUSTER)
        self.box = box = sandbox_mod.up(names, self.work / "sandbox", base_port=base)
        for cluster, topic, partitions in (
            (box["primary"], TOPIC, PARTITIONS),
            (box["tertiary"], OTHER_TOPIC, 2),
        ):
            admin = AdminClient(cluster.client_config())
            for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
                future.result(30)
        admin = AdminClient(box["primary"].client_config())
        for future in admin.create_topics([NewTopic(DRILL_TOPIC, 2, 1)]).values():
            future.result(30)
        lines = box.mm2_lines(names)
        lines += [
            f"{FLOW}.enabled = true",
            f"{FLOW}.topics = {TOPIC}, {DRILL_TOPIC}",
            f"{FLOW}.groups = app-.*, mirrorflow-drill-.*",
            f"{OTHER}.enabled = true",
            f"{OTHER}.topics = {OTHER_TOPIC}",
            "emit.checkpoints.interval.seconds = 5",
            *(EXACTLY_ONCE if self.delivery == "exactly-once" else []),
        ]
        self.config = write_private(self.work / "mm2.properties", "\n".join(lines) + "\n")
        self.spec = spec_for_flow([self.config], FLOW)
        command = launch.mirror_command(
            [self.config], [FLOW, OTHER], master="local[2]", state_dir=self.flows
        )
        with open(self.work / "job.log", "ab") as out:
            self.job = subprocess.Popen(
                guard.guarded(command),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=launch.job_environment(),
                cwd=REPO,
                start_new_session=True,
            )
        self.writers = [
            Writer(box["primary"], TOPIC, self.rate, PARTITIONS),
            Writer(box["tertiary"], OTHER_TOPIC, 50, 2),
        ]
        for writer in self.writers:
            writer.start()
        wait(lambda: sum(positions(self.spec).values()) > 0, 300, "the first copies")
        self.airflow.migrate()
        result = rendering.render([self.config], rendering.RenderOptions())
        folder = self.airflow.dags_folder / "mirrorflow"
        rendering.write(result, folder)
        chosen = [d for d in result.dags if FLOW in d.flows and d.kind in ("failover", "drill")]
        self.dag_files = {d.kind: folder / d.filename for d in chosen}
        self.dag_ids = {d.kind: d.dag_id for d in chosen}
        for path in folder.glob("*.py"):  # the benchmark's own job runs the flows: no other DAG
            if path not in self.dag_files.values():
                path.unlink()
        self.api: Api | None = None

    def services(self) -> Api:
        """Airflow's api-server, dag-processor and scheduler, started once; its API."""
        if self.api is None:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            self.airflow.choose_port(port)
            self.airflow.start_services(("api-server", "dag-processor", "scheduler"))
            self.airflow.wait_for_api()
            self.api = self.airflow.api()
            self.airflow.wait_for_dags(self.api, list(self.dag_ids.values()))
            for dag_id in self.dag_ids.values():
                self.api.unpause(dag_id)
        return self.api

    @property
    def primary(self) -> sandbox_mod.Cluster:
        assert self.box is not None
        return sandbox_mod.load(self.box.directory)["primary"]

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            **self.airflow.environment(),
            "MIRRORFLOW_STATE": str(self.state),
            "MIRRORFLOW_SANDBOX": str(self.work / "sandbox"),
            "PYTHONPATH": str(REPO),
        }

    def restore(self) -> None:
        """``primary`` running again, the flow released and caught up with it."""
        assert self.box is not None
        if not self.primary.is_running():
            sandbox_mod.up(["primary"], self.box.directory)
        jobs.release(self.flows / "primary-secondary")
        jobs.set_paused(self.flows / "primary-secondary", False)
        admin = AdminClient(self.primary.client_config())

        def caught_up() -> bool:
            from confluent_kafka import TopicPartition
            from confluent_kafka.admin import OffsetSpec

            try:
                futures = admin.list_offsets(
                    {TopicPartition(TOPIC, p): OffsetSpec.latest() for p in range(PARTITIONS)}
                )
                ends = {(t.topic, t.partition): f.result(10).offset for t, f in futures.items()}
            except Exception:
                return False
            at = positions(self.spec)
            return all(at.get(tp, 0) >= end - 2 * self.rate for tp, end in ends.items())

        wait(caught_up, 300, "the flow to catch up after the restore", interval=2)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.airflow.stop_services(say=lambda _line: None)
        for writer in self.writers:
            with contextlib.suppress(Exception):
                writer.stop()
        if self.job is not None and self.job.poll() is None:
            self.job.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.job.wait(60)
        if self.box is not None:
            with contextlib.suppress(Exception):
                sandbox_mod.down(self.box.directory)


def dag_test(dag_file: Path, conf: dict, env: dict, log_file: Path) -> dict:
    script = textwrap.dedent(f"""
        import json, runpy
        dag = runpy.run_path({str(dag_file)!r})["dag"]
        run = dag.test(run_conf=json.loads({json.dumps(conf)!r}))
        print("RESULT=" + json.dumps({{"state": str(run.state), "run_id": run.run_id}}))
    """)
    with open(log_file, "wb") as out:
        command = [sys.executable, "-c", script]
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=900)
    lines = [ln for ln in log_file.read_text().splitlines() if ln.startswith("RESULT=")]
    if not lines:
        raise RuntimeError(f"dag.test of {dag_file.name} gave no result: see {log_file}")
    return json.loads(lines[-1].removeprefix("RESULT="))


def trigger_and_wait(api: Api, dag_id: str, conf: dict, timeout: float = 900) -> dict:
    """Trigger ``dag_id`` through Airflow's REST API (as the UI's Trigger button does) and wait
    until its run ends: its state and run id."""
    body = json.dumps({"logical_date": None, "conf": conf}).encode()
    run = api._call("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)
    run_id = run["dag_run_id"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = api._call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id)}")
        if found["state"] in ("success", "failed"):
            return {"state": found["state"], "run_id": run_id}
        time.sleep(0.2)
    raise RuntimeError(f"{dag_id} run {run_id} did not end within {timeout:.0f}s")


def report(state: Path, kind: str, run_id: str) -> dict:
    directory = (
        state
        / "reports"
        / kind
        / "".join(c if c.isalnum() or c in "_.-" else "_" for c in run_id).strip("._")
    )
    return json.loads((directory / "report.json").read_text())


def step_seconds(data: dict) -> dict[str, float]:
    return {s["step"]: s["seconds"] for s in data.get("steps", []) if s.get("seconds") is not None}


def failover_run(scenario: Scenario, how: str, index: int) -> dict:
    """One emergency failover (``cli`` or ``dag``) with the source killed mid-traffic."""
    assert scenario.box is not None
    group = f"app-{how}-{index}-{int(time.time())}"
    read_and_commit(scenario.primary, TOPIC, group, 4.0)
    offsets = committed(scenario.primary, TOPIC, group)
    wait(
        lambda: all(positions(scenario.spec).get(tp, 0) >= o for tp, o in offsets.items()),
        120,
        "the group's commit to be copied",
    )
    run_group_sync(scenario.spec, {group}, sync_offsets=False)  # its checkpoint, as the job's
    time.sleep(2)
    api = scenario.services() if how == "airflow-dag" else None  # running before the kill
    sandbox_mod.kill(scenario.box.directory, ["primary"])
    trigger = time.time()
    run_id = f"bench__{how}_{index}_{int(trigger)}"
    env = scenario.environment()
    out = scenario.work / f"{run_id}.log"
    if how == "cli":
        command = [sys.executable, "-m", "mirrorflow.cli", "failover", str(scenario.config)]
        command += ["--flow", FLOW, "--mode", "emergency", "--groups", group]
        command += ["--state-dir", str(scenario.flows), "--run-id", run_id]
        with open(out, "wb") as handle:
            done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
        ok = done.returncode == 0
    else:
        conf = {"mode": "emergency", "group_pattern": group}
        if api is not None:
            result = trigger_and_wait(api, scenario.dag_ids["failover"], conf)
        else:
            result = dag_test(scenario.dag_files["failover"], conf, env, out)
        ok, run_id = result["state"] == "success", result["run_id"]
    failed_over = time.time()
    if not ok:
        raise RuntimeError(f"the {how} failover failed: see {out}")
    read_at = first_read(scenario.box["secondary"], f"primary.{TOPIC}", group, 120)
    data = report(scenario.state, "failover", run_id)
    figures = {
        "how": how,
        "rto_s": round(read_at - trigger, 3),
        "failover_s": round(failed_over - trigger, 3),
        "steps_s": step_seconds(data),
        "rpo_estimate": (data.get("rpo") or {}).get("summary_short"),
    }
    sandbox_mod.up(["primary"], scenario.box.directory)
    measure = scenario.work / f"{run_id}-rpo.log"
    command = [sys.executable, "-m", "mirrorflow.cli", "failover", str(scenario.config)]
    command += ["--flow", FLOW, "--mode", "measure-rpo", "--failover-run", run_id]
    command += ["--state-dir", str(scenario.flows), "--run-id", run_id + "-rpo"]
    with open(measure, "wb") as handle:
        subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
    measured = report(scenario.state, "failover", run_id).get("measured_rpo") or {}
    figures["rpo_measured"] = measured.get("records")
    scenario.restore()
    return figures


def drill_run(scenario: Scenario, how: str, index: int) -> dict:
    env = scenario.environment()
    out = scenario.work / f"{how}-{index}.log"
    conf = {"mode": "destructive", "traffic_seconds": 8, "rate": scenario.rate}
    if how == "airflow-drill":
        result = trigger_and_wait(scenario.services(), scenario.dag_ids["drill"], conf)
    else:
        result = dag_test(scenario.dag_files["drill"], conf, env, out)
    if not (scenario.state / "reports" / "drill").exists() or result["state"] != "success":
        raise RuntimeError(f"{how} run {index}: {result} (see {out})")
    data = report(scenario.state, "drill", result["run_id"])
    figures = data.get("figures") or {}
    row = {
        "how": how,
        "state": result["state"],
        "rto_s": figures.get("rto_s"),
        "failover_s": data.get("failover_seconds"),
        "steps_s": {
            s["step"]: s["seconds"]
            for s in data.get("failover_steps") or []
            if s.get("seconds") is not None
        },
        "rpo_records": figures.get("rpo_records"),
        "rpo_measured": (data.get("measured_rpo") or {}).get("records"),
    }
    scenario.restore()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--delivery", default="exactly-once,at-least-once")
    parser.add_argument(
        "--what",
        default="cli,dag,drill",
        help="comma-separated: cli, dag, drill, airflow-dag, airflow-drill",
    )
    parser.add_argument("--rate", type=int, default=200, help="records/s written to the source")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    results: dict = {
        "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "load_at_start": os.getloadavg(),
        "git": subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip(),
        "runs": [],
    }
    for delivery in args.delivery.split(","):
        work = Path(tempfile.mkdtemp(prefix=f"mirrorflow-dr-{delivery}-"))
        scenario = Scenario(work, delivery, args.rate)
        try:
            log(f"{delivery}: starting the clusters, the site job and an Airflow home in {work}")
            scenario.start()
            for index in range(args.runs):
                for how in args.what.split(","):
                    try:
                        row = (
                            drill_run(scenario, how, index)
                            if how.endswith("drill")
                            else failover_run(scenario, how, index)
                        )
                    except Exception as exc:  # counted as a failed run; the others go on
                        row = {"how": how, "rto_s": None, "error": repr(exc)[:500]}
                        log(f"{how} run {index} failed: {exc!r} (logs in {work})")
                        with contextlib.suppress(Exception):
                            scenario.restore()
                    row.update(delivery=delivery, run=index, load=os.getloadavg()[0])
                    results["runs"].append(row)
                    log(json.dumps(row))
        finally:
            scenario.stop()
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = RESULTS_DIR / f"dr-{stamp}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print("\n| delivery | how | runs | RTO s: median (min-max) |")
    print("| --- | --- | --- | --- |")
    for delivery in args.delivery.split(","):
        for how in args.what.split(","):
            rtos = [
                r["rto_s"]
                for r in results["runs"]
                if r["delivery"] == delivery and r["how"] == how and r.get("rto_s") is not None
            ]
            if rtos:
                print(
                    f"| {delivery} | {how} | {len(rtos)} | {statistics.median(rtos):.1f} "
                    f"({min(rtos):.1f}-{max(rtos):.1f}) |"
                )
    print(f"\nresults: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
