"""JVM artifacts: the Kafka broker, Spark's Kafka connector, MirrorMaker 2, and mirrorflow's own
copier.

Each Maven set is declared by a pom under ``jvm/`` and copied by Maven into a cache directory
keyed by the hash of those poms, so a changed pom resolves again and an unchanged one never does.
The copier (``jvm/mirror-copier``, a few Java files) is compiled against Spark's jars and the
connector's into a cache directory keyed by its sources and those jars.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from mirrorflow.errors import MirrorflowError
from mirrorflow.paths import cache_dir, content_hash, resource

JVM_DIR = resource("jvm")
COPIER_SOURCES = JVM_DIR / "mirror-copier" / "src"
COPIER_CLASS = "org.mirrorflow.kafka.MirrorCopier"
TRANSFORM_CLASS = "org.mirrorflow.kafka.RecordTransform"
ARTIFACT_SETS = ("kafka", "spark-kafka", "mirrormaker")
_VERSIONED_JAR = re.compile(r"^(?P<name>.+?)-\d[\w.\-]*\.jar$")


def require_tool(name: str, why: str) -> str:
    """The path of an executable on PATH, or one clear error saying what needs it."""
    path = shutil.which(name)
    if path is None:
        raise MirrorflowError(
            f"{name} was not found on PATH; it is needed {why}",
            "install it (Debian: apt-get install openjdk-17-jdk-headless maven) and retry",
        )
    return path


def jars_dir() -> Path:
    """The cache directory for the current poms (it may not be resolved yet)."""
    poms = [JVM_DIR / "settings.xml", *(JVM_DIR / s / "pom.xml" for s in ARTIFACT_SETS)]
    return cache_dir() / f"jars-{content_hash(poms)}"


def resolve(quiet: bool = True) -> Path:
    """Copy every artifact set with its runtime dependencies into the cache; return its dir."""
    target = jars_dir()
    if (target / ".complete").exists():
        return target
    mvn = require_tool("mvn", "to fetch Kafka, Spark's Kafka connector and MirrorMaker 2")
    require_tool("java", "to run Kafka brokers and Spark")
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    for artifact_set in ARTIFACT_SETS:
        cmd = [
            mvn,
            "-B",
            *(["-q"] if quiet else []),
            "-s",
            str(JVM_DIR / "settings.xml"),
            "-f",
            str(JVM_DIR / artifact_set / "pom.xml"),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging / artifact_set}",
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            errors = [ln for ln in result.stdout.splitlines() if "[ERROR]" in ln][:3]
            raise MirrorflowError(
                f"Maven could not resolve jvm/{artifact_set}/pom.xml: "
                + (" ".join(errors) or result.stderr.strip()[-500:]),
                "check that Maven Central is reachable, then run the command again",
            )
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    (target / ".complete").touch()
    return target


def _resolved(artifact_set: str) -> Path:
    directory = resolve() / artifact_set
    if not directory.is_dir():
        raise MirrorflowError(f"no jars for {artifact_set} in {directory.parent}")
    return directory


def classpath(artifact_set: str) -> str:
    """A Java classpath (``dir/*``) for one artifact set: ``kafka`` or ``mirrormaker``."""
    return str(_resolved(artifact_set) / "*")


def spark_home() -> Path:
    """The Spark distribution: ``$SPARK_HOME`` (set by spark-submit), else the installed
    (full) pyspark package."""
    if env := os.environ.get("SPARK_HOME"):
        home = Path(env)
    else:
        import pyspark

        home = Path(pyspark.__file__).parent
    if not (home / "jars").is_dir() or not (home / "bin" / "spark-submit").exists():
        raise MirrorflowError(
            f"the pyspark package at {home} has no jars/ or bin/spark-submit: the thin "
            "pyspark-client was installed over the full pyspark",
            "reinstall with scripts/bootstrap.sh, which keeps only the full pyspark",
        )
    return home


def spark_kafka_jars() -> list[Path]:
    """The connector jars Spark needs for Kafka, minus libraries Spark itself already ships."""
    shipped = {_jar_name(p.name) for p in (spark_home() / "jars").glob("*.jar")}
    return sorted(
        p for p in _resolved("spark-kafka").glob("*.jar") if _jar_name(p.name) not in shipped
    )


def _jar_name(filename: str) -> str:
    match = _VERSIONED_JAR.match(filename)
    return match.group("name") if match else filename


def copier_jar() -> Path:
    """The jar of mirrorflow's copier (:data:`COPIER_CLASS`), compiled on first use against
    Spark's jars and its Kafka connector's."""
    sources = sorted(COPIER_SOURCES.rglob("*.java"))
    spark_jars = spark_home() / "jars"
    # The jars directory's name hashes the poms that chose the connector's versions; the
    # pyspark version stands for Spark's own jars.
    spark_version = sorted(p.name for p in spark_jars.glob("spark-core_*.jar"))
    target = cache_dir() / (
        f"copier-{content_hash(sources)}-{jars_dir().name}-"
        f"{'-'.join(spark_version).removesuffix('.jar')}"
    )
    jar = target / "mirrorflow-copier.jar"
    if jar.exists():
        return jar
    javac = require_tool("javac", "to compile mirrorflow's copier")
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target) as tmp:
        classes = Path(tmp) / "classes"
        classpath = [str(spark_jars / "*"), *map(str, spark_kafka_jars())]
        cmd = [javac, "--release", "17", "-nowarn", "-d", str(classes)]
        cmd += ["-cp", os.pathsep.join(classpath), *map(str, sources)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise MirrorflowError(
                f"compiling {COPIER_SOURCES} failed: {result.stderr.strip()[-800:]}",
                f"check the Java 17 JDK (javac) and the jars in {spark_jars} and {jars_dir()}",
            )
        partial = Path(tmp) / jar.name
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(classes.rglob("*.class")):
                zf.write(path, path.relative_to(classes).as_posix())
        partial.replace(jar)
    return jar


MIRRORMAKER_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
"""


def mirrormaker_command(
    config: Path,
    clusters: str,
    workdir: Path,
    log_level: str = "WARN",
    jvm_options: tuple[str, ...] = ("-Xmx512M",),
) -> list[str]:
    """The command that runs MirrorMaker 2 (dedicated mode, ``connect-mirror`` from Maven
    Central) on ``config`` for the target ``clusters``; its log4j2 file goes to ``workdir``."""
    log4j = workdir / "mm2-log4j2.properties"
    log4j.write_text(MIRRORMAKER_LOG4J2.format(level=log_level))
    return [
        require_tool("java", "to run MirrorMaker 2"),
        *jvm_options,
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        classpath("mirrormaker"),
        "org.apache.kafka.connect.mirror.MirrorMaker",
        str(config),
        "--clusters",
        clusters,
    ]
