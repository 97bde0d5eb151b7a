"""Draw one trace's spans as a waterfall: docs/tracing-trace.svg, and the text tree in
docs/tracing.md.

The spans are JSON lines as tests/test_tracing.py writes them (OpenTelemetry's
``span.to_json()`` plus ``scope``, the tracer's name), with CYCLONE_TRACE_SPANS_OUT set:

    CYCLONE_TRACE_SPANS_OUT=/tmp/spans.jsonl PYTHONPATH=$PWD:$PWD/core \\
        .venv/bin/pytest -q tests/test_tracing.py -k client_server_and_worker
    .venv/bin/python -m tests.trace_picture /tmp/spans.jsonl docs/tracing-trace.svg
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from datetime import datetime
from html import escape

#: Who made a span, by its tracer's name: label and bar colour.
SCOPES = {
    "cyclone.server": ("server", "#4c78a8"),
    "cyclone.worker": ("worker", "#59a14f"),
}
CLIENT = ("app", "#e15759")
ROW, LABEL_W, BAR_W, TOP = 26, 430, 560, 40
#: Attributes shown beside a bar, in this order.
SHOWN = ("cyclone.node", "cyclone.attempt", "cyclone.outcome", "cyclone.step_status")


@dataclass
class Span:
    name: str
    span_id: str
    parent_id: str | None
    start: float
    end: float
    scope: str
    status: str
    attributes: dict[str, object]
    children: list[Span] = field(default_factory=list)

    @property
    def who(self) -> tuple[str, str]:
        return SCOPES.get(self.scope, CLIENT)

    def note(self) -> str:
        shown = [
            f"{k.split('.', 1)[1]}={self.attributes[k]}" for k in SHOWN if k in self.attributes
        ]
        if self.status == "ERROR":
            shown.append("status=ERROR")
        return " ".join(shown)


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def read(path: str) -> tuple[list[Span], list[int]]:
    """The spans of ``path`` in tree order (each after its parent, siblings by start)."""
    spans: dict[str, Span] = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            raw = json.loads(line)
            span = Span(
                name=raw["name"],
                span_id=raw["context"]["span_id"],
                parent_id=raw.get("parent_id"),
                start=_time(raw["start_time"]),
                end=_time(raw["end_time"]),
                scope=raw.get("scope", ""),
                status=raw["status"]["status_code"],
                attributes=raw.get("attributes", {}),
            )
            spans[span.span_id] = span
    roots: list[Span] = []
    for span in spans.values():
        parent = spans.get(span.parent_id or "")
        (parent.children if parent is not None else roots).append(span)
    ordered: list[tuple[int, Span]] = []

    def walk(span: Span, depth: int) -> None:
        ordered.append((depth, span))
        for child in sorted(span.children, key=lambda s: (s.start, s.name)):
            walk(child, depth + 1)

    for root in sorted(roots, key=lambda s: s.start):
        walk(root, 0)
    return [s for _, s in ordered], [d for d, _ in ordered]


def text_tree(spans: list[Span], depths: list[int]) -> str:
    """The trace as an indented list: who, span, duration from the trace's start."""
    t0 = min(s.start for s in spans)
    lines = []
    for span, depth in zip(spans, depths, strict=True):
        offset, took = (span.start - t0) * 1000, (span.end - span.start) * 1000
        lines.append(
            f"{'  ' * depth}{span.name:<{46 - 2 * depth}} {span.who[0]:<7}"
            f"+{offset:7.1f} ms {took:7.1f} ms  {span.note()}".rstrip()
        )
    return "\n".join(lines)


def svg(spans: list[Span], depths: list[int]) -> str:
    """A waterfall: one row per span, indented under its parent, its bar on the time
    axis of the whole trace."""
    t0 = min(s.start for s in spans)
    total = max(s.end for s in spans) - t0 or 1.0
    width, height = LABEL_W + BAR_W + 20, TOP + ROW * len(spans) + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="monospace" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="22" font-size="14" font-weight="bold">One run\'s trace: '
        f"{total * 1000:.0f} ms from the client's span to the last step</text>",
    ]
    for i, (span, depth) in enumerate(zip(spans, depths, strict=True)):
        y = TOP + i * ROW
        who, colour = span.who
        x = LABEL_W + (span.start - t0) / total * BAR_W
        w = max((span.end - span.start) / total * BAR_W, 2.0)
        border = ' stroke="#b00" stroke-width="2"' if span.status == "ERROR" else ""
        out += [
            f'<text x="{10 + 14 * depth}" y="{y + 16}">{escape(span.name)}</text>',
            f'<text x="{LABEL_W - 70}" y="{y + 16}" fill="{colour}">{who}</text>',
            f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{ROW - 10}" '
            f'fill="{colour}"{border}/>',
            f'<text x="{LABEL_W + 4}" y="{y + ROW + 2}" font-size="9" fill="#555">'
            f"{escape(span.note())}</text>"
            if span.note()
            else "",
        ]
    legend_y = height - 14
    for j, (who, colour) in enumerate([CLIENT, *SCOPES.values()]):
        out.append(
            f'<rect x="{10 + 110 * j}" y="{legend_y - 10}" width="12" height="12" '
            f'fill="{colour}"/><text x="{26 + 110 * j}" y="{legend_y}">{who}</text>'
        )
    out.append(f'<text x="{360}" y="{legend_y}">red border: status ERROR</text>')
    out.append("</svg>")
    return "\n".join(line for line in out if line) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spans", help="JSON lines of one trace's spans")
    parser.add_argument("svg", help="the SVG to write")
    args = parser.parse_args()
    spans, depths = read(args.spans)
    with open(args.svg, "w", encoding="utf-8") as out:
        out.write(svg(spans, depths))
    print(text_tree(spans, depths))


if __name__ == "__main__":
    main()
