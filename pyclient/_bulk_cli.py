"""The CLI's bulk actions (``cyclone bulk``): cancel, retry or resolve-discard every run
a filter matches, follow a job's progress, list and stop jobs. The parser's group of
commands and their handlers, kept together (see :mod:`pyclient._parser`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pyclient._commands import _count, _tags, run_filter_flags
from pyclient.client import Client
from pyclient.models import BulkAction

BULK_HELP = """\
Act on every run a filter matches, as a job the server works through in batches (at
most --bulk-rate runs a second, a server setting), resumed by another server if the
one working it stops. Each run is taken once and its audit trail names the job.

  cyclone bulk cancel --workflow billing --status running --reason "bad deploy"
  cyclone bulk retry --workflow etl --since 2h --dry-run
  cyclone bulk resolve-discard --workflow-prefix pay --reason "PSP confirmed no charge"

cancel takes running, failed and blocked runs; retry failed runs (every discarded node
reopened); resolve-discard blocked runs (the uncertain step runs again). The filters are
those of `cyclone runs list`; with none at all, --confirm-all is required. --dry-run
prints how many runs it would take and changes nothing. Without it, the job starts and
a progress bar shows until it is done (on a terminal; elsewhere the command waits
quietly), then one line says what it did; --no-wait prints the job id at once. Ctrl-C
stops the waiting, not the job: `cyclone bulk stop JOB` stops the job.
"""

#: The CLI's names of the actions, as start_bulk takes them.
ACTIONS = {"cancel": "cancel", "retry": "retry", "resolve-discard": "resolve_discard"}
#: Seconds between two reads of a job's progress.
POLL_S = 0.5


def bulk_commands(command: Callable[..., argparse.ArgumentParser], common: Any) -> None:
    """ "bulk cancel|retry|resolve-discard", "bulk status", "bulk list", "bulk stop"."""
    p = command("bulk", "cancel, retry or resolve every run a filter matches", BULK_HELP)
    sub = p.add_subparsers(dest="bulk_command", required=True, metavar="SUBCOMMAND")
    for name in ACTIONS:
        start = sub.add_parser(
            name,
            help=f"{name} every run the filters match",
            description=BULK_HELP,
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        run_filter_flags(start)
        start.add_argument("--reason", default="", help="why, recorded in each run's audit trail")
        start.add_argument("--dry-run", action="store_true", help="count the runs, change nothing")
        start.add_argument(
            "--confirm-all", action="store_true", help="required when no filter is given"
        )
        start.add_argument(
            "--no-wait", dest="wait", action="store_false", help="print the job id and return"
        )
        start.set_defaults(handler=_bulk_start, action=ACTIONS[name])
    status = sub.add_parser("status", help="show a bulk action's progress", parents=[common])
    status.add_argument("job_id", metavar="JOB")
    status.add_argument("--wait", action="store_true", help="follow it until it is done")
    status.set_defaults(handler=_bulk_status)
    lst = sub.add_parser("list", help="list bulk actions, newest first", parents=[common])
    lst.add_argument("--limit", type=_count, default=20, help="at most this many (default 20)")
    lst.set_defaults(handler=_bulk_list)
    stop = sub.add_parser(
        "stop",
        help="stop a running bulk action (the runs it acted on stay as they are)",
        parents=[common],
    )
    stop.add_argument("job_id", metavar="JOB")
    stop.set_defaults(handler=_bulk_stop)


def summary(job: BulkAction) -> str:
    """One line: the job, its action, state and counts."""
    total = f"{job.total:,}+" if job.total_at_least else f"{job.total:,}"
    line = (
        f"bulk {job.action} {job.job_id}: {job.state}, {job.touched:,} touched, "
        f"{job.skipped:,} skipped, {job.failed:,} failed of {total}"
    )
    if job.cancelled_by:
        line += f" (stopped by {job.cancelled_by})"
    if job.last_error:
        line += f"\n  last error: {job.last_error}"
    return line


def _bulk_start(client: Client, args: argparse.Namespace) -> Any:
    started = client.start_bulk(
        args.action,
        workflow=args.workflow,
        workflow_prefix=args.workflow_prefix,
        status=args.status,
        key=args.key,
        key_prefix=args.key_prefix,
        run_id_prefix=args.run_id,
        tags=_tags(args.tag) or None,
        created_after=args.since,
        created_before=args.until,
        reason=args.reason,
        dry_run=args.dry_run,
        confirm_all=args.confirm_all,
    )
    count = f"{started.matched:,}{'+' if started.at_least else ''}"
    if started.job is None:
        if args.json:
            return {"matched": started.matched, "at_least": started.at_least}
        return f"would {args.action.replace('_', '-')} {count} run(s); nothing changed"
    if not args.wait:
        return started.job.to_dict() if args.json else started.job.job_id
    job = _followed(client, started.job, quiet=args.json)
    return job.to_dict() if args.json else summary(job)


def _bulk_status(client: Client, args: argparse.Namespace) -> Any:
    job = client.get_bulk(args.job_id)
    if args.wait:
        job = _followed(client, job, quiet=args.json)
    return job.to_dict() if args.json else summary(job)


def _bulk_list(client: Client, args: argparse.Namespace) -> Any:
    jobs = client.list_bulk(page_size=min(args.limit, 1000)).jobs[: args.limit]
    if args.json:
        return [j.to_dict() for j in jobs]
    return "\n".join(summary(j) for j in jobs) or "no bulk actions"


def _bulk_stop(client: Client, args: argparse.Namespace) -> Any:
    job = client.cancel_bulk(args.job_id)
    return job.to_dict() if args.json else summary(job)


def _followed(client: Client, job: BulkAction, *, quiet: bool) -> BulkAction:
    """The job once it is no longer running: a progress bar on a terminal meanwhile.
    Ctrl-C stops the waiting only, and says so."""
    try:
        if quiet or not sys.stderr.isatty():
            return client.wait_bulk(job.job_id, poll=POLL_S)
        columns = (
            TextColumn(f"{job.action} {job.job_id[:8]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(job.action, total=max(job.total, 1))
            while job.running:
                done = job.touched + job.skipped + job.failed
                bar.update(task, completed=done, total=max(job.total, done, 1))
                time.sleep(POLL_S)
                job = client.get_bulk(job.job_id)
        return job
    except KeyboardInterrupt:
        print(
            f"cyclone: stopped waiting; bulk action {job.job_id} goes on "
            f"(cyclone bulk status {job.job_id} --wait; cyclone bulk stop {job.job_id})",
            file=sys.stderr,
        )
        raise
