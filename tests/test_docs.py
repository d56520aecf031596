"""The docs build: README.md, docs/*.md and benchmarks/README.md, built by Sphinx with MyST as
``conf.py`` says, with every warning an error: a link to a page, a heading or a file that does
not exist fails the suite (docs/development.md, *Docs*). No service, no network: the build is
given a proxy that refuses every connection, so a theme or extension that fetched anything
would fail it too."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OFFLINE = {
    key: "http://127.0.0.1:9"  # the discard port: nothing listens there
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")
}


def build(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """``sphinx-build -b html -W --keep-going`` of ``source`` into ``out``."""
    environment = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
    return subprocess.run(
        [
            *(sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q"),
            *("-d", str(out / "doctrees"), str(source), str(out / "html")),
        ],
        capture_output=True,
        text=True,
        cwd=source,
        env={**environment, **OFFLINE},
        timeout=300,
    )


def test_the_docs_build_without_a_warning(tmp_path: Path) -> None:
    result = build(ROOT, tmp_path)
    assert result.returncode == 0, result.stderr[-6000:] + result.stdout[-2000:]
    assert "WARNING" not in result.stderr, result.stderr[-6000:]
    html = tmp_path / "html"
    pages = ["README", "benchmarks/README"] + [f"docs/{p.stem}" for p in ROOT.glob("docs/*.md")]
    for page in pages:
        assert (html / f"{page}.html").is_file(), page


def test_a_link_to_a_missing_page_heading_or_file_fails_the_build(tmp_path: Path) -> None:
    """The same configuration on a copy with three broken links: each is named, the build fails."""
    source = tmp_path / "src"
    (source / "docs").mkdir(parents=True)
    (source / "benchmarks").mkdir()
    shutil.copy(ROOT / "conf.py", source / "conf.py")
    (source / "docs" / "index.md").write_text(
        "# Index\n\n```{toctree}\n/README\n/benchmarks/README\n```\n"
    )
    (source / "benchmarks" / "README.md").write_text("# Benchmarks\n\n## Results\n")
    (source / "README.md").write_text(
        "# Front\n\n## Next\n\n"
        "- [a heading that is there](benchmarks/README.md#results)\n"
        "- [a page that is not](docs/nowhere.md)\n"
        "- [a heading that is not](benchmarks/README.md#no-such-heading)\n"
        "- [a file that is not](docker-compose.yml)\n"
    )
    result = build(source, tmp_path / "out")
    assert result.returncode != 0, result.stderr
    for culprit in ("nowhere.md", "no-such-heading", "docker-compose.yml"):
        assert culprit in result.stderr, (culprit, result.stderr)
    assert "#results" not in result.stderr and "'results'" not in result.stderr, result.stderr
