"""The CLI's argument parser (see :mod:`pyclient.cli`): the top-level options, then
each group of commands, each naming its handler in :mod:`pyclient._commands`."""

from __future__ import annotations

import argparse
import getpass
import json
import os
from collections.abc import Callable
from typing import Any

from pyclient._bulk_cli import bulk_commands
from pyclient._callbacks_cli import callback_commands
from pyclient._commands import (
    _builds_compatible,
    _builds_list,
    _builds_move,
    _builds_retire,
    _builds_runs,
    _cancel,
    _console,
    _count,
    _explain,
    _journal_export,
    _list,
    _logs,
    _priority,
    _resolve,
    _retry,
    _retry_all,
    _schedule_create,
    _schedule_delete,
    _schedule_list,
    _seconds,
    _send_event,
    _set_tags,
    _show,
    _start_at_arg,
    _submit,
    _tag_arg,
    _wait,
    run_filter_flags,
    status_flag,
)
from pyclient._deadline_cli import deadline_commands
from pyclient._messages_cli import message_commands
from pyclient._pause_cli import pause_commands
from pyclient._stream_cli import stream_commands
from pyclient.client import default_address

DESCRIPTION = """\
Operate Cyclone, the durable workflow service: submit workflows, inspect runs, ask
why a node is not running (explain), and steer runs (retry discarded nodes, resolve
blocked runs, cancel, pause and resume runs, workflows and actions).

The server is --address (default $CYCLONE_ADDRESS or 127.0.0.1:50051); --token (default
$CYCLONE_TOKEN) is sent as a bearer token; --actor (default $CYCLONE_ACTOR or your user
name) is recorded in the audit trail of retry, resolve, cancel, pause and set-tags. --json prints
machine-readable output. Options go before or after the command.

Exit status: 0 success (a run waited for completed); 1 the call failed or was refused,
or a wait timed out; 2 a usage error, or a run waited for failed, was cancelled or is
blocked; 130 Ctrl-C (the run waited for goes on: the line names it); 141 the reader of
the output went away (| head).
"""

SUBMIT_HELP = """\
Start a run of the workflow described in FILE (YAML or JSON, '-' for stdin):

  name: order
  input: {order_id: o-1, amount: 42}      # the run input (optional)
  nodes:
    - name: charge
      timeout: 30                          # seconds
      retry: {max_attempts: 5, initial_backoff: 1, max_backoff: 60, multiplier: 2}
    - name: send_receipt
      depends_on: [charge]
    - name: audit
      depends_on: [send_receipt]
      trigger_rule: all_done               # all_success | all_done | one_failed
      priority: 5                          # overrides --priority for this node
      concurrency: {key: "customer:{run.customer}", limit: 2}

A node's action defaults to its name. Prints the run id. With --key, at most one run
is made per (workflow name, key): a repeated submit prints the existing run's id.
--start-at (an ISO 8601 time with a zone, or a delay such as 90s, 15m, 2h) makes the
first steps claimable only then; --priority orders the run's steps among the ready
ones, higher first (docs/flow-control.md). --tag KEY=VALUE (repeated, at most 16)
tags the run: `cyclone runs list --tag KEY=VALUE` finds it. At --deadline (a time or a
delay, as --start-at) the run is cancelled (default: the workflow's default deadline,
if any: cyclone workflow-deadline).
"""

