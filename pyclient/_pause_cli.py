"""The CLI's pause commands (see :mod:`pyclient.cli`): ``cyclone pause run|workflow|action``,
``cyclone resume run|workflow|action`` and ``cyclone pauses``; their parser and their
handlers, added to the parser by :mod:`pyclient._parser`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyclient.models import NamePause, Paused

if TYPE_CHECKING:
    from pyclient.client import Client

PAUSE_HELP = """\
Pause a run, a workflow or an action. A paused run keeps its status: its running steps
go on and are recorded, its waits still resolve, but no step of it is claimed until it
is resumed. A paused workflow or action stops the claims of its steps on every server at
once (the claim itself checks it, in the database). Each pause is recorded with who
(--actor) and why (--reason); `cyclone explain` says what holds a step.

  cyclone pause run 0190f3c2-... --reason 'checking the ledger'
  cyclone pause workflow billing --reason 'bad deploy'
  cyclone pause action charge_card --reason 'provider down'
  cyclone pauses
  cyclone resume action charge_card
"""

#: What can be paused, and the help of its argument.
_TARGETS = {
    "run": ("RUN", "a run, by id"),
    "workflow": ("NAME", "every run of a workflow, by name"),
    "action": ("NAME", "every step of an action (handler name), in any run"),
}


def pause_commands(
    command: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """ "pause run|workflow|action", "resume run|workflow|action", "pauses"."""
    for verb, pause in (("pause", True), ("resume", False)):
        help = "pause a run, a workflow or an action" if pause else "resume what was paused"
        p = command(verb, help, PAUSE_HELP)
        targets = p.add_subparsers(dest="pause_target", required=True, metavar="WHAT")
        for target, (metavar, what) in _TARGETS.items():
            sub = targets.add_parser(
                target,
                help=f"{verb} {what}",
                description=f"{verb.capitalize()} {what}.",
                parents=[common],
            )
            sub.add_argument("target", metavar=metavar)
            sub.add_argument("--reason", default="", help="recorded with the pause")
            sub.set_defaults(handler=_pause_handler(target, pause))
    command("pauses", "list the paused workflows and actions", PAUSE_HELP).set_defaults(
        handler=_pauses
    )


def _pause_handler(target: str, pause: bool) -> Callable[[Client, argparse.Namespace], Any]:
    def handle(client: Client, args: argparse.Namespace) -> Any:
        if target == "run":
            change = client.pause_run if pause else client.resume_run
            return _run_answer(change(args.target, args.reason), pause, args.json)
        if target == "workflow":
            named = client.pause_workflow if pause else client.resume_workflow
        else:
            named = client.pause_action if pause else client.resume_action
        return _name_answer(named(args.target, args.reason), pause, args.json)

    return handle


def _run_answer(answer: Paused, pause: bool, as_json: bool) -> Any:
    if as_json:
        return answer.to_dict()
    run_id = answer.run.run_id
    if not answer.changed:
        return f"run {run_id} was {'already paused' if pause else 'not paused'}: nothing changed"
    if pause:
        return f"run {run_id} paused: none of its steps is claimed until `cyclone resume run`"
    return f"run {run_id} resumed"


def _name_answer(answer: NamePause, pause: bool, as_json: bool) -> Any:
    if as_json:
        return answer.to_dict()
    what = f"{answer.kind} {answer.name}"
    if not answer.changed:
        return f"{what} was {'already paused' if pause else 'not paused'}: nothing changed"
    return f"{what} {'paused on every server' if pause else 'resumed'}"


def _pauses(client: Client, args: argparse.Namespace) -> Any:
    pauses = client.list_pauses()
    if args.json:
        return pauses  # printed as each one's to_dict()
    if not pauses:
        return "nothing is paused"
    lines = []
    for p in pauses:
        held = p.pause
        at = f"{held.at:%Y-%m-%d %H:%M:%S} UTC" if held and held.at else "-"
        who = held.actor if held else "?"
        why = f": {held.reason}" if held and held.reason else ""
        lines.append(f"{p.kind:<8} {p.name}  paused by {who} at {at}{why}")
    return "\n".join(lines)
