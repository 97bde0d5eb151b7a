"""What the ``cyclone`` command prints, built with rich: tables, colour and the live
view of a followed run.

Colour only on a terminal: rich's own detection, which honours NO_COLOR, FORCE_COLOR
and TERM=dumb; piped output is plain text, never cut to a terminal's width. Times are
shown in the local time zone, with its name (TZ=UTC shows UTC).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from io import StringIO
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from pyclient import _states as states
from pyclient.models import (
    Explanation,
    LogLine,
    Run,
    RunStatus,
    Schedule,
    Step,
    StepCall,
    StepError,
    StepStatus,
)

#: Piped output is never wrapped or cut: a line is as long as its content.
PIPE_WIDTH = 100_000

STYLES = {
    "completed": "green",
    "succeeded": "green",
    "running": "cyan",
    "available": "blue",
    "waiting": "blue",
    "pending": "dim",
    "failed": "bold red",
    "discarded": "red",
    "blocked": "bold yellow",
    "uncertain": "yellow",
    "started": "yellow",
    "skipped": "dim",
    "cancelled": "magenta",
}
LEVEL_STYLES = {"ERROR": "red", "CRITICAL": "bold red", "WARNING": "yellow", "DEBUG": "dim"}
#: Step statuses after which nothing changes without an operator.
FINAL_STEPS = {"completed", "discarded", "skipped", "cancelled", "uncertain"}
#: Log lines of a step that `run show` prints (the last ones); `cyclone logs` prints all.
SHOWN_LOG_LINES = 10


class _Console(Console):
    """rich's Console, except that a reader going away (``| head``) is a BrokenPipeError
    for the CLI to end on (rich's own answer is to exit with status 1, the status of a
    call that failed or timed out)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def console(out: TextIO) -> Console:
    """A console on ``out``: colour on a terminal only, plain and unwrapped elsewhere."""
    terminal = out.isatty()
    return _Console(
        file=out,
        markup=False,
        emoji=False,
        highlight=False,
        width=None if terminal else PIPE_WIDTH,
    )


def to_text(renderable: RenderableType) -> str:
    """A renderable as plain text (no colour), lines stripped of trailing blanks."""
    buffer = StringIO()
    Console(
        file=buffer, markup=False, emoji=False, highlight=False, width=PIPE_WIDTH, no_color=True
    ).print(renderable)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def status(value: Any) -> Text:
    return Text(str(value), style=STYLES.get(str(value).lower(), ""))


def when(value: dt.datetime | None, since: dt.datetime | None = None) -> str:
    """A time in the local zone, to the second, with the zone's name; only the time of
    day when it falls on the same local day as ``since``."""
    if value is None:
        return "-"
    local = value.astimezone()
    if since is not None and since.astimezone().date() == local.date():
        return f"{local:%H:%M:%S} {local.tzname()}"
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}"


