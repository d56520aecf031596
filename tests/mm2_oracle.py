"""MirrorMaker 2's own classes as a test oracle: ``tests/java/Mm2Oracle.java`` in one JVM.

The Java program is compiled once per test session onto the classpath of the connect-mirror
jars (MirrorMaker 2 resolved from Maven Central) and answers one command per line.
"""

from __future__ import annotations

import atexit
import functools
import subprocess
import tempfile
from dataclasses import astuple, fields
from pathlib import Path
from typing import TypeVar

from mirrorflow.mm2.formats import Checkpoint, Heartbeat, OffsetSync
from mirrorflow.runtime import jvm

SOURCE = Path(__file__).parent / "java" / "Mm2Oracle.java"

Record = Heartbeat | Checkpoint | OffsetSync
R = TypeVar("R", Heartbeat, Checkpoint, OffsetSync)
_COMMANDS = {Heartbeat: "heartbeat", Checkpoint: "checkpoint", OffsetSync: "offset-sync"}


class Mm2Rejected(Exception):
    """MirrorMaker 2's code threw while handling the command."""


class Mm2Oracle:
    """A running ``Mm2Oracle`` JVM; see the Java source for the commands."""

    def __init__(self, classpath: str) -> None:
        self._process = subprocess.Popen(
            # -ea turns on MirrorMaker 2's own assertions (sync-array invariants, versions).
            [
                jvm.require_tool("java", "to run the MirrorMaker 2 test oracle"),
                "-ea",
                "-Dlog4j2.level=OFF",
                "-cp",
                classpath,
                "org.apache.kafka.connect.mirror.Mm2Oracle",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )

    def ask(self, *words: object) -> list[str]:
        """Send one command; its answer split into words, or Mm2Rejected."""
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(" ".join(map(str, words)) + "\n")
        self._process.stdin.flush()
        answer = self._process.stdout.readline()
        if not answer:
            raise RuntimeError(f"Mm2Oracle exited with {self._process.wait()}")
        if answer.startswith("error "):
            raise Mm2Rejected(answer.removeprefix("error ").strip())
        return answer.rstrip("\n").split(" ")

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        self._process.wait(timeout=30)

    # Wire formats: fields in declaration order, strings as hex of their UTF-8 bytes.

    def encode(self, record: Record) -> tuple[bytes, bytes]:
        """The key and value that MirrorMaker 2 writes for ``record``."""
        words = [_hex(v) if isinstance(v, str) else v for v in astuple(record)]
        key, value = self.ask(f"{_COMMANDS[type(record)]}-encode", *words)
        return bytes.fromhex(key), bytes.fromhex(value)

    def decode(self, kind: type[R], key: bytes, value: bytes) -> R:
        """What MirrorMaker 2 reads from a ``kind`` record, or Mm2Rejected."""
        words = self.ask(f"{_COMMANDS[kind]}-decode", key.hex(), value.hex())
        return kind(
            *(
                _text(word) if field.type == "str" else int(word)
                for field, word in zip(fields(kind), words, strict=True)
            )
        )

    # OffsetSyncWriter and OffsetSyncStore, on topic "t".

    def writer(self, max_offset_lag: int, ops: list[str]) -> list[list[tuple[int, int, int]]]:
        """Per op ("copy,P,UP:DOWN,..." or "promote"), the (partition, up, down) syncs sent."""
        (answer,) = self.ask("writer", max_offset_lag, ";".join(ops))
        return [
            [tuple(map(int, sync.split(":"))) for sync in sent.split(",") if sync]
            for sent in answer.split(";")
        ]

    def store(self, initialization_must_read_to_end: bool, ops: list[str]) -> list[str]:
        """Per op ("sync,P,UP,DOWN", "start", "translate,P,UP"), the store's raw answer."""
        (answer,) = self.ask("store", str(initialization_must_read_to_end).lower(), ";".join(ops))
        return answer.split(";")

    # RemoteClusterUtils against a real cluster: what a Java consumer reads from checkpoints.

    def remote_translate(
        self, cluster_client_props: dict[str, str], alias: str, group: str, timeout_ms: int = 10000
    ) -> dict[tuple[str, int], tuple[int, str]]:
        """``RemoteClusterUtils.translateOffsets`` for ``group`` from the checkpoints of
        ``alias`` on the cluster that ``cluster_client_props`` (Java client settings, e.g.
        ``Cluster.java_client_config()``) connect to: (topic, partition) -> (offset, metadata)."""
        words = self.ask(
            "remote-translate", _props(cluster_client_props), _hex(alias), _hex(group), timeout_ms
        )
        return dict(_offset(word.split(":")) for word in words if word != "none")

    def worker_setting(
        self, mm2_properties: dict[str, str], source: str, target: str, name: str
    ) -> str | None:
        """``MirrorMakerConfig.workerConfig(source->target)``'s value of ``name`` for the
        properties of a whole mm2.properties, or None."""
        (word,) = self.ask(
            "worker-config", _props(mm2_properties), _hex(source), _hex(target), _hex(name)
        )
        return None if word == "none" else _text(word)

    def remote_translate_pattern(
        self,
        cluster_client_props: dict[str, str],
        alias: str,
        group_pattern: str,
        timeout_ms: int = 10000,
    ) -> dict[str, dict[tuple[str, int], tuple[int, str]]]:
        """The batch ``translateOffsets(props, alias, Pattern, timeout)``: per group whose id
        fully matches the Java regex ``group_pattern``, as :meth:`remote_translate`."""
        words = self.ask(
            "remote-translate-pattern",
            _props(cluster_client_props),
            _hex(alias),
            _hex(group_pattern),
            timeout_ms,
        )
        by_group: dict[str, dict[tuple[str, int], tuple[int, str]]] = {}
        for word in words:
            if word != "none":
                group, *rest = word.split(":")
                tp, offset = _offset(rest)
                by_group.setdefault(_text(group), {})[tp] = offset
        return by_group


def _props(props: dict[str, str]) -> str:
    return ",".join(f"{_hex(k)}={_hex(v)}" for k, v in props.items())


def _offset(fields: list[str]) -> tuple[tuple[str, int], tuple[int, str]]:
    topic, partition, offset, metadata = fields
    return (_text(topic), int(partition)), (int(offset), _text(metadata))


def _hex(text: str) -> str:
    return text.encode("utf-8").hex()


def _text(hex_text: str) -> str:
    return bytes.fromhex(hex_text).decode("utf-8")


@functools.cache
def shared() -> Mm2Oracle:
    """The session's oracle: compiled and started on first use, stopped at exit."""
    classpath = jvm.classpath("mirrormaker")
    javac = jvm.require_tool("javac", "to compile the MirrorMaker 2 test oracle")
    classes = tempfile.TemporaryDirectory(prefix="mm2-oracle-")
    atexit.register(classes.cleanup)
    subprocess.run(
        [javac, "-nowarn", "-d", classes.name, "-cp", classpath, str(SOURCE)], check=True
    )
    oracle = Mm2Oracle(f"{classes.name}:{classpath}")
    atexit.register(oracle.close)  # runs before the cleanup: atexit is last in, first out
    return oracle
