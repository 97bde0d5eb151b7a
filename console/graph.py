"""A run's DAG as a picture: node boxes and edge paths laid out by grandalf's Sugiyama
(layered) layout, drawn as SVG by the run template. The layout is computed here, on the
console's side, so the picture needs no script in the browser and every label passes
through the template's escaping.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from grandalf.graphs import Edge, Graph, Vertex
from grandalf.layouts import SugiyamaLayout
from grandalf.routing import route_with_lines

from pyclient.models import Run, Step

NODE_W = 168
NODE_H = 44
MARGIN = 16
GAP = 40  # between the pictures of unconnected parts of the DAG
#: Larger DAGs are listed, not drawn: the layout takes about 0.3 s at 150 nodes, and
#: grows faster than the node count.
MAX_DRAWN = 150
#: Pictures kept: a run's DAG never changes, only its statuses (drawn by the template).
CACHED = 256


@dataclass(frozen=True, slots=True)
class Box:
    node: str
    x: float  # top-left corner
    y: float


@dataclass(frozen=True, slots=True)
class Path:
    source: str
    target: str
    points: tuple[tuple[float, float], ...]

    @property
    def d(self) -> str:
        head, *rest = self.points
        return f"M{head[0]:.1f},{head[1]:.1f}" + "".join(f" L{x:.1f},{y:.1f}" for x, y in rest)


@dataclass(frozen=True, slots=True)
class Picture:
    width: float
    height: float
    boxes: tuple[Box, ...]
    paths: tuple[Path, ...]


class _VertexView:
    w = NODE_W
    h = NODE_H
    xy: tuple[float, float] = (0.0, 0.0)


class _EdgeView:
    points: list[tuple[float, float]] | None = None

    def setpath(self, points: list[tuple[float, float]]) -> None:
        self.points = points


_pictures: OrderedDict[str, Picture | None] = OrderedDict()


async def picture_of(run: Run) -> Picture | None:
    """The run's picture, laid out once per run (in a thread: it takes a while)."""
    if run.run_id in _pictures:
        _pictures.move_to_end(run.run_id)
        return _pictures[run.run_id]
    drawn = await asyncio.to_thread(layout, run.steps)
    _pictures[run.run_id] = drawn
    while len(_pictures) > CACHED:
        _pictures.popitem(last=False)
    return drawn


def layout(steps: Sequence[Step]) -> Picture | None:
    """The picture of these steps and their dependencies; None when too many to draw."""
    if not steps or len(steps) > MAX_DRAWN:
        return None
    vertices = {s.node: Vertex(s.node) for s in steps}
    for v in vertices.values():
        v.view = _VertexView()
    edges = []
    for s in steps:
        for up in s.depends_on:
            if up in vertices:
                e = Edge(vertices[up], vertices[s.node])
                e.view = _EdgeView()
                edges.append(e)
    graph = Graph(list(vertices.values()), edges)
    boxes: list[Box] = []
    paths: list[Path] = []
    left, height = float(MARGIN), 0.0
    # Each connected part is laid out alone, then placed to the right of the previous one.
    for part in graph.C:
        sug = SugiyamaLayout(part)
        sug.xspace, sug.yspace = 24, 48
        sug.route_edge = route_with_lines
        sug.init_all()
        sug.draw()
        xs = [v.view.xy[0] for v in part.sV]
        ys = [v.view.xy[1] for v in part.sV]
        dx = left - min(xs) + NODE_W / 2
        dy = MARGIN - min(ys) + NODE_H / 2
        for v in part.sV:
            x, y = v.view.xy
            boxes.append(Box(v.data, x + dx - NODE_W / 2, y + dy - NODE_H / 2))
        for e in part.sE:
            pts = e.view.points or [e.v[0].view.xy, e.v[1].view.xy]
            paths.append(Path(e.v[0].data, e.v[1].data, tuple((x + dx, y + dy) for x, y in pts)))
        left += max(xs) - min(xs) + NODE_W + GAP
        height = max(height, max(ys) - min(ys) + NODE_H + 2 * MARGIN)
    width = left - GAP + MARGIN
    return Picture(width, height, tuple(boxes), tuple(paths))