RESOLVE_HELP = """\
Resolve a blocked run after checking the outside world. A run is blocked when an
effect marked unsafe_to_repeat may or may not have happened, and Cyclone will not
guess: either a step of an unsafe action lost its lease with no outcome, or a step
call of a durable function was begun (recorded STARTED) by an attempt that died
before its outcome. `cyclone run show RUN` names what is blocked (EffectUncertain:
node, step call, attempt, when it started).

TARGET is a step id when the run is blocked on a step call (its error names one):

  cyclone resolve RUN charge_card --result '{"charge_id": "ch_123"}'

and the node of the blocked run otherwise. The node of a step call is the one
that the run's error names; --node NODE names it instead (then TARGET is always a
step id, and no GetRun is needed). Give exactly one of:

  --result JSON   the effect happened; JSON becomes the step's output (or the
                  step call's return value) and the work after it goes on
  --error MSG     the effect happened and failed; a step is recorded failed
                  (not retried), so one_failed and all_done nodes run; a step
                  call is recorded failed (EffectFailed: MSG), so the body's
                  except block and its cleanup run on replay
  --discard       the effect did not happen; the step runs again on the next
                  claim (a step call: its entry is deleted and it runs when the
                  body replays). Also the answer to a false alarm: a worker that
                  died before the effect blocks the run too

--reason is optional and recorded in the audit trail with your --actor and the
choice. Only a blocked run can be resolved, and only what blocks it: when two
operators resolve at once, the second is refused.
"""


SCHEDULE_CREATE_HELP = """\
Keep a schedule on the server that submits the workflow of FILE (the file `cyclone
submit` takes; its input is each run's input) on a cron expression or at a fixed
interval. Every server fires due schedules; each firing is one run, keyed
schedule:NAME:FIRE-TIME, even with several servers or after one is killed.

  cyclone schedule create nightly report.yaml --cron '30 2 * * *' --time-zone Europe/Paris
  cyclone schedule create poll poll.yaml --every 300 --overlap allow --catch-up all

--cron takes five fields (minute hour day-of-month month day-of-week) or six with
seconds first; --every takes whole seconds (fire times are its multiples since the
epoch). --overlap skip (the default) submits nothing while the last run still runs;
allow submits anyway. --catch-up skip (the default) drops firings missed by more than
15 s (every server down or busy); all submits each of them, the 100 most recent at most.
"""

