"""MirrorMaker 2 config providers: ``${provider:[path:]key}`` references to secrets kept elsewhere.

Configured like MM2 (``config.providers = file,env`` plus
``config.providers.file.class = org.apache.kafka.common.config.provider.FileConfigProvider`` and
``config.providers.<name>.param.<p>``) and resolved like Kafka's ``ConfigTransformer``: a
reference whose provider is not configured, or whose key the provider does not have, stays as it
is. The three providers Kafka ships are supported: ``FileConfigProvider`` (a key of a properties
file), ``DirectoryConfigProvider`` (the content of a file in a directory) and
``EnvVarConfigProvider`` (an environment variable), with their ``allowed.paths`` and
``allowlist.pattern`` parameters. References are resolved only when a client configuration is
built, never for printing. A relative path (in a reference or in ``allowed.paths``) is read, as
Kafka's providers read it, from the working directory of the process, unless the flow definition
names another base directory (an Airflow task's: the project root, where its mirror job runs);
the process's working directory is never changed for it.

mirrorflow adds providers of its own, Python classes named by their dotted path and imported
only when a reference needs them (so this layer imports no Airflow): :data:`AIRFLOW`,
``${airflow:CONN_ID:FIELD}``, a field of an Airflow connection
(:mod:`mirrorflow.airflow.connections`). Such a provider may need its launcher's context (an
Airflow task's connection lookup), so a mirror job's launcher resolves its references before
the job starts and *hands them over* (:func:`hand_over`): a file of mode 0600 in a private
directory, named in the job's environment by :data:`HANDOFF_ENV`, which the job's driver reads
and deletes at start (:func:`receive_handoff`) and the job's guard removes when the job ends,
however it ends. The values are on no command line and in no environment.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from mirrorflow import paths
from mirrorflow.config import properties
from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2 import configdefs

# ConfigTransformer.DEFAULT_PATTERN: ${provider:key} or ${provider:path:key}
REFERENCE = re.compile(r"\$\{([^}]*?):(?:([^}]*?):)?([^}]*?)\}")
_PACKAGE = "org.apache.kafka.common.config.provider."
FILE = _PACKAGE + "FileConfigProvider"
DIRECTORY = _PACKAGE + "DirectoryConfigProvider"
ENV = _PACKAGE + "EnvVarConfigProvider"
KAFKA_PROVIDERS = (FILE, DIRECTORY, ENV)

AIRFLOW = "mirrorflow.airflow.connections.AirflowConnectionConfigProvider"
"""``${airflow:CONN_ID:FIELD}``: a field of an Airflow connection (password, login, host, port,
schema, conn_type, extra, ``extra.<key>``), through Airflow's own lookup (secrets backends,
``AIRFLOW_CONN_<ID>``, the metadata DB)."""
AIRFLOW_FIELDS = ("password", "login", "host", "port", "schema", "conn_type", "extra")
"""The fields ``${airflow:CONN_ID:FIELD}`` may name, besides ``extra.<key>``."""
PYTHON_PROVIDERS = (AIRFLOW,)
"""mirrorflow's own providers: the class names ``config.providers.<name>.class`` may give."""

HANDOFF_ENV = "MIRRORFLOW_PROVIDED_VALUES"
"""Names the file in which a launcher hands a mirror job the values it resolved (a path only)."""
_HANDOFF_PREFIX = "mirrorflow-provided-"


class ConfigProvider(Protocol):
    """A provider implemented in Python: built with its name and ``param.*`` settings."""

    def __init__(self, name: str, params: Mapping[str, str]) -> None: ...

    def get(self, path: str, key: str) -> str | None:
        """The value for ``key`` under ``path``, None if there is none; a
        :class:`MirrorflowError` naming what to fix if it cannot be read."""
        ...


_handed_over: dict[tuple[str, str, str], str] = {}


