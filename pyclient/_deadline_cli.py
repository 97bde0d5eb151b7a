"""The CLI's default deadlines of workflows (`cyclone workflow-deadline set|clear|list`)
and the duration argument they take (docs/time-and-events.md, "Run deadlines")."""

from __future__ import annotations

import argparse
import datetime as dt
import math
from typing import Any

from pyclient._commands import _DELAY_UNITS
from pyclient.client import Client
from pyclient.models import WorkflowDeadline

WORKFLOW_DEADLINE_HELP = """\
A workflow's default deadline: a run of it submitted without --deadline (or
submit(deadline=...)) is cancelled this long after its submit, its running steps told
through their cancel signal, the reason in its audit trail. Runs submitted before a
change keep the deadline they had.

  cyclone workflow-deadline set order 1h --reason "orders settle within the hour"
  cyclone workflow-deadline list
  cyclone workflow-deadline clear order
"""


def _duration_arg(text: str) -> float:
    """A duration: 90s, 15m, 2h, 1d, or a number of seconds; above zero."""
    unit = _DELAY_UNITS.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in _DELAY_UNITS else text
    try:
        value = float(number) * unit
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration like 90s, 15m, 2h, 1d (or seconds)"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a duration above zero, not {text}")
    return value


def _span(d: dt.timedelta) -> str:
    """A duration as the CLI shows it: 90s, 15m, 2h, 1d (or seconds when uneven)."""
    secs = d.total_seconds()
    for unit in ("d", "h", "m"):
        size = _DELAY_UNITS[unit]
        if secs >= size and secs % size == 0:
            return f"{secs / size:g}{unit}"
    return f"{secs:g}s"


def _line(d: WorkflowDeadline) -> str:
    why = f"  reason: {d.reason}" if d.reason else ""
    when = f"{d.set_at:%Y-%m-%d %H:%M:%S} UTC" if d.set_at else "?"
    return f"{d.workflow}  {_span(d.deadline)}  set by {d.set_by} at {when}{why}"


def _set(client: Client, args: argparse.Namespace) -> Any:
    got = client.set_workflow_deadline(args.name, args.deadline, reason=args.reason)
    return (
        [got] if args.json else f"workflow {got.workflow}: default deadline {_span(got.deadline)}"
    )


def _clear(client: Client, args: argparse.Namespace) -> Any:
    got = client.clear_workflow_deadline(args.name, reason=args.reason)
    if args.json:
        return [got]
    return f"workflow {got.workflow}: default deadline ({_span(got.deadline)}) cleared"


def _list(client: Client, args: argparse.Namespace) -> Any:
    deadlines = client.list_workflow_deadlines()
    if args.json:
        return deadlines
    return "\n".join(_line(d) for d in deadlines) or "no workflow has a default deadline"


def deadline_commands(command: Any, common: argparse.ArgumentParser) -> None:
    """ "workflow-deadline set|clear|list"."""
    p = command("workflow-deadline", "a workflow's default run deadline", WORKFLOW_DEADLINE_HELP)
    sub = p.add_subparsers(dest="deadline_command", required=True, metavar="SUBCOMMAND")

    def deadline_command(name: str, help: str) -> Any:
        return sub.add_parser(name, help=help, description=help, parents=[common])

    set_ = deadline_command("set", "set (or replace) a workflow's default deadline")
    set_.add_argument("name", metavar="WORKFLOW")
    set_.add_argument(
        "deadline", type=_duration_arg, metavar="DURATION", help="90s, 15m, 2h, 1d, or seconds"
    )
    set_.add_argument("--reason", default="", help="why (kept with it and logged)")
    set_.set_defaults(handler=_set)
    clear = deadline_command("clear", "clear a workflow's default deadline")
    clear.add_argument("name", metavar="WORKFLOW")
    clear.add_argument("--reason", default="", help="why (logged by the server)")
    clear.set_defaults(handler=_clear)
    deadline_command("list", "every workflow's default deadline").set_defaults(handler=_list)
