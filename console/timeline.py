"""A run's timeline: each node's attempts, waits, step calls, resumes and the operators'
actions on one time axis, laid out here from what GetRun returns (steps, their errors
and journals, the audit trail) and drawn as SVG by ``_timeline.html``; no script.

What is drawn, per node (one lane each):

- its latest claim as a bar, from its start to its end (or to now while it runs);
- each ended attempt as a mark at the time it ended (failed, worker lost, resolved,
  reset); the store keeps when an attempt ended, not when an earlier one started;
- the backoff before its next attempt, while it lasts;
- each step call of its journal as a thin bar, and each wait (sleep, event, child run)
  as a hatched bar, open-ended while it waits; the end of a wait is a resume mark;
- each operator action on the node (or on the run: across every lane) as a line.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from console.text import span
from pyclient.models import Run, Step, StepCall, StepStatus

#: Pixel sizes: the column of node names, the plot, a lane, the axis.
LABEL_W = 170
PLOT_W = 760
LANE_H = 26
AXIS_H = 24
#: Most lanes drawn (larger runs: the first ones, saying so), and most step calls per
#: node (a durable body may record thousands).
MAX_LANES = 150
MAX_CALLS = 200
#: Widths of marks and the shortest bar, in pixels.
MARK_W = 3.0
MIN_BAR = 2.0
_ROUND = (1e-3, 1e-2, 0.1, 1, 5, 10, 30, 60, 300, 600, 1800, 3600, 6 * 3600, 86400)


@dataclass(frozen=True, slots=True)
class Item:
    """One drawn thing: its kind (attempt, fail, backoff, call, wait, resume, op), where
    (x and width in the plot, in px), its CSS class and its tooltip."""

    kind: str
    x: float
    w: float
    css: str
    title: str
    attempt: int = 0


@dataclass
class Lane:
    node: str
    status: str
    items: list[Item] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Tick:
    x: float
    label: str


@dataclass
class Timeline:
    start: dt.datetime
    end: dt.datetime
    lanes: list[Lane]
    ticks: list[Tick]
    #: Operator actions on the run as a whole (no node): lines across every lane.
    run_ops: list[Item]
    hidden_lanes: int = 0
    label_w: int = LABEL_W
    plot_w: int = PLOT_W
    lane_h: int = LANE_H
    axis_h: int = AXIS_H

    @property
    def width(self) -> int:
        return self.label_w + self.plot_w + 10

    @property
    def height(self) -> int:
        return self.axis_h + len(self.lanes) * self.lane_h + 6


def _when(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%H:%M:%S.%f")[:-3] + " UTC"


class _Axis:
    def __init__(self, start: dt.datetime, end: dt.datetime) -> None:
        self.start = start
        self.seconds = max((end - start).total_seconds(), 1e-3)

    def x(self, t: dt.datetime) -> float:
        offset = (t - self.start).total_seconds() / self.seconds
        return round(min(max(offset, 0.0), 1.0) * PLOT_W, 1)

    def bar(
        self, kind: str, a: dt.datetime, b: dt.datetime, css: str, title: str, n: int = 0
    ) -> Item:
        x0, x1 = self.x(a), self.x(b)
        return Item(kind, x0, max(x1 - x0, MIN_BAR), css, title, n)

    def mark(self, kind: str, t: dt.datetime, css: str, title: str, n: int = 0) -> Item:
        return Item(kind, round(self.x(t) - MARK_W / 2, 1), MARK_W, css, title, n)

    def ticks(self) -> list[Tick]:
        step = next((s for s in _ROUND if self.seconds / s <= 6), self.seconds / 5)
        found, k = [], 0
        while k * step <= self.seconds + 1e-9:
            found.append(Tick(round(k * step / self.seconds * PLOT_W, 1), f"+{span(k * step)}"))
            k += 1
        return found


def _times(run: Run) -> Iterator[dt.datetime]:
    for t in (run.created_at, run.finished_at, run.updated_at):
        if t is not None:
            yield t
    for s in run.steps:
        yield from (t for t in (s.started_at, s.finished_at) if t is not None)
        yield from (e.at for e in s.errors if e.at is not None)
        for c in s.journal[:MAX_CALLS]:
            yield from (t for t in (c.started_at, c.finished_at) if t is not None)
    yield from (a.at for a in run.audit if a.at is not None)


def timeline_of(run: Run, now: dt.datetime | None = None) -> Timeline | None:
    """The run's timeline; None before anything happened to it."""
    now = now or dt.datetime.now(dt.UTC)
    times = list(_times(run))
    if not times:
        return None
    start = run.created_at or min(times)
    end = max([*times, now]) if run.finished_at is None else max(times)
    axis = _Axis(start, end)
    lanes = [_lane(axis, s, now if run.finished_at is None else end) for s in run.steps]
    by_node = {lane.node: lane for lane in lanes}
    run_ops: list[Item] = []
    for a in run.audit:
        if a.at is None:
            continue
        op = axis.mark(
            "op", a.at, f"tl-op op-{a.action}", _op_title(a.action, a.actor, a.reason, a.at)
        )
        lane = by_node.get(a.node)
        (lane.items if lane is not None else run_ops).append(op)
    shown = lanes[:MAX_LANES]
    return Timeline(start, end, shown, axis.ticks(), run_ops, len(lanes) - len(shown))