@dataclass(frozen=True)
class Provider:
    """One configured provider: its name, Java class and ``param.*`` settings."""

    name: str
    class_name: str
    params: Mapping[str, str]
    base_dir: Path | None = None
    """Where relative paths are read from; None: the process's working directory."""
    # The Python provider, once built: one per flow definition loaded, so a long-lived process
    # (an api-server) that loads the files again also looks the values up again.
    _built: list[ConfigProvider] = field(default_factory=list, compare=False, repr=False)

    def get(self, path: str, key: str) -> str | None:
        """The value for ``key`` (under ``path``), or None if the provider has none."""
        if self.class_name in PYTHON_PROVIDERS:
            handed = _handed_over.get((self.name, path, key))
            return handed if handed is not None else self._python().get(path, key)
        reader = _READERS.get(self.class_name)
        if reader is None:
            raise MirrorflowError(*unknown_class(self.name, self.class_name))
        return reader(self, path, key)

    @property
    def handed_over(self) -> bool:
        """Whether a mirror job's launcher resolves this provider's references for the job."""
        return self.class_name in PYTHON_PROVIDERS

    def _python(self) -> ConfigProvider:
        """The provider's Python class, imported and built once per flow definition loaded."""
        if not self._built:
            module, _, name = self.class_name.rpartition(".")
            try:
                cls = getattr(importlib.import_module(module), name)
            except ImportError as exc:  # e.g. Airflow is not installed where this runs
                raise MirrorflowError(
                    f"config provider {self.name!r} ({self.class_name}) cannot be loaded: {exc}",
                    "install what it needs here (for `airflow`: Apache Airflow, as in "
                    "mirrorflow's environment) or resolve the value another way",
                ) from None
            self._built.append(cls(self.name, dict(self.params)))
        return self._built[0]

    def local(self, path: str) -> Path:
        """``path`` as a file name: a relative one under :attr:`base_dir` when there is one."""
        return (self.base_dir or Path()) / path

    def _check_allowed(self, path: str) -> Path:
        resolved = self.local(path).resolve()
        allowed = configdefs.parse_list(self.params.get("allowed.paths", ""))
        if allowed and not any(resolved.is_relative_to(self.local(a).resolve()) for a in allowed):
            raise MirrorflowError(
                f"config provider {self.name!r} may not read {path}: it is outside "
                f"config.providers.{self.name}.param.allowed.paths",
                "move the file under an allowed path or extend allowed.paths",
            )
        return resolved


def _file(provider: Provider, path: str, key: str) -> str | None:
    if not path:
        return None
    resolved = provider._check_allowed(path)
    try:
        text = resolved.read_text(encoding="utf-8")
    except OSError as exc:
        raise MirrorflowError(
            f"config provider {provider.name!r} cannot read {path}: {exc.strerror}",
            "check the path in the ${...} reference and the file's permissions",
        ) from None
    values = {p.key: p.value for p in properties.parse(text, path)}
    return values.get(key)


def _directory(provider: Provider, path: str, key: str) -> str | None:
    if not path:
        return None
    directory = provider._check_allowed(path)
    entry = directory / key
    if entry.parent != directory or not entry.is_file():  # only files directly inside
        return None
    try:
        return entry.read_text(encoding="utf-8")
    except OSError as exc:
        raise MirrorflowError(
            f"config provider {provider.name!r} cannot read {entry}: {exc.strerror}",
            "check the file's permissions",
        ) from None


def _env(provider: Provider, path: str, key: str) -> str | None:
    if path:
        raise MirrorflowError(
            f"config provider {provider.name!r} reads environment variables and takes no path "
            f"(got {path!r})",
            f"write ${{{provider.name}:VARIABLE}}",
        )
    allowlist = re.compile(provider.params.get("allowlist.pattern", ".*"))
    return os.environ.get(key) if allowlist.fullmatch(key) else None


_READERS: dict[str, Callable[[Provider, str, str], str | None]] = {
    FILE: _file,
    DIRECTORY: _directory,
    ENV: _env,
}


def unknown_class(name: str, class_name: str) -> tuple[str, str]:
    """The problem and fix for a provider class mirrorflow cannot run."""
    return (
        f"config provider {name!r} is the class {class_name}, which mirrorflow cannot run",
        f"use one of Kafka's providers ({', '.join(KAFKA_PROVIDERS)}), mirrorflow's "
        f"{AIRFLOW} (Airflow connections), or put the value in the flow file",
    )


