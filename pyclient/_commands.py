"""The CLI's commands (see :mod:`pyclient.cli`): each takes the client and the parsed
arguments and returns what to print."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import yaml
from rich.live import Live

from cyclone import flow
from pyclient._render import (
    FINAL_STEPS,
    changes,
    console,
    follow_view,
    logs_view,
    render_run,
)
from pyclient._replay_check import export_runs
from pyclient.client import Client
from pyclient.errors import InvalidArgument, WaitTimeout
from pyclient.models import Build, Run, RunStatus, Schedule
from pyclient.workflow import Workflow

#: How often a followed run (run wait --follow, logs --follow) is read again.
FOLLOW_POLL_S = 0.5


class Interrupted(Exception):
    """Ctrl-C while the CLI waited for a run: the run goes on, and this names it."""

    def __init__(self, run_id: str, following: bool) -> None:
        super().__init__(run_id)
        self.run_id = run_id
        self.following = following


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


def _moment_arg(text: str) -> dt.datetime:
    """--since, --until: an aware ISO 8601 time, or how long ago (90s, 15m, 2h, 1d)."""
    when = _start_at_arg(text)
    if isinstance(when, dt.timedelta):
        return dt.datetime.now(dt.UTC) - when
    return when


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _count(text: str) -> int:
    """A number of things, at least 1 (--limit, --attempt)."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _priority(text: str) -> int:
    value = _whole(text)
    try:
        flow.check_priority("--priority", value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--priority: ")) from None
    return value


def _tag_arg(text: str) -> tuple[str, str]:
    """A tag given as KEY=VALUE (--tag); the server checks its bounds."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _tags(pairs: list[tuple[str, str]] | None) -> dict[str, str]:
    """Repeated --tag (or --set) KEY=VALUE as a dict; a key given twice is refused."""
    tags: dict[str, str] = {}
    for key, value in pairs or ():
        if key in tags:
            raise InvalidArgument(f"tag {key!r} is given twice")
        tags[key] = value
    return tags


def _seconds(text: str) -> float:
    """A number of seconds, 0 or more and finite (--timeout, --wait)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, not {text}")
    return value


# -- commands: each returns what to print (a Run, a list of runs, or a message) -------


def _workflow_and_input(args: argparse.Namespace) -> tuple[Workflow, Any]:
    """The workflow of args.file, and its input unless --input gives another."""
    workflow, run_input = load_workflow_file(args.file)
    return workflow, run_input if args.input is None else args.input


def _submit(client: Client, args: argparse.Namespace) -> Any:
    workflow, run_input = _workflow_and_input(args)
    # Only what was given, so that a submit without them is the plain call.
    given = (("start_at", args.start_at), ("priority", args.priority), ("deadline", args.deadline))
    flow = {k: v for k, v in given if v}
    if args.tag:
        flow["tags"] = _tags(args.tag)
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


#: The most ready nodes of a run that `run show` asks Explain about.
def _show(client: Client, args: argparse.Namespace) -> Any:
    return client.get_run(args.run_id, logs=not args.json)


def _wait(client: Client, args: argparse.Namespace) -> Any:
    return _settled(client, args.run_id, args.timeout, args)


def _settled(client: Client, run_id: str, timeout: float | None, args: argparse.Namespace) -> Run:
    """The run once it is finished or blocked, followed on the way when asked (and by
    default on a terminal, unless --json). Ctrl-C is Interrupted, naming the run."""
    follow = args.follow
    if follow is None:
        follow = sys.stdout.isatty()
    try:
        return _settle(client, run_id, timeout, args, follow and not args.json)
    except KeyboardInterrupt:
        raise Interrupted(run_id, follow and not args.json) from None


def _settle(
    client: Client, run_id: str, timeout: float | None, args: argparse.Namespace, follow: bool
) -> Run:
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
        # Redrawn in place, and gone at the end: the run is printed whole after it. The view
        # starts and stops with Ctrl-C held back, so that it never stops half-started (stderr
        # still redirected, the cursor hidden): a Ctrl-C then lands in the loop.
        live = Live(console=out, auto_refresh=False, transient=True)
        try:
            with _sigint_held():
                live.start()
            for run in polls():
                live.update(follow_view(run), refresh=True)
        finally:
            with _sigint_held():
                live.stop()
    else:
        # The id first: the lines after it name only nodes.
        out.print(f"following run {run_id} (Ctrl-C stops following; the run goes on)")
        seen: dict[str, tuple[str, int]] = {}
        for run in polls():
            for line in changes(seen, run):
                out.print(line)
            sys.stdout.flush()
    assert run is not None
    return client.get_run(run_id, logs=True)  # shown as run show shows it


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Within: a Ctrl-C waits, and is raised as KeyboardInterrupt on the way out. (A signal
    mask would not do: another thread of the process, gRPC's, would take the signal.)"""
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt


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
    # One more than asked: whether more runs match is said, not left to guess.
    runs = list(
        client.iter_runs(
            workflow=args.workflow,
            status=args.status,
            key=args.key,
            run_id_prefix=args.run_id,
            workflow_prefix=args.workflow_prefix,
            key_prefix=args.key_prefix,
            tags=_tags(args.tag) or None,
            created_after=args.since,
            created_before=args.until,
            page_size=max(1, min(args.limit + 1, 1000)),
            limit=args.limit + 1,
        )
    )
    if len(runs) > args.limit:
        runs = runs[: args.limit]
        older = runs[-1].created_at.isoformat() if runs and runs[-1].created_at else None
        print(
            f"cyclone: {args.limit} runs shown, newest first; more match"
            + (f" (raise --limit, or add --until {older})" if older else " (raise --limit)"),
            file=sys.stderr,
        )
    return runs


def _journal_export(client: Client, args: argparse.Namespace) -> Any:
    """The journals of the durable nodes of the runs named, or of the newest runs that
    match the filters, as JSON (``pyclient.testing.replay`` reads it)."""
    if args.run_ids and (args.workflow or args.status):
        raise InvalidArgument("give run ids or --workflow/--status, not both")
    run_ids = list(args.run_ids)
    if not run_ids:
        limit = max(1, args.limit)
        found = client.iter_runs(
            workflow=args.workflow,
            status=args.status,
            page_size=min(limit, 1000),
            limit=limit,
        )
        run_ids = [run.run_id for run in found]
    exported = export_runs((client.get_run(run_id) for run_id in run_ids), action=args.action)
    if args.output is None:
        return exported if args.json else json.dumps(exported, indent=2)
    Path(args.output).write_text(json.dumps(exported, indent=2) + "\n")
    count = len(exported["nodes"])
    return f"wrote {count} journal(s) of {len(run_ids)} run(s) to {args.output}"


def _explain(client: Client, args: argparse.Namespace) -> Any:
    return client.explain(args.run_id, args.node)


def _retry(client: Client, args: argparse.Namespace) -> Any:
    return client.retry(args.run_id, args.node, args.reason)


def _set_tags(client: Client, args: argparse.Namespace) -> Any:
    return client.set_run_tags(args.run_id, _tags(args.set), args.remove or (), args.reason)


def _retry_all(client: Client, args: argparse.Namespace) -> Any:
    retried = client.retry_all(args.run_id, args.reason)
    if args.json:
        return {"nodes": list(retried.nodes), "run": retried.run.to_dict()}
    return f"reopened {', '.join(retried.nodes)}\n\n{render_run(retried.run)}"


def _resolve(client: Client, args: argparse.Namespace) -> Any:
    # --result null is a valid result, so "not given" is the attribute's absence.
    choice: dict[str, Any] = {"result": args.result} if hasattr(args, "result") else {}
    # TARGET is a step id when the run is blocked on a step call, its node otherwise:
    # Client.resolve takes the same words.
    return client.resolve(
        args.run_id,
        args.target,
        **choice,
        node=args.node,
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
        raise InvalidArgument(f"{exc}; set {args.listen_setting} to a free host:port") from None
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
        tags=_tags(args.tag) or None,
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


def _build_line(b: Build) -> str:
    seen = ", ".join(w.worker_id for w in b.workers[:3]) or "none"
    if len(b.workers) > 3:
        seen += f" (+{len(b.workers) - 3})"
    others = [x for x in b.compatible if x != b.build_id]
    state = f"retired {b.retired_at:%Y-%m-%d %H:%M:%S} UTC" if b.retired_at else "in service"
    return (
        f"{b.build_id}  {state}  pinned: {b.pinned_nodes} node(s) of {b.pinned_runs} run(s)"
        f"  compatible with: {', '.join(others) or '-'}  workers: {seen}"
    )


def _builds_list(client: Client, args: argparse.Namespace) -> Any:
    builds = client.list_builds()
    if args.json:
        return builds
    return "\n".join(_build_line(b) for b in builds) or "no build declared yet"


def _builds_runs(client: Client, args: argparse.Namespace) -> Any:
    runs = client.list_build_runs(args.build, limit=args.limit)
    if args.json:
        return runs
    lines = [f"{r.run_id}  {r.workflow}  nodes: {', '.join(r.nodes)}" for r in runs]
    return "\n".join(lines) or f"no unfinished node is pinned to build {args.build}"


def _builds_compatible(client: Client, args: argparse.Namespace) -> Any:
    build = client.set_build_compatible(args.build, args.with_build, reason=args.reason)
    return [build] if args.json else _build_line(build)


def _builds_retire(client: Client, args: argparse.Namespace) -> Any:
    build = client.retire_build(args.build, reason=args.reason)
    return [build] if args.json else _build_line(build)


def _builds_move(client: Client, args: argparse.Namespace) -> Any:
    moved = client.move_build(args.from_build, args.to_build, reason=args.reason)
    if args.json:
        return moved.to_dict()
    return (
        f"moved {moved.nodes_moved} unfinished node(s) of {moved.runs_moved} run(s) "
        f"from build {args.from_build} to build {args.to_build}"
    )


def status_flag(p: argparse.ArgumentParser) -> None:
    """--status, repeatable: the runs in these statuses only."""
    p.add_argument(
        "--status",
        action="append",
        choices=[s.value for s in RunStatus],
        help="only runs in this status (repeat for several)",
    )


def run_filter_flags(p: argparse.ArgumentParser) -> None:
    """The filters of `cyclone runs list` (and of `cyclone bulk`)."""
    p.add_argument("--workflow", help="only runs of this workflow")
    p.add_argument("--workflow-prefix", metavar="TEXT", help="only workflows named so at first")
    status_flag(p)
    p.add_argument("--key", help="only the run SubmitOnce made with this key")
    p.add_argument("--key-prefix", metavar="TEXT", help="only runs whose key starts so")
    p.add_argument(
        "--tag", type=_tag_arg, action="append", metavar="KEY=VALUE", help="only runs tagged so"
    )
    p.add_argument(
        "--run-id", metavar="PREFIX", help="only runs whose id starts with these 1-32 hex digits"
    )
    p.add_argument(
        "--since", type=_moment_arg, metavar="TIME", help="only runs created since (ISO time or 2h)"
    )
    p.add_argument(
        "--until", type=_moment_arg, metavar="TIME", help="only runs created before (ISO or 2h)"
    )
