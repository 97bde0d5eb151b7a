"""``cyclone``: the operator's command line. Every command is one RPC of the Client.

Exit status: 0 on success, 1 when the server refused or failed the call (the message
is printed on stderr), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import yaml
from rich.console import Group
from rich.live import Live
from rich.text import Text

from pyclient._render import (
    FINAL_STEPS,
    changes,
    console,
    explanation_view,
    follow_view,
    logs_view,
    render_run,
    run_view,
    runs_table,
    schedule_view,
    schedules_table,
    to_text,
)
from pyclient.client import Client, default_address
from pyclient.errors import CycloneError, InvalidArgument, Unavailable, WaitTimeout
from pyclient.models import Explanation, Run, RunStatus, Schedule
from pyclient.workflow import Workflow

__all__ = ["build_parser", "load_workflow_file", "main", "render_run"]

#: How often a followed run (run wait --follow, logs --follow) is read again.
FOLLOW_POLL_S = 0.5

DESCRIPTION = """\
Operate Cyclone, the durable workflow service: submit workflows, inspect runs, ask
why a node is not running (explain), and steer runs (retry discarded nodes, resolve
blocked runs, cancel).

The server is --address (default $CYCLONE_ADDRESS or 127.0.0.1:50051); --token (default
$CYCLONE_TOKEN) is sent as a bearer token; --actor (default $CYCLONE_ACTOR or your user
name) is recorded in the audit trail of retry, resolve and cancel. --json prints
machine-readable output. Options go before or after the command.
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
ones, higher first (docs/flow-control.md).
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
        "--priority", type=int, default=0, help="claim priority of the run's steps (default 0)"
    )
    p.add_argument(
        "--wait",
        type=float,
        metavar="SECONDS",
        help="then wait up to SECONDS for the run to finish or block, and show it "
        "(exit status and --follow as for run wait)",
    )
    _follow_flags(p)
    p.set_defaults(handler=_submit, settles=True)

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
        "blocked, 1 when --timeout passes first. On a terminal it follows the run live "
        "(a table of its steps, redrawn as they change) unless --no-follow or --json; "
        "--follow elsewhere prints one line per change of a step.",
        parents=[common],
    )
    wait.add_argument("run_id", metavar="RUN")
    wait.add_argument("--timeout", type=float, default=None, help="seconds (default: no limit)")
    _follow_flags(wait)
    wait.set_defaults(handler=_wait, settles=True)

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
    p.add_argument("--attempt", type=int, help="only this attempt's lines")
    p.add_argument(
        "--follow",
        action="store_true",
        help="keep printing new lines until the node is finished",
    )
    p.set_defaults(handler=_logs)

    p = command("runs", "list runs")
    runs_commands = p.add_subparsers(dest="runs_command", required=True, metavar="SUBCOMMAND")
    lst = runs_commands.add_parser(
        "list",
        help="list runs, newest first",
        description="List runs, newest first, with their step counts.",
        parents=[common],
    )
    lst.add_argument("--workflow", help="only runs of this workflow")
    lst.add_argument(
        "--status",
        action="append",
        choices=[s.value for s in RunStatus],
        help="only runs in this status (repeat for several)",
    )
    lst.add_argument("--key", help="only the run SubmitOnce made with this key")
    lst.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    lst.set_defaults(handler=_list)

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
    when.add_argument("--every", type=int, metavar="SECONDS", help="a fixed interval")
    create.add_argument("--time-zone", metavar="ZONE", help="IANA zone of --cron (default UTC)")
    create.add_argument("--input", type=_json_arg, help="run input as JSON (overrides the file's)")
    create.add_argument("--overlap", choices=["skip", "allow"], default="skip")
    create.add_argument("--catch-up", choices=["skip", "all"], default="skip")
    create.add_argument("--paused", action="store_true", help="create it paused")
    create.set_defaults(handler=_schedule_create)
    schedule_command("get", "show a schedule").set_defaults(
        handler=lambda c, a: c.get_schedule(a.name)
    )
    lst = schedule_command("list", "list schedules by name")
    lst.add_argument("--limit", type=int, default=1000, help="at most this many (default 1000)")
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
    p.set_defaults(handler=_console)
    return parser


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


