"""The Replication page's drawn topology (pure layout and its SVG, no Airflow running): a box per
cluster, an arrow per flow between its clusters' boxes, each with its flow's state and lag;
the two flows of an active/active pair bow to opposite sides; everything inside the drawing.
The flows' table: a sparkline per flow, numbers with thousands separators, and a STALLED or
FAILED flow's link to its mirror task's log in Airflow's UI."""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ET

from mirrorflow.airflow.ui.app import render_topology
from mirrorflow.airflow.ui.graph import NODE_H, NODE_W, layout
from mirrorflow.health.model import STATES

SVG = "{http://www.w3.org/2000/svg}"


def flow(source: str, target: str, state: str, lag_records=None, lag_seconds=None) -> dict:
    return {
        "flow": f"{source}->{target}",
        "source": source,
        "target": target,
        "state": state,
        "reason": "r",
        "lag_records": lag_records,
        "lag_seconds": lag_seconds,
        "last_heartbeat": None,
        "last_checkpoint": None,
        "last_batch": None,
        "records": None,
        "mirror_dag": f"mirror__{target}",
        "flow_dag": f"flow__{source}__{target}",
    }


def points(path: str) -> list[tuple[float, float]]:
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", path)]
    return list(zip(numbers[::2], numbers[1::2], strict=True))


def inside_box(point, node, slack: float = 8.0) -> bool:
    return (
        abs(point[0] - node["x"]) <= NODE_W / 2 + slack
        and abs(point[1] - node["y"]) <= NODE_H / 2 + slack
    )


def test_an_active_active_pair_is_two_arrows_bowed_apart():
    graph = layout(
        ["primary", "secondary"],
        [flow("primary", "secondary", "RUNNING", 3, 1.4), flow("secondary", "primary", "PAUSED")],
    )
    nodes = {n["name"]: n for n in graph["nodes"]}
    assert list(nodes) == ["primary", "secondary"]
    assert nodes["primary"]["x"] < nodes["secondary"]["x"]  # side by side
    ab, ba = graph["edges"]
    assert (ab["state"], ab["lag"], ba["state"], ba["lag"]) == (
        "RUNNING",
        "3 rec · 1 s",
        "PAUSED",
        "—",
    )
    for edge in (ab, ba):
        start, _control, end = points(edge["path"])
        assert inside_box(start, nodes[edge["source"]]) and inside_box(end, nodes[edge["target"]])
        assert not inside_box(start, nodes[edge["target"]])
    # one above the line between the boxes, one below; their labels too
    assert points(ab["path"])[1][1] < nodes["primary"]["y"] < points(ba["path"])[1][1]
    assert ab["label_y"] < nodes["primary"]["y"] < ba["label_y"]


def test_every_cluster_and_flow_is_drawn_inside_the_picture():
    clusters = ["a", "b", "c", "d", "e"]
    flows = [flow("a", "b", "LAGGING", 900, 400), flow("c", "e", "STALLED", 5, 61)]
    flows.append(flow("d", "f", "FAILED"))  # a cluster only a flow names is drawn too
    graph = layout(clusters, flows)
    assert [n["name"] for n in graph["nodes"]] == [*clusters, "f"]
    assert len({(n["x"], n["y"]) for n in graph["nodes"]}) == 6
    for node in graph["nodes"]:
        assert node["left"] >= 0 and node["left"] + NODE_W <= graph["width"], node
        assert node["top"] >= 0 and node["top"] + NODE_H <= graph["height"], node
    assert [e["flow"] for e in graph["edges"]] == ["a->b", "c->e", "d->f"]
    assert layout([], [])["nodes"] == []


def test_the_page_draws_a_node_per_cluster_and_an_arrow_per_flow_with_its_state():
    flows = [
        flow("primary", "secondary", "RUNNING", 0, 0.0),
        flow("secondary", "primary", "STALLED"),
    ]
    flows[0]["records"] = 1_234_567
    data = {
        "generated_at": time.time(),
        "dags_folder": "/dags",
        "state_dir": "/state",
        "clusters": ["primary", "secondary", "tertiary"],
        "flows": flows,
        "errors": [],
    }
    html = render_topology(data)
    svg = ET.fromstring(html[html.index("<svg") : html.index("</svg>") + 6])
    groups = list(svg.iter(f"{SVG}g"))
    nodes = [g.get("data-cluster") for g in groups if g.get("class") == "node"]
    assert nodes == ["primary", "secondary", "tertiary"]
    edges = {g.get("data-flow"): g for g in groups if "edge" in g.get("class", "").split()}
    assert set(edges) == {"primary->secondary", "secondary->primary"}
    for name, state, lag in (
        ("primary->secondary", "RUNNING", "0 rec · 0 s"),
        ("secondary->primary", "STALLED", "—"),
    ):
        edge = edges[name]
        assert edge.get("data-state") == state and f"s-{state}" in edge.get("class")
        path = next(edge.iter(f"{SVG}path"))
        assert path.get("marker-end") == f"url(#arrow-{state})"
        assert [t.text for t in edge.iter(f"{SVG}tspan")] == [state, lag]
        link = next(edge.iter(f"{SVG}a"))
        assert link.get("href") == "flows/" + name.replace("->", "/")
    markers = {m.get("id") for m in svg.iter(f"{SVG}marker")}
    assert markers == {f"arrow-{s}" for s in STATES}
    assert "<script" not in html  # nothing for a Content-Security-Policy to refuse
    table = html[html.index('<table id="flows"') :]
    assert '<td class="num records">1,234,567</td>' in table
    assert table.count('<svg class="spark"') == 2  # one per flow, with no samples: no line
    # Without a run of its mirror DAG in Airflow, a STALLED flow says it has no log to show.
    assert "no run of mirror__primary in Airflow: no task log to show" in table


def test_a_stalled_or_failed_flow_links_to_its_mirror_tasks_log():
    task = {
        "dag_id": "mirror__secondary",
        "run_id": "scheduled__2026-11-26T15:32:00+00:00",
        "task_id": "mirror",
        "try_number": 3,
        "state": "running",
    }
    flows = []
    for state in ("STALLED", "FAILED", "RUNNING"):
        f = flow("primary", "secondary", state)
        flows.append({**f, "flow": f"{state}", "mirror_task": task})
    data = {
        "generated_at": time.time(),
        "dags_folder": "/dags",
        "state_dir": "/state",
        "clusters": ["primary", "secondary"],
        "flows": flows,
        "errors": [],
    }
    html = render_topology(data)
    href = (
        "../dags/mirror__secondary/runs/scheduled__2026-11-26T15%3A32%3A00%2B00%3A00/tasks/mirror"
        "?try_number=3"
    )
    rows = dict(re.findall(r'<tr data-flow="(\w+)"(.*?)</tr>', html, re.S))
    for state in ("STALLED", "FAILED"):
        assert f'<a class="log" target="_top" href="{href}">' in rows[state], rows[state]
    assert 'class="log"' not in rows["RUNNING"]