EXPLAIN_HELP = """\
Say why NODE of RUN is not running now, or what it is doing, in one line, then the
facts behind it. The reason is one of:

  waiting_on_upstream  upstream nodes have not finished (listed, with their status)
  backing_off          a failed attempt is waiting out its backoff (until when, why)
  ready                ready, and workers ask for its action: the next claim takes it
  queued               ready, but steps of its action are ahead or its workers busy
  no_worker            ready, but no worker has asked for its action lately
  concurrency_limited  ready, but its concurrency key has its limit of steps running
  rate_limited         ready, but its action's rate limit is used up (until when)
  running              leased: by which worker, since when, last heartbeat, lease end
  lease_expired        the lease ran out with no outcome; the sweep will reclaim it
  blocked              its run is blocked (this step is uncertain, or held)
  discarded            failed for good (the last error); `cyclone retry` reopens it
  skipped              an upstream failure made it skip (which one, and why)
  cancelled, completed

Explain that node in turn to follow a chain of waits upstream.
"""


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a command's options only override the top-level values when given.
    s = argparse.SUPPRESS
    common.add_argument("--address", default=s, help="server host:port")
    common.add_argument("--token", default=s, help="bearer token")
    common.add_argument("--actor", default=s, help="who you are, for the audit trail")
    common.add_argument("--json", action="store_true", default=s, help="print JSON")

    parser = argparse.ArgumentParser(
        prog="cyclone",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--address", default=default_address(), help="server host:port")
    parser.add_argument("--token", default=os.environ.get("CYCLONE_TOKEN"), help="bearer token")
    parser.add_argument(
        "--actor",
        default=os.environ.get("CYCLONE_ACTOR") or _user(),
        help="who you are, recorded in the audit trail",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=help,
            description=description or help,
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    for add in (
        _submit_command,
        _run_commands,
        _logs_command,
        stream_commands,
        _runs_commands,
        _operator_commands,
        pause_commands,
        bulk_commands,
        _schedule_commands,
        _builds_commands,
        deadline_commands,
        _event_commands,
        callback_commands,
        message_commands,
        _journal_commands,
        _console_command,
    ):
        add(command, common)
    return parser


#: Adds a command to the parser: its name, help and description (the help by default).
Command = Callable[..., argparse.ArgumentParser]


def _submit_command(command: Command, common: argparse.ArgumentParser) -> None:
    """ "submit": start a run of a workflow file."""
    p = command("submit", "start a run of a workflow file", SUBMIT_HELP)
    p.add_argument("file", help="workflow file (YAML or JSON), '-' for stdin")
    p.add_argument("--input", type=_json_arg, help="run input as JSON (overrides the file's)")
    p.add_argument("--key", help="submit at most once per (workflow name, key)")
    p.add_argument(
        "--start-at",
        type=_start_at_arg,
        metavar="TIME",
        help="not before TIME: ISO 8601 with a zone, or a delay (90s, 15m, 2h, 1d)",
    )
    p.add_argument(
        "--deadline",
        type=_start_at_arg,
        metavar="TIME",
        help="cancel the run at TIME: ISO 8601 with a zone, or a delay (90s, 15m, 2h, 1d); "
        "default: the workflow's default deadline, if any",
    )
    p.add_argument(
        "--priority",
        type=_priority,
        default=0,
        help="claim priority of the run's steps (default 0)",
    )
    p.add_argument("--tag", type=_tag_arg, action="append", metavar="KEY=VALUE", help="a tag")
    p.add_argument(
        "--wait",
        type=_seconds,
        metavar="SECONDS",
        help="then wait up to SECONDS for the run to finish or block, and show it "
        "(exit status and --follow as for run wait)",
    )
    _follow_flags(p)
    p.set_defaults(handler=_submit, settles=True)


def _run_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """ "run show" and "run wait": one run."""
    p = command("run", "inspect one run")
    run_commands = p.add_subparsers(dest="run_command", required=True, metavar="SUBCOMMAND")
    show = run_commands.add_parser(
        "show",
        help="show a run and its steps as a tree",
        description="Show a run: status, error, and its steps as a tree (by dependency) "
        "with status, attempts, start, progress and last heartbeat (running steps), and the "
        "last error of each; then each failed step's errors with the last traceback, and "
        "the last log lines of each step (cyclone logs RUN NODE shows them all). ATTEMPT "
        "is the number of claims so far (the handler's ctx.attempt), with what it is made "
        "of: failed attempts, claims that resumed a wait (they use up no attempt), operator "
        "retries, attempts left. Times are in your local time zone, named.",
        parents=[common],
    )
    show.add_argument("run_id", metavar="RUN")
    show.set_defaults(handler=_show)
    wait = run_commands.add_parser(
        "wait",
        help="wait until a run is finished or blocked",
        description="Poll a run until it is completed, failed, cancelled or blocked, then "
        "show it. Exit status 0 when it completed, 2 when it failed, was cancelled or is "
        "blocked, 1 when --timeout passes first, 130 on Ctrl-C (the run goes on). On a "
        "terminal it follows the run live (a table of its steps, redrawn as they change) "
        "unless --no-follow or --json; --follow elsewhere prints one line per change of a step.",
        parents=[common],
    )
    wait.add_argument("run_id", metavar="RUN")
    wait.add_argument("--timeout", type=_seconds, default=None, help="seconds (default: no limit)")
    _follow_flags(wait)
    wait.set_defaults(handler=_wait, settles=True)


def _logs_command(command: Command, common: argparse.ArgumentParser) -> None:
    """ "logs": what a node's handlers logged."""
    p = command(
        "logs",
        "print what a node's handlers logged",
        "Print the lines NODE's handlers logged (through the logging module in Python, "
        "HeartbeatRequest.logs / CompleteRequest.logs elsewhere), every attempt or one, "
        "oldest first: time (local, to the millisecond), attempt, level, logger, message. "
        "The server keeps up to 1000 lines and 256 KiB per attempt, and deletes them with "
        "the run.",
    )
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("node", metavar="NODE")
    p.add_argument("--attempt", type=_count, help="only this attempt's lines")
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep printing new lines until the node is finished",
    )
    p.set_defaults(handler=_logs)


def _runs_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """ "runs list"."""
    p = command("runs", "list runs")
    runs_commands = p.add_subparsers(dest="runs_command", required=True, metavar="SUBCOMMAND")
    lst = runs_commands.add_parser(
        "list",
        help="list runs, newest first",
        description="List runs, newest first, with their step counts.",
        parents=[common],
    )
    run_filter_flags(lst)
    lst.add_argument("--limit", type=_count, default=50, help="at most this many (default 50)")
    lst.set_defaults(handler=_list)


def _operator_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """The operator's actions on a run: explain, retry, retry-all, resolve, cancel."""
    s = argparse.SUPPRESS  # (--result JSON may be null)
    p = command("explain", "say why a node is not running", EXPLAIN_HELP)
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("node", metavar="NODE")
    p.set_defaults(handler=_explain)

    p = command(
        "retry",
        "reopen a discarded node",
        "Reopen a discarded node in place: same run and node (so the same idempotency "
        "key), its next claim is the next attempt. Nodes skipped because of it run again.",
    )
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("node", metavar="NODE")
    p.add_argument("--reason", default="", help="recorded in the audit trail")
    p.set_defaults(handler=_retry)

    p = command("set-tags", "change a run's tags (recorded in its audit trail)")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--set", type=_tag_arg, action="append", metavar="KEY=VALUE", help="set a tag")
    p.add_argument("--remove", action="append", metavar="KEY", help="remove a tag")
    p.add_argument("--reason", default="", help="recorded in the audit trail")
    p.set_defaults(handler=_set_tags)

    p = command("retry-all", "reopen every discarded node of a run")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--reason", default="", help="recorded in the audit trail")
    p.set_defaults(handler=_retry_all)

    p = command("resolve", "resolve the uncertain step or step call of a blocked run", RESOLVE_HELP)
    p.add_argument("run_id", metavar="RUN", help="the blocked run")
    p.add_argument(
        "target",
        metavar="TARGET",
        help="the step id of its uncertain step call, or its uncertain node (see run show)",
    )
    p.add_argument("--node", help="the node of the step call (default: the blocked one)")
    choice = p.add_mutually_exclusive_group(required=True)
    choice.add_argument(
        "--result", type=_json_arg, default=s, metavar="JSON", help="the effect happened"
    )
    choice.add_argument("--error", metavar="MSG", help="the effect happened and failed")
    choice.add_argument("--discard", action="store_true", help="the effect did not happen")
    p.add_argument(
        "--reason", default="", metavar="TEXT", help="what you checked; recorded in the audit"
    )
    p.set_defaults(handler=_resolve)

    p = command(
        "cancel",
        "cancel a run",
        "Cancel a run that is not finished: its unfinished steps are cancelled and "
        "running handlers are told to stop at their next heartbeat. Its running or "
        "blocked child runs (started by its durable functions), and theirs, are "
        "cancelled with it unless --keep-children.",
    )
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--reason", default="", help="recorded in the audit trail")
    p.add_argument("--keep-children", action="store_true", help="leave its child runs running")
    p.set_defaults(handler=_cancel)


BUILDS_HELP = """\
Workers that declare a build (Worker(build_id=...), CYCLONE_BUILD_ID) pin the durable
bodies they start: a node with a journal goes only to workers of its build, or of a
build declared compatible with it (docs/durable-functions.md, "Build pinning"). A
deploy: start the new build's workers; declare it compatible with the old one, or let
the old one drain; stop the old workers; retire the old build; move what is left.

  cyclone builds list
  cyclone builds compatible v2 --with v1
  cyclone builds retire v1 --reason 'v2 deployed'
  cyclone builds runs v1
  cyclone builds move v1 v2
"""


def _builds_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """ "builds list|runs|compatible|retire|move"."""
    p = command("builds", "deploy new code under durable runs: builds and their pins", BUILDS_HELP)
    sub = p.add_subparsers(dest="builds_command", required=True, metavar="SUBCOMMAND")

    def builds_command(name: str, help: str) -> Any:
        return sub.add_parser(name, help=help, description=help, parents=[common])

    builds_command("list", "every build workers declared").set_defaults(handler=_builds_list)
    runs = builds_command("runs", "the runs with unfinished nodes pinned to a build")
    runs.add_argument("build", metavar="BUILD")
    runs.add_argument("--limit", type=_count, default=100, help="at most this many (default 100)")
    runs.set_defaults(handler=_builds_runs)
    compatible = builds_command(
        "compatible", "let BUILD's workers and OTHER's take each other's pinned nodes"
    )
    compatible.add_argument("build", metavar="BUILD")
    compatible.add_argument("--with", dest="with_build", metavar="OTHER", required=True)
    compatible.add_argument("--reason", default="", help="why (logged by the server)")
    compatible.set_defaults(handler=_builds_compatible)
    retire = builds_command("retire", "hand a build's workers nothing from now on")
    retire.add_argument("build", metavar="BUILD")
    retire.add_argument("--reason", default="", help="why (logged by the server)")
    retire.set_defaults(handler=_builds_retire)
    move = builds_command("move", "move a retired build's unfinished nodes to another build")
    move.add_argument("from_build", metavar="FROM")
    move.add_argument("to_build", metavar="TO")
    move.add_argument("--reason", default="", help="why (in each run's audit trail)")
    move.set_defaults(handler=_builds_move)


def _schedule_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """ "schedule create|get|list|pause|resume|delete"."""
    p = command("schedule", "keep schedules on the server (docs/schedules.md)")
    sched = p.add_subparsers(dest="schedule_command", required=True, metavar="SUBCOMMAND")

    def schedule_command(name: str, help: str, description: str | None = None) -> Any:
        sub = sched.add_parser(
            name,
            help=help,
            description=description or help,
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if name != "list":
            sub.add_argument("name", metavar="NAME", help="the schedule's name")
        return sub

    create = schedule_command("create", "make a schedule", SCHEDULE_CREATE_HELP)
    create.add_argument("file", help="workflow file (YAML or JSON), '-' for stdin")
    when = create.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="cron expression, e.g. '0 9 * * 1-5'")
    when.add_argument("--every", type=_count, metavar="SECONDS", help="a fixed interval")
    create.add_argument("--time-zone", metavar="ZONE", help="IANA zone of --cron (default UTC)")
    create.add_argument("--input", type=_json_arg, help="run input as JSON (overrides the file's)")
    create.add_argument("--overlap", choices=["skip", "allow"], default="skip")
    create.add_argument("--catch-up", choices=["skip", "all"], default="skip")
    create.add_argument("--paused", action="store_true", help="create it paused")
    create.add_argument(
        "--tag",
        type=_tag_arg,
        action="append",
        metavar="KEY=VALUE",
        help="a tag of each run it submits (repeated, at most 16)",
    )
    create.set_defaults(handler=_schedule_create)
    schedule_command("get", "show a schedule").set_defaults(
        handler=lambda c, a: c.get_schedule(a.name)
    )
    lst = schedule_command("list", "list schedules by name")
    lst.add_argument("--limit", type=_count, default=1000, help="at most this many (default 1000)")
    lst.set_defaults(handler=_schedule_list)
    schedule_command("pause", "stop a schedule from firing").set_defaults(
        handler=lambda c, a: c.pause_schedule(a.name)
    )
    schedule_command(
        "resume", "let a paused schedule fire again, from its next fire time after now"
    ).set_defaults(handler=lambda c, a: c.resume_schedule(a.name))
    schedule_command("delete", "delete a schedule (the runs it submitted stay)").set_defaults(
        handler=_schedule_delete
    )


def _event_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """ "event send"."""
    p = command("event", "send events to runs")
    event_commands = p.add_subparsers(dest="event_command", required=True, metavar="SUBCOMMAND")
    send = event_commands.add_parser(
        "send",
        help="send a named event to a run",
        description="Send the event NAME with a JSON payload to a run. It is kept until a "
        "wait for NAME consumes it (wait_for_event in a durable function, or a DAG node "
        "that waits for an event), each event once; a node waiting for it resumes at once. "
        "Recorded in the run's audit trail with your --actor.",
        parents=[common],
    )
    send.add_argument("run_id", metavar="RUN")
    send.add_argument("name", metavar="NAME")
    send.add_argument("--payload", type=_json_arg, default=None, metavar="JSON")
    send.add_argument("--key", help="send at most once per (run, key)")
    send.set_defaults(handler=_send_event)


JOURNAL_EXPORT_HELP = """\
Write the journals of the durable functions' nodes of some runs as JSON, for the
replay check: pyclient.testing.replay(body, FILE) replays each journal against
today's code of the body in a unit test, and fails on a change that a run in flight
could not replay (docs/durable-functions.md, "The replay check").

  cyclone journal export 01a2... 01a3... -o journals.json
  cyclone journal export --workflow checkout --status running --limit 200 -o journals.json

Give run ids, or filters (the newest runs first, --limit at most; default 100). Each
node that has a journal is written with its run, action, input, run input, the
outputs of the nodes it depends on, and its journal's entries (outputs and errors).
--action keeps the nodes of one action. Without -o the JSON goes to stdout.
"""


def _journal_commands(command: Command, common: argparse.ArgumentParser) -> None:
    """ "journal export"."""
    p = command("journal", "export the journals of durable functions")
    journal = p.add_subparsers(dest="journal_command", required=True, metavar="SUBCOMMAND")
    export = journal.add_parser(
        "export",
        help="write the journals of runs' durable nodes as JSON (for the replay check)",
        description=JOURNAL_EXPORT_HELP,
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="runs to export")
    export.add_argument("--workflow", help="the newest runs of this workflow")
    status_flag(export)
    export.add_argument("--action", help="only the nodes of this action")
    export.add_argument(
        "--limit", type=_count, default=100, help="at most this many runs (default 100)"
    )
    export.add_argument("-o", "--output", metavar="FILE", help="write here (default stdout)")
    export.set_defaults(handler=_journal_export)


def _console_command(command: Command, common: argparse.ArgumentParser) -> None:
    """ "console": serve the web console."""
    p = command(
        "console",
        "serve the web console for the server at --address",
        "Serve the web console (runs, their DAGs, the operator actions) for the Cyclone "
        "server at --address, until Ctrl-C. When the server needs tokens, each browser "
        "session signs in with its own. Needs the console extra: "
        "pip install 'cyclone-workflows[console]'.",
    )
    p.add_argument("--listen", default="127.0.0.1:50052", help="host:port to serve the console on")
    p.add_argument(
        "--tls-ca", metavar="PEM", help="call the server over TLS, trusting this CA certificate"
    )
    # make run gives --listen from its CONSOLE variable: a refused port names that.
    p.add_argument("--listen-setting", default="--listen", help=argparse.SUPPRESS)
    p.set_defaults(handler=_console)


def _follow_flags(p: argparse.ArgumentParser) -> None:
    follow = p.add_mutually_exclusive_group()
    follow.add_argument(
        "--follow",
        action="store_true",
        default=None,
        help="show the steps as they change (the default on a terminal)",
    )
    follow.add_argument(
        "--no-follow", dest="follow", action="store_false", help="wait quietly, then show"
    )


def _user() -> str | None:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment
        return None