def _when_ms(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    local = value.astimezone()
    return f"{local:%H:%M:%S}.{local.microsecond // 1000:03d}"


def excerpt(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _table(*headers: str) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for header in headers:
        table.add_column(header, overflow="fold", no_wrap=True)
    return table


# -- attempts ---------------------------------------------------------------------------


def failed_attempts(step: Step) -> int:
    """Attempts that ended in a failure: the node's errors, less the marks of operator
    retries (kind "reset") and the attempts whose worker was lost."""
    return sum(1 for e in step.errors if e.kind != "reset" and not e.worker_lost)


def attempts(step: Step) -> str:
    """``attempt`` as it is (claims so far: for logs, never a key), then what it is made
    of: the tries of the retry policy (when claims that resumed a wait or lost their
    worker make them fewer), failed attempts, resumes and lost workers (which use up no
    try), operator retries, and the tries left."""
    if step.attempt == 0:
        return "not started"
    parts = []
    if states.tries(step) != step.attempt:
        parts.append(f"try {states.tries(step)} of {step.max_attempts}")
    failed = failed_attempts(step)
    if failed:
        parts.append(f"{failed} failed")
    parts += states.counts(step)
    retries = sum(1 for e in step.errors if e.kind == "reset")
    if retries:
        parts.append(f"{retries} operator retr{'y' if retries == 1 else 'ies'}")
    if step.status not in FINAL_STEPS:
        parts.append(f"{states.tries_left(step)} left")
    return f"attempt {step.attempt}" + (f" ({', '.join(parts)})" if parts else "")


# -- runs -------------------------------------------------------------------------------


def run_view(run: Run) -> Group:
    """A run: its header, error, steps (a tree by dependency, with journals), the last
    error of each failed step with its traceback, log lines, audit trail."""
    head = Text.assemble(
        f"run {run.run_id}  workflow {run.workflow}  ", status(str(run.status).upper())
    )
    parts: list[RenderableType] = [head]
    times = f"  created {when(run.created_at)}  updated {when(run.updated_at, run.created_at)}"
    if run.finished_at is not None:
        times += f"  finished {when(run.finished_at, run.created_at)}"
    if run.submit_key:
        times += f"  key {run.submit_key}"
    if run.deadline is not None:
        times += f"  deadline {when(run.deadline, run.created_at)}"
    parts.append(Text(times))
    if run.tags:
        parts.append(Text("  tags " + "  ".join(f"{k}={v}" for k, v in sorted(run.tags.items()))))
    if run.parent_run_id:
        parts.append(
            Text(
                f"  child of run {run.parent_run_id}, node {run.parent_node}, "
                f"step call {run.parent_step_id}"
            )
        )
    for node, step_id, child in run.children:
        parts.append(Text(f"  child run {child}  (node {node}, step call {step_id})"))
    if run.pause is not None:
        why = f": {run.pause.reason}" if run.pause.reason else ""
        parts.append(
            Text(
                f"  PAUSED by {run.pause.actor or '?'} {when(run.pause.at)}{why} "
                f"(cyclone resume run {run.run_id})",
                "yellow",
            )
        )
    if run.error is not None:
        e = run.error
        call = f", step call {e.step_id}" if e.step_id else ""
        style = "yellow" if run.status == RunStatus.BLOCKED else "red"
        parts.append(
            Text(f"  {e.kind}: {e.message} (node {e.node}{call}, attempt {e.attempt})", style)
        )
    if run.steps:
        parts += [Text(""), steps_table(run.steps, str(run.status))]
        parts += _failures(run.steps)
        parts += _logs(run)
    if run.audit:
        parts += [Text(""), Text("audit trail (operator actions):", style="bold")]
        for a in run.audit:
            target = f" {a.node}" if a.node else ""
            reason = f": {a.reason}" if a.reason else ""
            parts.append(Text(f"  {when(a.at)}  {a.action}{target} by {a.actor or '?'}{reason}"))
    return Group(*parts)


def render_run(run: Run) -> str:
    """A run as plain text (see run_view)."""
    return to_text(run_view(run))


def steps_table(steps: Sequence[Step], run_status: str = "") -> Table:
    """Steps (in topological order) as a tree, each under its first upstream node, with
    its journal's step calls under it."""
    table = _table("NODE", "STATUS", "ATTEMPT", "STARTED", "DETAIL")
    children: dict[str | None, list[Step]] = {}
    for step in steps:
        children.setdefault(step.depends_on[0] if step.depends_on else None, []).append(step)

    def walk(parent: str | None, prefix: str) -> None:
        kids = children.get(parent, [])
        for i, step in enumerate(kids):
            last = i == len(kids) - 1
            branch = "" if parent is None else ("└─ " if last else "├─ ")
            table.add_row(
                f"{prefix}{branch}{step.node}",
                status(states.shown_status(step)),
                attempts(step),
                when(step.started_at),
                detail(step, run_status),
            )
            inner = prefix + ("" if parent is None else ("   " if last else "│  "))
            below = "│  " if children.get(step.node) else "   "
            for call in step.journal:
                _journal_row(table, f"{inner}{below}", call, run_status)
            walk(step.node, inner)

    walk(None, "")
    return table


def _journal_row(table: Table, prefix: str, c: StepCall, run_status: str = "") -> None:
    parts = []
    if c.unsafe_to_repeat:
        parts.append("unsafe")
    parts.append(f"fn {c.function}")
    if c.finished_at is not None:
        parts.append(f"ended {when(c.finished_at, c.started_at)}")
    if c.error is not None:
        parts.append(excerpt(f"error {c.error.type}: {c.error.message}"))
    elif c.status == "succeeded":
        parts.append(excerpt(f"-> {json.dumps(c.output)}"))
    elif states.journal_status(str(c.status), run_status) == "cancelled":
        parts.append(f"was waiting for {c.waiting_for}: the run was cancelled")
    elif c.status == "waiting":
        until = f" until {when(c.wake_at)}" if c.wake_at else ""
        parts.append(f"waiting for {c.waiting_for}{until}")
    else:
        parts.append("no outcome")
    table.add_row(
        f"{prefix}· {c.seq} {c.step_id}",
        status(states.journal_status(str(c.status), run_status)),
        f"attempt {c.attempt}",
        when(c.started_at),
        "  ".join(parts),
    )


def detail(step: Step, run_status: str = "") -> str:
    """What else there is to know of a step, on one line (``run_status``: its run's,
    when known: "effect uncertain" is said only when it matters)."""
    parts = []
    if len(step.depends_on) > 1:
        parts.append(f"after {', '.join(step.depends_on)}")
    if step.trigger_rule != "all_success":
        parts.append(step.trigger_rule)
    if states.uncertain_matters(step, run_status):
        parts.append("effect uncertain")
    if step.status == StepStatus.RUNNING:
        parts.append(f"worker {step.worker_id}")
        parts.append(f"heartbeat {when(step.last_heartbeat_at, step.started_at)}")
    if step.progress is not None:
        parts.append(excerpt(f"progress {json.dumps(step.progress)}", 60))
    if step.waiting and step.waiting != "backoff" and step.status in ("available", "pending"):
        until = f" until {when(step.waiting_until)}" if step.waiting_until else ""
        parts.append(f"waiting for {step.waiting_reason or step.waiting}{until}")
    elif step.waiting_for and step.status in ("available", "pending"):
        until = f" until {when(step.available_at)}" if step.available_at else ""
        if step.available_at is not None and step.available_at.year == 9999:
            until = ""
        parts.append(f"waiting for {step.waiting_for}{until}")
    elif step.status == StepStatus.AVAILABLE and step.available_at is not None and step.errors:
        parts.append(f"retry at {when(step.available_at)}")
    if step.last_error is not None and step.status != StepStatus.COMPLETED:
        e = step.last_error
        what = "worker lost" if e.worker_lost else "last error"
        parts.append(excerpt(f"{what} (attempt {e.attempt}): {e.type or e.kind}: {e.message}"))
        if meaning := states.error_meaning(e):
            parts.append(f"({meaning})")
    return "  ".join(parts)


def _failures(steps: Sequence[Step]) -> list[RenderableType]:
    """Each step's errors, one line each, with the traceback of the last one."""
    shown: list[RenderableType] = []
    for step in steps:
        errors = [e for e in step.errors if e.kind != "reset"]
        if not errors:
            continue
        shown += [Text(""), Text(f"errors of {step.node}:", style="bold")]
        for e in errors:
            shown.append(_error_line(step, e))
        last = errors[-1]
        if last.details.strip():
            shown.append(Text(_indent(last.details.rstrip(), "      "), style="dim"))
    return shown


def _error_line(step: Step, e: StepError) -> Text:
    meaning = states.error_meaning(e)
    not_retried = states.why_not_retried(step, e)
    return Text.assemble(
        f"  attempt {e.attempt}  {when(e.at)}  {'worker lost' if e.worker_lost else e.kind}  ",
        (f"{e.type}: " if e.type else "", "red"),
        e.message,
        f" ({meaning})" if meaning else "",
        f" ({not_retried})" if not_retried else " (retried)" if e.retryable else "",
    )


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def _logs(run: Run) -> list[RenderableType]:
    """The last log lines of each step that has any (only when fetched with them)."""
    shown: list[RenderableType] = []
    for step in run.steps:
        if not step.logs:
            continue
        last = step.logs[-SHOWN_LOG_LINES:]
        more = len(step.logs) - len(last)
        note = f", last {len(last)} of {len(step.logs)}" if more else ""
        shown += [Text(""), Text(f"logs of {step.node}{note}:", style="bold")]
        shown += [log_line(line, indent="  ") for line in last]
        if more:
            shown.append(Text(f"  all of them: cyclone logs {run.run_id} {step.node}", "dim"))
    return shown


def log_line(line: LogLine, indent: str = "") -> Text:
    """One log line: time (ms), attempt, level, logger, message (tracebacks indented)."""
    origin = f"{line.logger}: " if line.logger else ""
    message = line.message.replace("\n", "\n" + indent + "    ")
    return Text.assemble(
        f"{indent}{_when_ms(line.at)}  attempt {line.attempt}  ",
        (f"{line.level:<7}", LEVEL_STYLES.get(line.level, "")),
        f"  {origin}{message}",
    )


def logs_view(lines: Iterable[LogLine]) -> Group:
    return Group(*(log_line(line) for line in lines))


# -- lists, explanations, schedules -----------------------------------------------------


def runs_table(runs: Sequence[Run]) -> RenderableType:
    if not runs:
        return Text("no runs")
    table = _table("RUN", "WORKFLOW", "STATUS", "CREATED", "STEPS")
    for r in runs:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(r.step_counts.items()))
        table.add_row(r.run_id, r.workflow, status(r.status), when(r.created_at), counts)
    return table


def _interval(s: Schedule) -> str:
    return f"{s.interval.total_seconds():g}s" if s.interval else "-"


def schedule_view(s: Schedule) -> Text:
    how = f"cron {s.cron!r} in {s.time_zone}" if s.cron else f"every {_interval(s)}"
    lines = [
        f"schedule {s.name}{'  (paused)' if s.paused else ''}",
        f"  submits    {s.workflow}" + (f" with input {json.dumps(s.input)}" if s.input else ""),
        f"  when       {how}",
        f"  policies   overlap {s.overlap}, catch-up {s.catch_up}",
        *(
            [f"  tags       {', '.join(f'{k}={v}' for k, v in sorted(s.tags.items()))}"]
            if s.tags
            else []
        ),
        f"  next       {'-' if s.paused else when(s.next_fire_at)}",
        f"  last       {when(s.last_fire_at)}"
        + (f"  run {s.last_run_id}" if s.last_run_id else ""),
    ]
    return Text("\n".join(lines))


def schedules_table(schedules: Sequence[Schedule]) -> RenderableType:
    if not schedules:
        return Text("no schedules")
    table = _table("NAME", "WORKFLOW", "WHEN", "NEXT", "LAST RUN")
    for s in schedules:
        how = f"{s.cron} ({s.time_zone})" if s.cron else f"every {_interval(s)}"
        nxt = "paused" if s.paused else when(s.next_fire_at)
        table.add_row(s.name, s.workflow, how, nxt, s.last_run_id or "-")
    return table


def explanation_view(e: Explanation) -> Text:
    """The reason and its sentence, then the step, its upstream and its workers."""
    lines = [f"{e.reason.upper()}: {e.message}"]
    step = e.step
    if step is not None:
        shown = f"{states.shown_status(step)}  {attempts(step)}  {detail(step, str(e.run_status))}"
        lines += ["", f"  step    {step.node}  {shown}"]
        if step.worker_id:
            lines.append(
                f"  worker  {step.worker_id}  claimed {when(step.started_at)}"
                f"  last heartbeat {when(step.last_heartbeat_at, step.started_at)}"
            )
        if step.progress is not None:
            lines.append(f"  progress  {json.dumps(step.progress)}")
    if e.run_error is not None:
        # A blocked run's error gives the advice the reason above gives already.
        said = e.reason == "blocked"
        message = f"node {e.run_error.node}" if said else e.run_error.message
        lines.append(f"  run     {e.run_status}  {e.run_error.kind}: {message}")
    for u in e.upstream:
        error = (
            f"  {u.last_error.type or u.last_error.kind}: {u.last_error.message}"
            if u.last_error
            else ""
        )
        lines.append(f"  upstream  {u.node}  {u.status}  attempt {u.attempt}{error}")
    if e.action is not None:
        a = e.action
        polled = f"{when(a.last_polled_at)} by {a.last_polled_by}" if a.last_polled_by else "never"
        claimed = (
            f"{when(a.last_claimed_at)} by {a.last_claimed_by}" if a.last_claimed_by else "never"
        )
        lines.append(
            f"  action  {a.action}  last asked for {polled}; last claimed {claimed}; "
            f"{a.ready_ahead} ready ahead, {a.running} running"
        )
    return Text("\n".join(lines))


# -- following a run --------------------------------------------------------------------


def follow_view(run: Run) -> Group:
    """The live view of a followed run: its header and its steps."""
    head = Text.assemble(
        f"run {run.run_id}  workflow {run.workflow}  ", status(str(run.status).upper())
    )
    return Group(head, steps_table(run.steps, str(run.status))) if run.steps else Group(head)


def changes(before: dict[str, tuple[str, int]], run: Run) -> list[Text]:
    """One line per step whose status or attempt changed since ``before`` (updated)."""
    lines = []
    for step in run.steps:
        now = (str(step.status), step.attempt)
        if before.get(step.node) == now:
            continue
        before[step.node] = now
        at = step.finished_at or step.started_at if step.status != "available" else None
        extra = detail(step, str(run.status))
        lines.append(
            Text.assemble(
                f"{when(at or dt.datetime.now(dt.UTC))}  {step.node}  ",
                status(step.status),
                f"  {attempts(step)}",
                f"  {extra}" if extra else "",
            )
        )
    return lines
