"""What the Replication page lists: the mirror DAGs `mirrorflow render` wrote (read as text,
never imported), their flow files and flows, each flow with its health; the active/active
example shows both of its flows."""

from __future__ import annotations

from pathlib import Path

from mirrorflow.airflow import rendering
from mirrorflow.airflow.ui.sites import read_site_dag, site_dags
from mirrorflow.health.status import topology_health

ROOT = Path(__file__).resolve().parent.parent


def test_the_rendered_mirror_dags_name_the_sites_flows_and_flow_files(tmp_path: Path):
    example = ROOT / "examples" / "active-active.properties"
    rendering.write(rendering.render([example]), tmp_path)
    (tmp_path / "mirror__mine.py").write_text("FLOW_FILES = ['/etc/passwd']\n")  # hand-written
    sites = site_dags(tmp_path)
    assert [s.dag_id for s in sites] == ["mirror__primary", "mirror__secondary"]
    primary, secondary = sites
    assert primary.flow_dags == {"secondary->primary": "flow__secondary__primary"}
    assert secondary.flow_dags == {"primary->secondary": "flow__primary__secondary"}
    assert primary.flow_files == (example,)  # relative in the DAG, from the project root
    assert read_site_dag(tmp_path / "mirror__mine.py") is None
    assert read_site_dag(tmp_path / "flow__primary__secondary.py") is None  # not a site

    shown = []
    for site in sites:
        health = topology_health(site.flow_files, tmp_path / "state", only=site.flow_dags)
        assert health.error is None and health.clusters == ["primary", "secondary"]
        shown += [(f["flow"], f["state"]) for f in health.flows]
    assert sorted(shown) == [
        ("primary->secondary", "STOPPED"),
        ("secondary->primary", "STOPPED"),
    ]
