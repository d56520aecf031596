"""The topology as a drawn graph for the Replication page: clusters as nodes, flows as arrows.

Pure geometry, no Airflow and no files: :func:`layout` places the clusters on an ellipse (two
side by side, three as a triangle, …) and draws each flow as a quadratic curve from its source's
box to its target's, bowed to the flow's left, so the two flows of an active/active pair are two
separate arcs; each arrow carries its flow's state and a label (state, lag). The page's template
(``templates/ui/topology.html.j2``) writes it as inline SVG, served with the page: no script,
no library.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mirrorflow.health.numbers import thousands

WIDTH, NODE_W, NODE_H = 760.0, 132.0, 40.0
BEND = 46.0  # how far an arrow bows from the straight line between its clusters
LABEL_OFFSET = 16.0  # the label's distance from the curve's middle, on the bowed side
GAP = 5.0  # between a box and an arrow's ends


def _ellipse(count: int) -> tuple[list[tuple[float, float]], float]:
    """Centres of ``count`` nodes and the drawing's height."""
    if count == 0:
        return [], 80.0
    if count == 1:
        return [(WIDTH / 2, 60.0)], 120.0
    height = 170.0 if count == 2 else 300.0 + 20.0 * max(0, count - 4)
    ry = (height - NODE_H) / 2 - 38
    points = [
        (math.cos(math.pi + 2 * math.pi * i / count), math.sin(math.pi + 2 * math.pi * i / count))
        for i in range(count)  # the first on the left, then clockwise
    ]
    # stretched across the width: a triangle's right corners go to the right edge
    low, high = min(p[0] for p in points), max(p[0] for p in points)
    margin = NODE_W / 2 + 24
    centres = [
        (
            round(margin + (x - low) / (high - low) * (WIDTH - 2 * margin), 1),
            round(height / 2 + ry * y, 1),
        )
        for x, y in points
    ]
    return centres, height


def _boundary(centre: tuple[float, float], towards: tuple[float, float]) -> tuple[float, float]:
    """Where the line from a box's centre towards a point leaves the box (plus ``GAP``)."""
    dx, dy = towards[0] - centre[0], towards[1] - centre[1]
    if dx == 0 and dy == 0:
        return centre
    half_w, half_h = NODE_W / 2 + GAP, NODE_H / 2 + GAP
    scale = min(half_w / abs(dx) if dx else math.inf, half_h / abs(dy) if dy else math.inf)
    return centre[0] + dx * scale, centre[1] + dy * scale


def lag_label(flow: dict[str, Any]) -> str:
    """A flow's lag in short: ``1,234 rec · 3 s``, or a dash when its job does not run."""
    records, seconds = flow.get("lag_records"), flow.get("lag_seconds")
    if records is None and seconds is None:
        return "—"
    return f"{thousands(records, missing='?')} rec · {thousands(seconds, missing='?')} s"


def layout(clusters: Sequence[str], flows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The graph's nodes (a box per cluster), edges (an arrow per flow between two of them,
    with its SVG path, state, and its label's position and anchor) and size. A flow naming a
    cluster not in ``clusters`` adds that cluster."""
    ends = [c for f in flows for c in (f["source"], f["target"])]
    names = list(dict.fromkeys([*clusters, *ends]))
    centres, height = _ellipse(len(names))
    at = dict(zip(names, centres, strict=True))
    nodes = [
        {"name": n, "x": x, "y": y, "left": x - NODE_W / 2, "top": y - NODE_H / 2}
        for n, (x, y) in at.items()
    ]
    edges = []
    for flow in flows:
        (x1, y1), (x2, y2) = at[flow["source"]], at[flow["target"]]
        length = math.hypot(x2 - x1, y2 - y1) or 1.0
        nx, ny = (y2 - y1) / length, -(x2 - x1) / length  # the flow's left, on screen
        control = ((x1 + x2) / 2 + nx * BEND, (y1 + y2) / 2 + ny * BEND)
        start, end = _boundary((x1, y1), control), _boundary((x2, y2), control)
        mid = (
            0.25 * start[0] + 0.5 * control[0] + 0.25 * end[0],
            0.25 * start[1] + 0.5 * control[1] + 0.25 * end[1],
        )
        edges.append(
            {
                "flow": flow["flow"],
                "source": flow["source"],
                "target": flow["target"],
                "state": flow["state"],
                "lag": lag_label(flow),
                "path": (
                    f"M {start[0]:.1f} {start[1]:.1f} "
                    f"Q {control[0]:.1f} {control[1]:.1f} {end[0]:.1f} {end[1]:.1f}"
                ),
                # the label's first line's baseline; its second line is 14 px below
                "label_x": round(mid[0] + nx * LABEL_OFFSET, 1),
                "label_y": round(mid[1] + ny * LABEL_OFFSET + (10 if ny > 0.3 else -14), 1),
                "anchor": "start" if nx > 0.3 else ("end" if nx < -0.3 else "middle"),
            }
        )
    return {
        "width": WIDTH,
        "height": height,
        "node_w": NODE_W,
        "node_h": NODE_H,
        "nodes": nodes,
        "edges": edges,
    }
