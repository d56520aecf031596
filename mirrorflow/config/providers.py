"""MirrorMaker 2 config providers: ``${provider:[path:]key}`` references to secrets kept elsewhere.

Configured like MM2 (``config.providers = file,env`` plus
``config.providers.file.class = org.apache.kafka.common.config.provider.FileConfigProvider`` and
``config.providers.<name>.param.<p>``) and resolved like Kafka's ``ConfigTransformer``: a
reference whose provider is not configured, or whose key the provider does not have, stays as it
is. The three providers Kafka ships are supported: ``FileConfigProvider`` (a key of a properties
file), ``DirectoryConfigProvider`` (the content of a file in a directory) and
``EnvVarConfigProvider`` (an environment variable), with their ``allowed.paths`` and
``allowlist.pattern`` parameters. References are resolved only when a client configuration is
built, never for printing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mirrorflow.config import properties
from mirrorflow.errors import MirrorflowError
from mirrorflow.mm2 import configdefs

# ConfigTransformer.DEFAULT_PATTERN: ${provider:key} or ${provider:path:key}
REFERENCE = re.compile(r"\$\{([^}]*?):(?:([^}]*?):)?([^}]*?)\}")
_PACKAGE = "org.apache.kafka.common.config.provider."
FILE = _PACKAGE + "FileConfigProvider"
DIRECTORY = _PACKAGE + "DirectoryConfigProvider"
ENV = _PACKAGE + "EnvVarConfigProvider"


@dataclass(frozen=True)
class Provider:
    """One configured provider: its name, Java class and ``param.*`` settings."""

    name: str
    class_name: str
    params: Mapping[str, str]

    def get(self, path: str, key: str) -> str | None:
        """The value for ``key`` (under ``path``), or None if the provider has none."""
        reader = _READERS.get(self.class_name)
        if reader is None:
            raise MirrorflowError(
                f"config provider {self.name!r} is the Java class {self.class_name}, which "
                "mirrorflow cannot run",
                f"use one of Kafka's providers ({FILE}, {DIRECTORY}, {ENV}) or put the value "
                "in the flow file",
            )
        return reader(self, path, key)

    def _check_allowed(self, path: str) -> Path:
        resolved = Path(path).resolve()
        allowed = configdefs.parse_list(self.params.get("allowed.paths", ""))
        if allowed and not any(resolved.is_relative_to(Path(a).resolve()) for a in allowed):
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


class Providers:
    """The providers a flow file configures, and resolution of references through them."""

    def __init__(self, settings: Mapping[str, str]) -> None:
        """``settings``: the top-level keys (``config.providers`` and its sub-keys)."""
        self.by_name: dict[str, Provider] = {}
        for name in configdefs.parse_list(settings.get("config.providers", "")):
            prefix = f"config.providers.{name}."
            params = {
                k[len(prefix + "param.") :]: v
                for k, v in settings.items()
                if k.startswith(prefix + "param.")
            }
            class_name = configdefs.java_trim(settings.get(prefix + "class", ""))
            self.by_name[name] = Provider(name, class_name, params)

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