class Providers:
    """The providers a flow file configures, and resolution of references through them."""

    def __init__(self, settings: Mapping[str, str], base_dir: Path | None = None) -> None:
        """``settings``: the top-level keys (``config.providers`` and its sub-keys);
        ``base_dir``: where relative paths are read from (None: the working directory)."""
        self.by_name: dict[str, Provider] = {}
        for name in configdefs.parse_list(settings.get("config.providers", "")):
            prefix = f"config.providers.{name}."
            params = {
                k[len(prefix + "param.") :]: v
                for k, v in settings.items()
                if k.startswith(prefix + "param.")
            }
            class_name = configdefs.java_trim(settings.get(prefix + "class", ""))
            self.by_name[name] = Provider(name, class_name, params, base_dir)

    def unconfigured(self, value: str) -> list[str]:
        """Provider names referenced in ``value`` that ``config.providers`` does not configure."""
        return [m.group(1) for m in REFERENCE.finditer(value) if m.group(1) not in self.by_name]

    def resolve(self, key: str, value: str) -> str:
        """``value`` with every resolvable reference replaced (``key`` is only for errors)."""

        def replace(match: re.Match[str]) -> str:
            provider = self.by_name.get(match.group(1))
            if provider is None:
                return match.group(0)
            try:
                found = provider.get(match.group(2) or "", match.group(3))
            except MirrorflowError as exc:
                raise MirrorflowError(f"{key}: {exc.message}", exc.hint) from None
            return match.group(0) if found is None else found

        return REFERENCE.sub(replace, value)

    def references(self, value: str) -> list[tuple[str, str, str]]:
        """The ``(provider, path, key)`` references in ``value`` to configured providers."""
        return [
            (m.group(1), m.group(2) or "", m.group(3))
            for m in REFERENCE.finditer(value)
            if m.group(1) in self.by_name
        ]

    def resolve_handed_over(self, values: Iterable[str]) -> dict[tuple[str, str, str], str]:
        """Every reference in ``values`` to a provider a launcher resolves for its job, resolved
        (a reference the provider has no value for is left out, and stays as it is)."""
        found: dict[tuple[str, str, str], str] = {}
        for value in values:
            for name, path, key in self.references(value):
                provider = self.by_name[name]
                if provider.handed_over and (name, path, key) not in found:
                    resolved = provider.get(path, key)
                    if resolved is not None:
                        found[(name, path, key)] = resolved
        return found


def hand_over(values: Mapping[tuple[str, str, str], str]) -> dict[str, str]:
    """Write resolved references for a job to start: a file of mode 0600 in a new private
    directory; the environment variable naming it (empty when there is nothing to hand over).
    The job's driver deletes it when it has read it (:func:`receive_handoff`); whoever starts
    the job removes it with :func:`discard_handoff` when the job has ended."""
    if not values:
        return {}
    directory = Path(tempfile.mkdtemp(prefix=_HANDOFF_PREFIX))  # mode 0700
    entries = [[*reference, value] for reference, value in values.items()]
    path = paths.write_private(directory / "values.json", json.dumps(entries))
    return {HANDOFF_ENV: str(path)}


def receive_handoff(environ: MutableMapping[str, str] | None = None) -> int:
    """In a mirror job's driver: read (then delete) the values its launcher handed over, so
    that references to those providers resolve to them; how many there were."""
    environ = os.environ if environ is None else environ
    named = environ.pop(HANDOFF_ENV, None)
    if not named:
        return 0
    path = Path(named)
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MirrorflowError(
            f"the values the job's launcher resolved from its config providers cannot be read "
            f"from {path}: {getattr(exc, 'strerror', None) or exc}",
            "start the job again (with `mirrorflow mirror` or its DAG); "
            f"{HANDOFF_ENV} must name the file its launcher wrote",
        ) from None
    finally:
        discard_handoff({HANDOFF_ENV: named})
    for name, ref_path, key, value in entries:
        _handed_over[(name, ref_path, key)] = value
    return len(entries)


def discard_handoff(environ: Mapping[str, str]) -> None:
    """Remove the handed-over values ``environ`` names, if they are still there."""
    named = environ.get(HANDOFF_ENV)
    if not named:
        return
    directory = Path(named).parent
    if directory.name.startswith(_HANDOFF_PREFIX):
        shutil.rmtree(directory, ignore_errors=True)


def reference_problem(provider: Provider, path: str, key: str) -> tuple[str, str] | None:
    """What is wrong with a reference ``${name:path:key}`` to ``provider``, found offline
    (problem, fix), or None."""
    if provider.class_name == AIRFLOW:
        return airflow_reference_problem(provider.name, path, key)
    return None


def airflow_reference_problem(name: str, path: str, key: str) -> tuple[str, str] | None:
    """What is wrong with ``${name:path:key}`` as a reference to an Airflow connection."""
    if not path:
        return (
            f"${{{name}:{key}}} names no Airflow connection",
            f"write ${{{name}:CONN_ID:FIELD}}, e.g. ${{{name}:kafka_default:password}}",
        )
    if key not in AIRFLOW_FIELDS and not key.startswith("extra."):
        return (
            f"${{{name}:{path}:{key}}}: {key!r} is not a field of an Airflow connection",
            f"use one of {', '.join(AIRFLOW_FIELDS)} or extra.<key>",
        )
    return None