def load_workflow_file(path: str, stdin: TextIO | None = None) -> tuple[Workflow, Any]:
    """The workflow and run input (or None) described by a YAML or JSON file."""
    if path == "-":
        text = (stdin or sys.stdin).read()
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise InvalidArgument(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InvalidArgument(f"{path} is not valid JSON or YAML: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"{path} must hold a mapping with 'name' and 'nodes'")
    data = dict(data)
    run_input = data.pop("input", None)
    return Workflow.from_dict(data), run_input


_DELAY_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _start_at_arg(text: str) -> dt.datetime | dt.timedelta:
    """--start-at: an aware ISO 8601 time, or a delay such as 90s, 15m, 2h, 1d."""
    unit = _DELAY_UNITS.get(text[-1:])
    if unit is not None:
        try:
            return dt.timedelta(seconds=float(text[:-1]) * unit)
        except ValueError:
            pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither an ISO 8601 time nor a delay like 90s, 15m, 2h, 1d"
        ) from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs a time zone, e.g. {text}Z")
    return when


# -- commands: each returns what to print (a Run, a list of runs, or a message) -------


def _workflow_and_input(args: argparse.Namespace) -> tuple[Workflow, Any]:
    """The workflow of args.file, and its input unless --input gives another."""
    workflow, run_input = load_workflow_file(args.file)
    return workflow, run_input if args.input is None else args.input


def _submit(client: Client, args: argparse.Namespace) -> Any:
    workflow, run_input = _workflow_and_input(args)
    # Only what was given, so that a submit without them is the plain call.
    flow = {k: v for k, v in (("start_at", args.start_at), ("priority", args.priority)) if v}
    if args.key:
        submitted = client.submit_once(workflow, args.key, run_input, **flow)
        run_id, created = submitted.run_id, submitted.created
    else:
        run_id, created = client.submit(workflow, run_input, **flow), True
    if args.wait is not None:
        return _settled(client, run_id, args.wait, args)
    if args.json:
        return {"run_id": run_id, "created": created}
    return run_id if created else f"{run_id} (already submitted with this key)"


def _show(client: Client, args: argparse.Namespace) -> Any:
    return client.get_run(args.run_id, logs=not args.json)


def _wait(client: Client, args: argparse.Namespace) -> Any:
    return _settled(client, args.run_id, args.timeout, args)


def _settled(client: Client, run_id: str, timeout: float | None, args: argparse.Namespace) -> Run:
    """The run once it is finished or blocked, followed on the way when asked (and by
    default on a terminal, unless --json)."""
    follow = args.follow
    if follow is None:
        follow = sys.stdout.isatty()
    if args.json:  # for scripts: the run alone
        return client.wait(run_id, timeout=timeout)
    if not follow:
        client.wait(run_id, timeout=timeout)
        return client.get_run(run_id, logs=True)  # shown as run show shows it
    end = None if timeout is None else time.monotonic() + timeout
    out = console(sys.stdout)

    def polls() -> Any:
        while True:
            run = client.get_run(run_id)
            yield run
            if run.status != RunStatus.RUNNING:
                return
            if end is not None and time.monotonic() >= end:
                raise WaitTimeout(f"run {run_id} is still {run.status} after {timeout:g}s")
            time.sleep(FOLLOW_POLL_S if end is None else min(FOLLOW_POLL_S, end - time.monotonic()))

    run: Run | None = None
    if out.is_terminal:
        # Redrawn in place, and gone at the end: the run is printed whole after it.
        with Live(console=out, auto_refresh=False, transient=True) as live:
            for run in polls():
                live.update(follow_view(run), refresh=True)
    else:
        seen: dict[str, tuple[str, int]] = {}
        for run in polls():
            for line in changes(seen, run):
                out.print(line)
            sys.stdout.flush()
    assert run is not None
    return client.get_run(run_id, logs=True)  # shown as run show shows it


def _logs(client: Client, args: argparse.Namespace) -> Any:
    """A node's log lines (one attempt's), and with --follow the new ones as they come,
    until the node is finished or its run is no longer running."""

    def lines() -> tuple[bool, list[Any]]:
        run = client.get_run(args.run_id, logs=True)
        try:
            step = run.step(args.node)
        except KeyError:
            raise InvalidArgument(f"run {args.run_id} has no node {args.node!r}") from None
        found = [line for line in step.logs if args.attempt in (None, line.attempt)]
        over = str(step.status) in FINAL_STEPS or run.status != RunStatus.RUNNING
        return over, found

    over, found = lines()
    if args.json:
        return {"node": args.node, "logs": [_log_dict(line) for line in found]}
    if not args.follow:
        return logs_view(found) if found else f"no log lines for node {args.node}"
    out = console(sys.stdout)
    printed = 0
    while True:
        if len(found) > printed:
            out.print(logs_view(found[printed:]))
            sys.stdout.flush()
            printed = len(found)
        if over:
            return f"-- node {args.node}: no more lines (it is finished or its run is not running)"
        time.sleep(FOLLOW_POLL_S)
        over, found = lines()


def _log_dict(line: Any) -> dict[str, Any]:
    return {
        "at": line.at.isoformat() if line.at else None,
        "attempt": line.attempt,
        "level": line.level,
        "logger": line.logger,
        "message": line.message,
    }


def _list(client: Client, args: argparse.Namespace) -> Any:
    page_size = max(1, min(args.limit, 1000))
    runs = client.iter_runs(
        workflow=args.workflow,
        status=args.status,
        key=args.key,
        page_size=page_size,
        limit=args.limit,
    )
    return list(runs)


def _explain(client: Client, args: argparse.Namespace) -> Any:
    return client.explain(args.run_id, args.node)


def _retry(client: Client, args: argparse.Namespace) -> Any:
    return client.retry(args.run_id, args.node, args.reason)


def _retry_all(client: Client, args: argparse.Namespace) -> Any:
    retried = client.retry_all(args.run_id, args.reason)
    if args.json:
        return {"nodes": list(retried.nodes), "run": retried.run.to_dict()}
    return f"reopened {', '.join(retried.nodes)}\n\n{render_run(retried.run)}"


def _resolve(client: Client, args: argparse.Namespace) -> Any:
    # --result null is a valid result, so "not given" is the attribute's absence.
    choice: dict[str, Any] = {"result": args.result} if hasattr(args, "result") else {}
    node = args.node
    if node is None:
        error = client.get_run(args.run_id).error
        if error is not None and error.step_id:
            node = error.node  # blocked on a step call: TARGET is its step id
    if node is not None:
        choice["step_id"] = args.target
    return client.resolve(
        args.run_id,
        node if node is not None else args.target,
        **choice,
        error=args.error,
        discard=args.discard,
        reason=args.reason,
    )


def _cancel(client: Client, args: argparse.Namespace) -> Any:
    return client.cancel(args.run_id, args.reason, keep_children=args.keep_children)


def _send_event(client: Client, args: argparse.Namespace) -> Any:
    sent = client.send_event(args.run_id, args.name, args.payload, args.key)
    if args.json:
        return {"event_id": sent.event_id, "created": sent.created}
    if not sent.created:
        return f"event {sent.event_id} was already sent with key {args.key}: nothing sent"
    return f"event {args.name} sent to run {args.run_id} (id {sent.event_id})"


def _console(client: Client, args: argparse.Namespace) -> Any:
    import asyncio
    import contextlib

    from console import ListenError, serve

    def started(url: str) -> None:
        print(f"Cyclone console for {args.address} on {url}", flush=True)

    credentials = None
    if args.tls_ca:
        import grpc

        ca = Path(args.tls_ca).read_bytes()
        credentials = grpc.ssl_channel_credentials(root_certificates=ca)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(
                serve(
                    args.address,
                    args.listen,
                    actor=args.actor,
                    credentials=credentials,
                    started=started,
                )
            )
    except ListenError as exc:
        raise InvalidArgument(f"{exc}; set --listen to a free host:port") from None
    return "console stopped"


# -- rendering ------------------------------------------------------------------------


def _schedule_create(client: Client, args: argparse.Namespace) -> Any:
    workflow, run_input = _workflow_and_input(args)
    return client.create_schedule(
        args.name,
        workflow,
        run_input,
        cron=args.cron,
        time_zone=args.time_zone,
        every=args.every,
        overlap=args.overlap,
        catch_up=args.catch_up,
        paused=args.paused,
    )


def _schedule_list(client: Client, args: argparse.Namespace) -> Any:
    found: list[Schedule] = []
    token = None
    while len(found) < args.limit:
        page = client.list_schedules(page_size=min(1000, args.limit - len(found)), page_token=token)
        found.extend(page.schedules)
        token = page.next_page_token
        if not token:
            break
    return tuple(found)


def _schedule_delete(client: Client, args: argparse.Namespace) -> Any:
    client.delete_schedule(args.name)
    return f"schedule {args.name} deleted"


def _print(result: Any, as_json: bool, out: TextIO) -> None:
    if as_json:
        if isinstance(result, Run | Explanation | Schedule):
            result = result.to_dict()
        elif isinstance(result, list | tuple):
            result = [r.to_dict() for r in result]
        elif isinstance(result, str):
            result = {"message": result}
        # (a dict is printed as it is)
        print(json.dumps(result, indent=2), file=out)
        return
    if isinstance(result, Run):
        shown: Any = run_view(result)
    elif isinstance(result, Explanation):
        shown = explanation_view(result)
    elif isinstance(result, Schedule):
        shown = schedule_view(result)
    elif isinstance(result, tuple):  # schedule list
        shown = schedules_table(result)
    elif isinstance(result, list):
        shown = runs_table(result)
    elif isinstance(result, Group | Text):
        shown = result
    else:
        print(result, file=out)
        return
    terminal = console(out)
    if terminal.is_terminal:
        terminal.print(shown)
    else:
        print(to_text(shown), file=out)


def main(argv: Sequence[str] | None = None, *, client: Client | None = None) -> int:
    args = build_parser().parse_args(argv)
    own = client is None
    if client is None:
        client = Client(args.address, token=args.token, actor=args.actor)
    try:
        result = args.handler(client, args)
        _print(result, args.json, sys.stdout)
        sys.stdout.flush()
        if getattr(args, "settles", False) and isinstance(result, Run):
            # A script can tell a run that needs a person from one that completed.
            return 0 if result.status is RunStatus.COMPLETED else 2
    except BrokenPipeError:
        # The reader went away (`cyclone ... | head`): end quietly, as other tools do.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Unavailable as exc:
        print(
            f"cyclone: error: cannot reach a Cyclone server at {args.address} ({exc.message}). "
            "Is it running (make run)? --address or CYCLONE_ADDRESS names another.",
            file=sys.stderr,
        )
        return 1
    except CycloneError as exc:
        print(f"cyclone: error: {exc.message}", file=sys.stderr)
        return 1
    finally:
        if own:
            client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
