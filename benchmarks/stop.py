"""Stop under load: how long ``mirrorflow mirror`` takes to stop on SIGTERM with a batch in
flight, and what the stop leaves behind (issue 27: until now a stop was measured only once the
flow had caught up).

Per delivery mode and run, on two fresh sandbox clusters:

1. ``primary``'s topic ``stop`` (8 partitions) gets a backlog of ``--records`` records of
   ``--record-size`` bytes, and a writer keeps adding ``--rate`` records per second all along;
2. ``mirrorflow mirror`` starts with its defaults (batches of up to 500,000 records, grace
   period 120 s) and copies the backlog in big batches;
3. once the target holds ``--stop-after`` copies (a big batch is in flight: its first copies
   are on the target, its positions are not written yet), SIGTERM goes to ``mirrorflow
   mirror``, as a supervisor or a shell stops it. **stop s** is from the signal to its exit,
   with every process of the job gone;
4. the writer stops, a ``--once`` run of the same flow copies the rest, and the target is read
   back: every source record must be there (**lost**), and **copied twice** counts what the
   restart copied again (at least once, the copies between the last positions written and the
   stop; exactly once it must be 0: read with read_committed).

Results go to ``benchmarks/results/stop-<time>.json`` and a table is printed:

    venv=$(scripts/bootstrap.sh)
    PATH=$venv/bin:$PATH PYTHONPATH=$PWD $venv/bin/python benchmarks/stop.py --runs 3
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from mirrorflow.devtools import sandbox as sandbox_mod
from mirrorflow.paths import write_private
from mirrorflow.runtime import launch, processes

sys.path.insert(0, str(Path(__file__).parent))
from dr_rto import Writer, log  # benchmarks/ is no package

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
TOPIC, PARTITIONS, FLOW = "stop", 8, "primary->secondary"
EXACTLY_ONCE = ["secondary.exactly.once.source.support = enabled"]


def load_backlog(cluster: sandbox_mod.Cluster, records: int, size: int) -> None:
    producer = Producer(
        {
            **cluster.client_config(),
            "enable.idempotence": True,
            "linger.ms": 50,
            "batch.size": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    body = os.urandom(size)
    for i in range(records):
        while True:
            try:
                producer.produce(TOPIC, body, b"b%d" % i, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(300) == 0, "the backlog was not written"


def end_offsets(cluster: sandbox_mod.Cluster, topic: str) -> dict[int, int]:
    consumer = Consumer({**cluster.client_config(), "group.id": "stop-bench-ends"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    except Exception:  # the remote topic does not exist yet
        return {}
    finally:
        consumer.close()


def keys(cluster: sandbox_mod.Cluster, topic: str) -> collections.Counter:
    """Every record key of ``topic`` (read_committed), counted."""
    ends = end_offsets(cluster, topic)
    consumer = Consumer(
        {
            **cluster.client_config(),
            "group.id": "stop-bench-read",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end])
    pending, found = {p for p, end in ends.items() if end}, collections.Counter()
    deadline = time.monotonic() + 300
    while pending and time.monotonic() < deadline:
        for msg in consumer.consume(10_000, 1.0):
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                continue
            found[msg.key()] += 1
    consumer.close()
    assert not pending, f"could not read {topic} to its end"
    return found


def one_run(work: Path, delivery: str, args: argparse.Namespace) -> dict:
    names = ["primary", "secondary"]
    base = sandbox_mod.free_port_block(len(names) * sandbox_mod.PORTS_PER_CLUSTER)
    box = sandbox_mod.up(names, work / "sandbox", base_port=base)
    writer = None
    try:
        admin = AdminClient(box["primary"].client_config())
        for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
            future.result(30)
        lines = box.mm2_lines(names)
        lines += [
            f"{FLOW}.enabled = true",
            f"{FLOW}.topics = {TOPIC}",
            *(EXACTLY_ONCE if delivery == "exactly-once" else []),
        ]
        config = write_private(work / "mm2.properties", "\n".join(lines) + "\n")
        log(f"{delivery}: writing a backlog of {args.records:,} records")
        load_backlog(box["primary"], args.records, args.record_size)
        writer = Writer(box["primary"], TOPIC, args.rate, PARTITIONS)
        writer.start()
        state = work / "state"
        command = [sys.executable, "-m", "mirrorflow.cli", "mirror", str(config)]
        command += ["--flow", FLOW, "--state-dir", str(state)]
        with open(work / "job.log", "ab") as out:
            job = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=launch.job_environment(),
                cwd=REPO,
                start_new_session=True,
            )
        remote = f"primary.{TOPIC}"
        deadline = time.monotonic() + 600
        while sum(end_offsets(box["secondary"], remote).values()) < args.stop_after:
            assert job.poll() is None, f"the job ended early; see {work / 'job.log'}"
            assert time.monotonic() < deadline, "the job did not copy"
            time.sleep(0.2)
        at_signal = sum(end_offsets(box["secondary"], remote).values())
        tree = [job.pid, *processes.descendants(job.pid)]
        signalled = time.monotonic()
        job.send_signal(signal.SIGTERM)
        code = job.wait(600)
        exited = time.monotonic() - signalled
        while any(processes.alive(p) for p in tree):
            time.sleep(0.05)
        gone = time.monotonic() - signalled
        at_exit = sum(end_offsets(box["secondary"], remote).values())
        log(f"{delivery}: stopped in {gone:.1f} s (exit code {code})")
        writer.stop()
        writer = None
        done = subprocess.run(
            [*command, "--once"],
            capture_output=True,
            text=True,
            env=launch.job_environment(),
            cwd=REPO,
            timeout=1200,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        source, target = keys(box["primary"], TOPIC), keys(box["secondary"], remote)
        lost = sum(1 for k in source if k not in target)
        twice = sum(n - 1 for n in target.values() if n > 1)
        return {
            "delivery": delivery,
            "stop_s": round(gone, 2),
            "cli_exit_s": round(exited, 2),
            "exit_code": code,
            "copies_at_signal": at_signal,
            "copies_at_exit": at_exit,
            "source_records": sum(source.values()),
            "lost": lost,
            "copied_twice": twice,
        }
    finally:
        if writer is not None:
            writer.stop()
        sandbox_mod.down(box.directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--record-size", type=int, default=1024)
    parser.add_argument("--rate", type=int, default=2_000, help="records/s written meanwhile")
    parser.add_argument("--stop-after", type=int, default=200_000, help="copies before SIGTERM")
    parser.add_argument("--only", default="at-least-once,exactly-once")
    args = parser.parse_args(argv)
    results = []
    for delivery in args.only.split(","):
        for index in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="mirrorflow-stop-") as work:
                results.append({"run": index + 1, **one_run(Path(work), delivery, args)})
    RESULTS.mkdir(exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"stop-{stamp}.json"
    out.write_text(
        json.dumps({"args": vars(args), "load": os.getloadavg(), "runs": results}, indent=2)
    )
    print(f"\n{'delivery':<14} {'stop s':>8} {'exit':>5} {'lost':>6} {'twice':>7}")
    for r in results:
        print(
            f"{r['delivery']:<14} {r['stop_s']:>8.1f} {r['exit_code']:>5} {r['lost']:>6} "
            f"{r['copied_twice']:>7}"
        )
    for delivery in dict.fromkeys(r["delivery"] for r in results):
        times = [r["stop_s"] for r in results if r["delivery"] == delivery]
        print(f"{delivery}: median stop {statistics.median(times):.1f} s (max {max(times):.1f})")
    print(f"results: {out}")
    return 1 if any(r["lost"] or r["exit_code"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
