"""Every third-party module mirrorflow's code imports is a dependency pyproject.toml declares,
not one that happens to come with Airflow or PySpark (which may drop it in any release)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("mirrorflow", "dags", "plugins", "spark_jobs")
"""The folders whose code runs in a deployment (the package and what travels with it)."""


def normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    """The distributions [project] dependencies names (without versions, markers, extras)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {normalized(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in project["dependencies"]}


def imports(path: Path) -> Iterator[tuple[str, int]]:
    """The top-level module of each absolute import in ``path`` (in functions too), with its
    line."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name.partition(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.partition(".")[0], node.lineno


def third_party_imports() -> dict[str, list[str]]:
    """Module -> where it is imported, for every module neither the standard library's nor
    mirrorflow's own."""
    own = {"mirrorflow", "__future__", *SHIPPED}
    own |= {p.stem for folder in SHIPPED[1:] for p in (ROOT / folder).glob("*.py")}
    found: dict[str, list[str]] = {}
    for folder in SHIPPED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for module, line in imports(path):
                if module not in sys.stdlib_module_names and module not in own:
                    found.setdefault(module, []).append(f"{path.relative_to(ROOT)}:{line}")
    return found


def covering(names: set[str]) -> set[str]:
    """``names`` and, for each that ships no module of its own (a meta-package such as
    apache-airflow, whose ``airflow`` comes from apache-airflow-core and -task-sdk), the
    distributions it requires unconditionally."""
    shipping = {
        normalized(d) for ds in importlib.metadata.packages_distributions().values() for d in ds
    }
    covered = set(names)
    for name in names - shipping:
        for requirement in importlib.metadata.requires(name) or []:
            if "extra ==" not in requirement:
                covered.add(normalized(re.match(r"[A-Za-z0-9._-]+", requirement).group(0)))
    return covered


def test_every_module_the_shipped_code_imports_is_a_declared_dependency():
    providers = importlib.metadata.packages_distributions()
    covered = covering(declared())
    undeclared = []
    for module, places in sorted(third_party_imports().items()):
        distributions = {normalized(d) for d in providers.get(module, [])}
        if not distributions & covered:
            by = ", ".join(sorted(distributions)) or "no installed distribution"
            undeclared.append(f"{module} ({by}), imported at {', '.join(places[:3])}")
    assert not undeclared, "declare in pyproject.toml [project] dependencies: " + "; ".join(
        undeclared
    )


def test_the_check_sees_imports_in_functions_and_leaves_out_the_standard_library(tmp_path):
    source = tmp_path / "module.py"
    source.write_text(
        "import os.path\nfrom json import dumps\nfrom . import sibling\n"
        "def f():\n    from croniter import croniter\n    import yaml as y\n"
    )
    assert list(imports(source)) == [("os", 1), ("json", 2), ("croniter", 5), ("yaml", 6)]
    found = third_party_imports()
    assert {"croniter", "fastapi", "sqlalchemy", "airflow", "pyspark"} <= set(found)
    assert not {"os", "json", "mirrorflow"} & set(found)
