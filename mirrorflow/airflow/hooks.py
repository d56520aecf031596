"""``MirrorJobHook``: where a mirror job's Spark runs, and the job's process while it runs.

The Spark master comes from an Airflow connection of type ``spark`` (the Apache Spark
provider's type, so the UI's connection form fits): its host (``local[*]``, ``spark://host``,
``yarn``, ``k8s://…``) and, if set, its port. Without a ``spark_default`` connection the job runs
on ``local[*]``. The hook starts the one command line every launcher uses
(:func:`mirrorflow.runtime.launch.mirror_command`), in a process group of its own, and copies
its output into the task's log line by line. Only public Airflow API is used.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException

DEFAULT_CONN_ID = "spark_default"
LOCAL_MASTER = "local[*]"
ERROR_LINE = "mirrorflow: error:"  # how the job reports what stopped it (spark_jobs/mirror.py)


class MirrorJobHook(BaseHook):
    """Launches a mirror job on the Spark master of connection ``conn_id`` and supervises it."""

    conn_name_attr = "conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "spark"
    hook_name = "mirrorflow mirror job"

    def __init__(self, conn_id: str = DEFAULT_CONN_ID) -> None:
        super().__init__()
        self.conn_id = conn_id
        self.process: subprocess.Popen | None = None
        self.error_line: str | None = None

    def master(self) -> str:
        """The Spark master URL of the connection; ``local[*]`` without ``spark_default``."""
        try:
            connection = self.get_connection(self.conn_id)
        except AirflowNotFoundException:
            if self.conn_id != DEFAULT_CONN_ID:
                raise AirflowException(
                    f"the Spark connection {self.conn_id!r} does not exist"
                ) from None
            self.log.info(
                "no Airflow connection %r: running Spark on %s", self.conn_id, LOCAL_MASTER
            )
            return LOCAL_MASTER
        host = (connection.host or "").strip()
        if not host:
            raise AirflowException(
                f"the Spark connection {self.conn_id!r} has no host: set it to local[*], "
                "spark://HOST, yarn or k8s://…"
            )
        return f"{host}:{connection.port}" if connection.port else host

    def submit(self, command: list[str], cwd: Path, env: Mapping[str, str]) -> int:
        """Run ``command`` until it exits, its output in the task's log; its exit code.

        The job gets a process group of its own, so signals meant for the task never reach it:
        stopping it is the operator's business (through the stop file).
        """
        self.error_line = None
        self.process = subprocess.Popen(
            command,
            cwd=str(cwd),
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
            errors="replace",
        )
        assert self.process.stdout is not None
        for line in self.process.stdout:
            line = line.rstrip()
            if line.startswith(ERROR_LINE):
                self.error_line = line
            self.log.info("%s", line)
        return self.process.wait()