def _op_title(action: str, actor: str, reason: str, at: dt.datetime) -> str:
    title = f"{action} by {actor or 'someone'} at {_when(at)}"
    return title + (f": {reason}" if reason else "")


def _lane(axis: _Axis, step: Step, now: dt.datetime) -> Lane:
    lane = Lane(step.node, str(step.status))
    items = lane.items
    for e in step.errors:
        if e.at is None:
            continue
        what = "worker lost" if e.worker_lost else e.kind.replace("_", " ")
        title = f"attempt {e.attempt} ended at {_when(e.at)}: {what}, {e.type}: {e.message}"
        items.append(axis.mark("fail", e.at, f"tl-fail k-{e.kind}", title[:500], e.attempt))
    items.extend(_journal(axis, step.journal[:MAX_CALLS], now))
    latest = _latest_claim(axis, step, now)
    if latest is not None:
        items.insert(0, latest)
    last = step.last_error
    if (
        step.status == StepStatus.AVAILABLE
        and not step.waiting_for
        and last is not None
        and last.at is not None
        and step.available_at is not None
        and step.available_at > last.at
    ):
        until = min(step.available_at, max(now, last.at))
        title = f"backing off: attempt {step.attempt + 1} from {_when(step.available_at)}"
        items.append(axis.bar("backoff", last.at, until, "tl-backoff", title))
    return lane


def _latest_claim(axis: _Axis, step: Step, now: dt.datetime) -> Item | None:
    """The bar of the node's latest claim: from its start to its end, or now."""
    if step.started_at is None:
        return None
    if step.finished_at is not None:
        end = step.finished_at
    elif step.status == StepStatus.RUNNING:
        end = now
    else:
        ended = [e.at for e in step.errors if e.attempt == step.attempt and e.at is not None]
        waits = [c.started_at for c in step.journal if c.waiting_for and c.started_at]
        later = [t for t in (*ended, *waits) if t >= step.started_at]
        if not later:
            return None
        end = min(later)
    verb = "running since" if step.status == StepStatus.RUNNING else "from"
    title = f"attempt {step.attempt} ({step.status}), {verb} {_when(step.started_at)}"
    if end is not now:
        title += f" to {_when(end)} ({span((end - step.started_at).total_seconds())})"
    if step.worker_id:
        title += f" on {step.worker_id}"
    css = f"tl-attempt s-{step.status}"
    return axis.bar("attempt", step.started_at, end, css, title, step.attempt)


def _journal(axis: _Axis, calls: Sequence[StepCall], now: dt.datetime) -> Iterator[Item]:
    for c in calls:
        if c.started_at is None:
            continue
        if c.waiting_for:
            end = c.finished_at or now
            title = f"wait for {c.waiting_for} ({c.step_id}) from {_when(c.started_at)}"
            if c.finished_at is not None:
                title += f" to {_when(c.finished_at)}"
            elif c.wake_at is not None:
                title += f", looks again at {_when(c.wake_at)}"
            yield axis.bar("wait", c.started_at, end, f"tl-wait c-{c.status}", title, c.attempt)
            if c.finished_at is not None:
                woke = f"{c.step_id} over at {_when(c.finished_at)}: the node resumes"
                yield axis.mark("resume", c.finished_at, "tl-resume", woke, c.attempt)
            continue
        end = c.finished_at or now
        title = f"{c.function} ({c.step_id}, {c.status}) in attempt {c.attempt}"
        if c.finished_at is not None:
            title += f", {span((c.finished_at - c.started_at).total_seconds())}"
        yield axis.bar("call", c.started_at, end, f"tl-call c-{c.status}", title, c.attempt)
