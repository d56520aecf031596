"""The ``airflow`` config provider: ``${airflow:CONN_ID:FIELD}`` reads a field of an Airflow
connection, through Airflow's own lookup.

Configured in a flow file as MirrorMaker 2 configures its providers::

    config.providers = airflow
    config.providers.airflow.class = mirrorflow.airflow.connections.AirflowConnectionConfigProvider
    primary.sasl.jaas.config = org.apache.kafka.common.security.scram.ScramLoginModule required \\
        username="${airflow:kafka_primary:login}" password="${airflow:kafka_primary:password}";

``FIELD`` is one of the connection's fields (``password``, ``login``, ``host``, ``port``,
``schema``, ``conn_type``), ``extra`` (its extra JSON as text) or ``extra.<key>``, one key of
its extra. The Apache Kafka provider's connections (type ``kafka``, whose extra holds librdkafka
settings such as ``bootstrap.servers``, ``sasl.username``, ``sasl.password``) serve as they are:
``${airflow:kafka_default:extra.sasl.password}``.

The lookup is Airflow's: inside a task, the Task SDK's (the API server's secrets backends and
metadata DB, the worker's ``AIRFLOW_CONN_<ID>`` variables and secrets backend); elsewhere (a
``mirrorflow`` command) ``AIRFLOW_CONN_<ID>``, the configured secrets backend, then the metadata
DB of ``AIRFLOW_HOME``. A connection that does not exist, or lacks the field, ends in one line
naming both and what to do. A connection is looked up once per flow definition loaded.

This module is loaded by its dotted name when a flow file's reference needs it
(:mod:`mirrorflow.config.providers`), so the layers below import no Airflow.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Mapping
from typing import Any

from mirrorflow.config.providers import airflow_reference_problem
from mirrorflow.errors import MirrorflowError


class AirflowConnectionConfigProvider:
    """Values of Airflow connections: path = connection id, key = field (see the module)."""

    def __init__(self, name: str, params: Mapping[str, str]) -> None:
        self.name = name
        self.params = dict(params)
        self._connections: dict[str, Any] = {}

    def get(self, path: str, key: str) -> str | None:
        """Field ``key`` of connection ``path``; a :class:`MirrorflowError` if either is missing."""
        wrong = airflow_reference_problem(self.name, path, key)
        if wrong:
            raise MirrorflowError(*wrong)
        connection = self._connection(path)
        if key.startswith("extra."):
            extra = _extra(connection, path)
            name = key[len("extra.") :]
            value = extra.get(name)
            if value is None or value == "":
                keys = ", ".join(sorted(extra)) or "none"
                raise MirrorflowError(
                    f"Airflow connection {path!r} has no {name!r} in its extra (its keys: {keys})",
                    f"add it to the connection's extra JSON, or refer to another field of {path}",
                )
            return _text(value)
        value = getattr(connection, key, None)
        if value is None or value == "":
            raise MirrorflowError(
                f"Airflow connection {path!r} has no {key}",
                f"set the connection's {key} (Admin > Connections, `airflow connections add "
                f"{path} …`, or AIRFLOW_CONN_{path.upper()}), or refer to a field it has",
            )
        return _text(value)

    def _connection(self, conn_id: str) -> Any:
        if conn_id not in self._connections:
            self._connections[conn_id] = lookup(conn_id)
        return self._connections[conn_id]


def lookup(conn_id: str) -> Any:
    """Airflow's connection ``conn_id``, by the lookup Airflow uses where this runs."""
    if in_task():
        return _lookup(conn_id)
    # Outside a task Airflow configures its logging to stdout as it loads: in a command that is
    # the command's output (`plan --json`), so Airflow's log lines go to stderr instead.
    with contextlib.redirect_stdout(sys.stderr):
        return _lookup(conn_id)


def _lookup(conn_id: str) -> Any:
    try:
        from airflow.sdk.exceptions import AirflowNotFoundException
    except ImportError as exc:  # pragma: no cover - Airflow is part of mirrorflow's environment
        raise MirrorflowError(
            f"Airflow connection {conn_id!r} cannot be looked up: Airflow is not installed ({exc})",
            "run mirrorflow in its environment (scripts/bootstrap.sh), which has Airflow",
        ) from None
    try:
        if in_task():
            from airflow.sdk import Connection

            return Connection.get(conn_id)
        from airflow.models.connection import Connection as StoredConnection

        return StoredConnection.get_connection_from_secrets(conn_id)
    except AirflowNotFoundException:
        where = (
            "Airflow's secrets backends and metadata DB"
            if in_task()
            else "AIRFLOW_CONN_*, the secrets backend and the metadata DB of AIRFLOW_HOME"
        )
        raise MirrorflowError(
            f"no Airflow connection {conn_id!r} (looked up in {where})",
            f"create it (`airflow connections add {conn_id} …`, Admin > Connections, or "
            f"AIRFLOW_CONN_{conn_id.upper()} as JSON) or correct the id in "
            f"${{airflow:{conn_id}:…}}",
        ) from None


def in_task() -> bool:
    """Whether this process is an Airflow task's (the Task SDK's supervisor answers lookups)."""
    runner = sys.modules.get("airflow.sdk.execution_time.task_runner")
    return getattr(runner, "SUPERVISOR_COMMS", None) is not None


def _extra(connection: Any, conn_id: str) -> dict[str, Any]:
    raw = connection.extra
    if not raw:
        return {}
    try:
        extra = json.loads(raw) if isinstance(raw, str) else dict(raw)
    except ValueError:
        raise MirrorflowError(
            f"Airflow connection {conn_id!r}'s extra is not JSON",
            "write the connection's extra as a JSON object",
        ) from None
    if not isinstance(extra, dict):
        raise MirrorflowError(
            f"Airflow connection {conn_id!r}'s extra is not a JSON object",
            'write it as {"key": "value", …}',
        )
    return extra


def _text(value: Any) -> str:
    """A field as a setting's text: booleans as Java writes them, structures as JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)
