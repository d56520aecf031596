"""What a mirror job's Spark exposes on the network, and the settings that lock it down.

* **Local mode** (``local``, ``local[N]``, ``local[*]``): the driver's RPC endpoint and its block
  manager bind to 127.0.0.1 (``spark.driver.bindAddress``, ``spark.driver.host``), and Spark's
  RPC authenticates with a secret Spark generates for the application (``spark.authenticate``;
  nothing to configure, nothing written anywhere).
* **A cluster** (``spark://``, ``yarn``, ``k8s://``): ``spark.authenticate`` and AES network
  encryption (``spark.network.crypto.enabled``) are on. YARN and Kubernetes make the shared
  secret themselves; a standalone master (``spark://``) needs the cluster's: it is read from the
  Spark properties file named by ``$MIRRORFLOW_SPARK_PROPERTIES`` (``spark.authenticate.secret``,
  the file mode 0600), which spark-submit gets as ``--properties-file``: the secret is never on
  a command line, and Spark passes it to executors in their environment, not their command line.
  The same file, given to the master and workers as ``--properties-file``, configures them.
* **The Spark UI** is off (``spark.ui.enabled=false``) unless ``$MIRRORFLOW_SPARK_UI`` names an
  address, ``HOST:PORT``: then it listens there (Spark binds its UI where ``SPARK_LOCAL_IP``
  says, so that is set to HOST; on a cluster that is also the driver's address), its kill links
  are off (``spark.ui.killEnabled=false``) and ACLs on (``spark.acls.enable``). A HOST other than
  loopback is refused unless the properties file puts an authentication filter in front of the
  UI (``spark.ui.filters``, e.g. Spark's ``org.apache.spark.ui.JWSFilter`` with its
  ``spark.org.apache.spark.ui.JWSFilter.param.secretKey``).

Settings given explicitly (an operator's ``conf``) still override these, but a secret is never
accepted there: it would be on the command line.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mirrorflow.errors import MirrorflowError

UI_SWITCH = "MIRRORFLOW_SPARK_UI"
PROPERTIES_SWITCH = "MIRRORFLOW_SPARK_PROPERTIES"
LOOPBACK = "127.0.0.1"
AUTH_SECRET = "spark.authenticate.secret"
UI_FILTERS = "spark.ui.filters"
AUTH_FILTERS_SWITCH = "MIRRORFLOW_SPARK_UI_AUTH_FILTERS"
AUTHENTICATING_FILTERS = {
    # filter class -> the property without which it does not authenticate
    "org.apache.spark.ui.JWSFilter": "spark.org.apache.spark.ui.JWSFilter.param.secretKey",
    "org.apache.hadoop.security.authentication.server.AuthenticationFilter": (
        "spark.org.apache.hadoop.security.authentication.server.AuthenticationFilter.param.type"
    ),
}
"""Servlet filters known to authenticate every request to the Spark UI."""
SECRET_KEY = re.compile(r"(?i)secret|password|token|access[.]?key")
"""Keys whose values are secrets (Spark's own ``spark.redaction.regex``)."""


def is_local(master: str) -> bool:
    """Whether ``master`` runs the whole application in the driver's JVM."""
    return master == "local" or master.startswith("local[")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class UiAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def ui_address(environ: Mapping[str, str] | None = None) -> UiAddress | None:
    """Where ``$MIRRORFLOW_SPARK_UI`` opens the Spark UI (``HOST:PORT``); ``None``: it is off."""
    value = (os.environ if environ is None else environ).get(UI_SWITCH, "").strip()
    if value.lower() in ("", "off", "false", "0", "no"):
        return None
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise MirrorflowError(
            f"{UI_SWITCH}={value!r} is not an address",
            f"set it to HOST:PORT, e.g. {LOOPBACK}:4040, or unset it (the UI stays off)",
        )
    return UiAddress(host.strip("[]"), int(port))


def properties_file(environ: Mapping[str, str] | None = None) -> Path | None:
    """The Spark properties file of ``$MIRRORFLOW_SPARK_PROPERTIES``, checked: it exists and
    only its owner can read it."""
    value = (os.environ if environ is None else environ).get(PROPERTIES_SWITCH, "").strip()
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise MirrorflowError(f"{PROPERTIES_SWITCH}: {path} is not a file")
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise MirrorflowError(
            f"{PROPERTIES_SWITCH}: {path} can be read by other users (it holds secrets)",
            f"chmod 600 {path}",
        )
    return path


def _properties(path: Path) -> dict[str, str]:
    """A Spark properties file's settings (kept in memory only: some are secrets)."""
    import javaproperties

    with open(path, encoding="utf-8") as handle:
        return javaproperties.load(handle)


def ui_authentication(
    properties: Mapping[str, str], path: Path | None, environ: Mapping[str, str]
) -> str | None:
    """The filters of the properties file that authenticate the Spark UI (``spark.ui.filters``),
    as a phrase for ``explain``; None if it sets none. An empty list, or a filter not known to
    authenticate (Spark's ``JWSFilter`` with its ``secretKey``, Hadoop's
    ``AuthenticationFilter`` with its ``type``, or a class ``$MIRRORFLOW_SPARK_UI_AUTH_FILTERS``
    vouches for), is refused in one line: the UI would be open to anyone who reaches it."""
    if UI_FILTERS not in properties:
        return None
    filters = [f.strip() for f in properties[UI_FILTERS].split(",") if f.strip()]
    vouched = {f.strip() for f in environ.get(AUTH_FILTERS_SWITCH, "").split(",") if f.strip()}
    if not filters:
        raise MirrorflowError(
            f"{UI_FILTERS} in {path} is empty: it puts no authentication in front of the Spark UI",
            f"set it to org.apache.spark.ui.JWSFilter (with "
            f"{AUTHENTICATING_FILTERS['org.apache.spark.ui.JWSFilter']}) or remove it",
        )
    known = []
    for name in filters:
        needed = AUTHENTICATING_FILTERS.get(name)
        if name in vouched:
            known.append(name)
        elif needed is None:
            raise MirrorflowError(
                f"{UI_FILTERS} in {path} names {name}, which mirrorflow does not know to "
                "authenticate the Spark UI's requests",
                f"use org.apache.spark.ui.JWSFilter, or, if {name} authenticates every "
                f"request, list it in {AUTH_FILTERS_SWITCH}",
            )
        elif needed not in properties:
            raise MirrorflowError(
                f"{UI_FILTERS} in {path} names {name} without {needed}: it would not authenticate",
                f"set {needed} in {path}",
            )
        else:
            known.append(name)
    return "authentication filter " + ", ".join(known)


@dataclass(frozen=True)
class SparkSecurity:
    """The security settings of a mirror job on ``master``."""

    master: str
    conf: dict[str, str]
    properties_file: Path | None = None
    ui: UiAddress | None = None
    exposes: list[str] = field(default_factory=list)
    """What listens where, one line each, for ``mirrorflow explain`` and docs/security.md."""


def for_master(master: str, environ: Mapping[str, str] | None = None) -> SparkSecurity:
    """The settings a mirror job on ``master`` runs with; a setting that would expose the job
    without authentication ends here in one clear error."""
    environ = os.environ if environ is None else environ
    ui = ui_address(environ)
    props = properties_file(environ)
    properties = _properties(props) if props else {}  # read once; values stay here
    keys = set(properties)
    conf = {
        "spark.authenticate": "true",
        "spark.ui.enabled": "true" if ui else "false",
        "spark.ui.killEnabled": "false",
    }
    exposes: list[str] = []
    local = is_local(master)
    if local:
        conf["spark.driver.bindAddress"] = LOOPBACK
        conf["spark.driver.host"] = LOOPBACK
        exposes.append(
            f"driver RPC and block manager: {LOOPBACK}, authenticated (spark.authenticate, "
            "a secret Spark generates for the application)"
        )
    else:
        conf["spark.network.crypto.enabled"] = "true"
        if master.startswith("spark://") and AUTH_SECRET not in keys:
            raise MirrorflowError(
                f"the Spark master {master} needs the cluster's shared secret: mirrorflow runs "
                "Spark with spark.authenticate",
                f"put {AUTH_SECRET} in a Spark properties file of mode 0600 (the master's and "
                f"workers' --properties-file) and set {PROPERTIES_SWITCH} to its path",
            )
        source = (
            f"{AUTH_SECRET} from {props}"
            if AUTH_SECRET in keys
            else "the secret the cluster manager makes for the application"
        )
        exposes.append(
            "driver RPC and block manager: the driver's address (SPARK_LOCAL_IP, else the "
            f"host's), authenticated and encrypted (spark.authenticate with {source}; "
            "spark.network.crypto.enabled)"
        )
    if ui:
        conf["spark.ui.port"] = str(ui.port)
        conf["spark.acls.enable"] = "true"
        authentication = ui_authentication(properties, props, environ)
        if not is_loopback(ui.host) and authentication is None:
            raise MirrorflowError(
                f"{UI_SWITCH}={ui} would open the Spark UI beyond loopback without authentication",
                f"use {LOOPBACK}:{ui.port}, or put {UI_FILTERS} (e.g. "
                "org.apache.spark.ui.JWSFilter with its secretKey) in the Spark properties file "
                f"of {PROPERTIES_SWITCH}",
            )
        guard = authentication or "no login"
        exposes.append(f"Spark UI: {ui} ({guard}; kill links off; spark.acls.enable)")
    else:
        exposes.append(f"Spark UI: off (set {UI_SWITCH}=HOST:PORT to open it)")
    return SparkSecurity(master, conf, props, ui, exposes)


def environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment a job needs for these settings: ``SPARK_LOCAL_IP``, the UI's address (Spark
    binds its UI nowhere else), when the UI is open."""
    ui = ui_address(environ)
    return {"SPARK_LOCAL_IP": ui.host} if ui else {}


def check_no_secret(conf: Mapping[str, str]) -> None:
    """Refuse Spark settings that would put a secret on the command line."""
    secret = sorted(k for k in conf if SECRET_KEY.search(k))
    if secret:
        raise MirrorflowError(
            f"Spark setting(s) {', '.join(secret)} would put a secret on spark-submit's "
            "command line",
            f"put them in a Spark properties file of mode 0600 and set {PROPERTIES_SWITCH}",
        )
