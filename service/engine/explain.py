"""Explain: why a step is not running now, from the facts read by the step_explain
query. One reason code, one sentence for people, and the facts behind them.

The reasons follow the step's status, and the run's:

=====================  ============================================================
pending                waiting_on_upstream (upstream nodes not finished), or
                       blocked (held while its run is blocked)
pending, available      paused (ready, but held by a pause of its run, its workflow or
                       its action: who paused it, when and why)
available              waiting (a durable sleep, event or child wait: not before
                       available_at, or until the event or the child comes),
                       not_before (its run's start time), backing_off (not before
                       available_at: a retry's backoff), blocked (its run is),
                       no_worker (no Claim named the action lately), queued (ready
                       steps of the action ahead of it, or its workers all busy),
                       ready (the next claim of the action takes it)
running                running (leased), lease_expired (the sweep will reclaim it: its
                       worker was lost when the lease lapsed before the deadline)
uncertain              blocked (the run waits for Resolve)
completed, discarded,  the status itself, with the failure behind a discard or a skip
skipped, cancelled
=====================  ============================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from service.db.records import CancelJson, LastErrorJson, PauseJson, UpstreamJson
from service.db.runs import ExplainFacts

#: A worker serving an action names it in a Claim at least every few seconds while it
#: has a free slot (a long-poll claim looks again at least every 5 s); after this long
#: without one, nobody is asking for that action.
NO_WORKER_AFTER = timedelta(seconds=30)


@dataclass(frozen=True)
class Explanation:
    reason: str
    message: str
    #: (node, status, attempt, last error or None) of the upstream nodes behind the reason.
    upstream: Sequence[UpstreamJson] = field(default_factory=list)
    #: Whether the action's worker activity is part of the answer.
    about_workers: bool = False


def _ago(now: datetime, then: datetime | None) -> str:
    if then is None:
        return "never"
    seconds = (now - then).total_seconds()
    if seconds < 0:
        return f"in {_span(-seconds)}"
    return f"{_span(seconds)} ago"


def _span(seconds: float) -> str:
    if seconds < 1:
        return "less than 1s"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _at(now: datetime, when: datetime | None) -> str:
    if when is None:
        return "-"
    return f"{when:%Y-%m-%d %H:%M:%S} ({_ago(now, when)})"


def _error(e: LastErrorJson | None) -> str:
    if not e:
        return "no error recorded"
    what = e.get("type") or e.get("kind")
    return f"{what}: {e.get('message')}" if e.get("message") else str(what)


def _blocked_on_call(row: ExplainFacts, now: datetime) -> Explanation:
    """An uncertain node whose durable function met a step call with no outcome."""
    e = row.run_error or {}
    step_id = e.get("step_id", "")
    started = e.get("started_at")
    when = _at(now, datetime.fromisoformat(started)) if started else "-"
    resolve = f"cyclone resolve {row.run_id} {step_id}"
    return Explanation(
        "blocked",
        f"the run is blocked on node {row.node}: its step call {step_id} (function "
        f"{e.get('function', '?')}) started at attempt {e.get('attempt')}, {when}, and has no "
        "outcome; it is unsafe to repeat, so its effect may have happened. Check the outside "
        f"world, then `{resolve} --result JSON` (it happened: its return value), "
        f"`{resolve} --error MSG` (it happened and failed) or `{resolve} --discard` (it did "
        "not happen: it runs again)",
    )


def _node_list(nodes: Sequence[UpstreamJson]) -> str:
    return ", ".join(f"{n['node']} ({n['status']}, attempt {n['attempt']})" for n in nodes)


def _counted(row: ExplainFacts) -> int:
    """The attempts that count against the retry policy: claims that resumed a wait and
    attempts whose worker was lost do not."""
    return row.attempt - (row.resumes or 0) - (row.recoveries or 0)


def explain(row: ExplainFacts, max_recoveries: int = 10) -> Explanation:
    """The explanation of one step_explain row; ``max_recoveries``: the server's recovery
    budget (--max-recoveries)."""
    now: datetime = row.now
    status: str = row.status
    run_blocked = row.run_status == "blocked"
    attempts = f"attempt {row.attempt} of {row.max_attempts}"
    if row.recoveries:
        attempts = (
            f"attempt {row.attempt}, {_counted(row)} of {row.max_attempts} counted: "
            f"{row.recoveries} lost {'its worker' if row.recoveries == 1 else 'their worker'}"
        )

    if status == "completed":
        return Explanation("completed", f"completed {_at(now, row.finished_at)} ({attempts})")
    if status == "cancelled":
        cancel: CancelJson | dict[str, str] = row.cancel or {}
        who = f" by {cancel['actor']}" if cancel.get("actor") else ""
        why = f": {cancel['reason']}" if cancel.get("reason") else ""
        return Explanation(
            "cancelled", f"its run was cancelled{who} {_at(now, row.finished_at)}{why}"
        )
    if status == "discarded":
        return Explanation(
            "discarded",
            f"discarded {_at(now, row.finished_at)} at {attempts}: "
            f"{_error(row.last_error)}. `cyclone retry` reopens it",
        )
    if status == "skipped":
        return _skipped(row)
    if status == "uncertain" and row.run_error and row.run_error.get("step_id"):
        return _blocked_on_call(row, now)
    if status == "uncertain":
        message = (row.run_error or {}).get("message", "its effect may have happened")
        return Explanation(
            "blocked",
            f"the run is blocked on this step: {message}. Check the outside world, then "
            "`cyclone resolve` it",
        )
    if status == "running":
        return _running(row, now, attempts, max_recoveries)
    if status == "pending":
        waiting = [u for u in row.upstream if u["status"] in _OPEN]
        if run_blocked:
            return _held(row, waiting)
        if row.pause and not waiting:
            return _paused(row, now)
        if waiting:
            return Explanation(
                "waiting_on_upstream",
                f"waiting on upstream {_plural(waiting, 'node')} {_node_list(waiting)}",
                upstream=waiting,
            )
        return Explanation(
            "waiting_on_upstream", "its upstream nodes just finished; it is being released"
        )
    # available
    if run_blocked:
        return _held(row, [])
    if row.pause:
        return _paused(row, now)
    if row.available_at is not None and row.available_at > now and row.waiting_for:
        return _waiting(row, now)
    if row.available_at is not None and row.available_at > now and row.attempt == 0:
        return Explanation(
            "not_before", f"its run starts at {_at(now, row.available_at)}; it holds no worker"
        )
    if row.available_at is not None and row.available_at > now:
        return Explanation(
            "backing_off",
            f"backing off until {_at(now, row.available_at)} after attempt {row.attempt} "
            f"failed ({_error(row.last_error)}); {row.max_attempts - _counted(row)} "
            f"attempt(s) left",
        )
    return _ready(row, now)


_OPEN = ("pending", "available", "running", "uncertain")


def _paused(row: ExplainFacts, now: datetime) -> Explanation:
    """A ready step held by a pause of its run, its workflow or its action."""
    pause: PauseJson = row.pause or {"kind": "run", "name": "", "actor": "", "reason": "", "at": ""}
    kind = pause["kind"]
    at = _at(now, datetime.fromisoformat(pause["at"])) if pause.get("at") else "-"
    why = f": {pause['reason']}" if pause.get("reason") else ""
    if kind == "run":
        what, resume = "its run", f"cyclone resume run {row.run_id}"
    else:
        what, resume = f"{kind} {pause['name']}", f"cyclone resume {kind} {pause['name']}"
    return Explanation(
        "paused",
        f"paused by {pause.get('actor') or 'unknown'}: {what} was paused {at}{why}. It is "
        f"not claimed until `{resume}`",
    )


def _waiting(row: ExplainFacts, now: datetime) -> Explanation:
    """An available step whose durable function waits (a sleep, an event)."""
    what = row.waiting_for or ""
    if row.available_at is not None and row.available_at.year == 9999:
        until = "with no time limit"
    else:
        until = f"until {_at(now, row.available_at)}"
    message = f"waiting for {what} {until}; it holds no worker"
    if what.startswith("event "):
        message += (
            f" (it resumes at once when the event is sent: cyclone event send {row.run_id} "
            f"{what.removeprefix('event ')})"
        )
    # resumes counts this wait already: the claims that resumed a wait so far are one less.
    resumed = max(0, (row.resumes or 0) - 1)
    return Explanation("waiting", f"{message}; resumed {resumed} time(s) so far")


def _plural(items: list[Any], word: str) -> str:
    return word if len(items) == 1 else word + "s"


def _held(row: ExplainFacts, waiting: Sequence[UpstreamJson]) -> Explanation:
    error = row.run_error or {}
    also = f"; it also waits on {_node_list(waiting)}" if waiting else ""
    return Explanation(
        "blocked",
        f"held: its run is blocked by node {error.get('node')} "
        f"({error.get('kind', 'EffectUncertain')}); nothing in the run is claimed until "
        f"that node is resolved with `cyclone resolve`{also}",
        upstream=waiting,
    )


def _skipped(row: ExplainFacts) -> Explanation:
    failed = row.failed_upstream or []
    if row.trigger_rule == "one_failed" and not failed:
        return Explanation(
            "skipped",
            "skipped: its trigger rule is one_failed and every upstream node succeeded",
        )
    causes = "; ".join(
        f"{f['node']} was discarded at attempt {f['attempt']} ({_error(f.get('error'))})"
        for f in failed
    )
    rule = "" if row.trigger_rule == "all_success" else f" (trigger rule {row.trigger_rule})"
    return Explanation(
        "skipped",
        f"skipped{rule} because {causes or 'an upstream node failed'}. Retrying the "
        "discarded node reopens this one",
        upstream=failed,
    )


def _running(row: ExplainFacts, now: datetime, attempts: str, max_recoveries: int) -> Explanation:
    beat = row.last_heartbeat_at
    if beat is None or (row.started_at is not None and beat <= row.started_at):
        heard = "no heartbeat since its claim"
    else:
        heard = f"last heartbeat {_ago(now, beat)}"
    if row.lease_expires_at is not None and row.lease_expires_at <= now:
        # A lease that lapsed before the deadline: the worker was lost (not a failure).
        lost = row.deadline_at is None or row.lease_expires_at < row.deadline_at
        recovery = (row.recoveries or 0) + 1
        then = (
            "the run will block (the action is unsafe to repeat)"
            if row.unsafe
            else f"it will be discarded (it lost its worker {recovery} times, past the "
            f"recovery budget of {max_recoveries})"
            if lost and recovery > max_recoveries
            else f"it will run again (recovery {recovery} of {max_recoveries}; a lost "
            "worker uses up no attempt)"
            if lost
            else "it will be discarded (no attempt left)"
            if _counted(row) >= row.max_attempts
            else "it will run again"
        )
        what = (
            f"worker {row.worker_id} lost: its lease lapsed"
            if lost
            else f"the lease of worker {row.worker_id} ran to the step's timeout and expired"
        )
        return Explanation(
            "lease_expired",
            f"{what} {_ago(now, row.lease_expires_at)} "
            f"with no outcome ({attempts}, claimed {_ago(now, row.started_at)}, {heard}); "
            f"the recovery sweep will reclaim it and {then}",
        )
    return Explanation(
        "running",
        f"running on worker {row.worker_id} since {_at(now, row.started_at)} ({attempts}); "
        f"{heard}; lease until {_at(now, row.lease_expires_at)}, "
        f"deadline {_at(now, row.deadline_at)}",
    )


def _ready(row: ExplainFacts, now: datetime) -> Explanation:
    since = f"ready since {_at(now, row.available_at)}"
    uncertain = (
        "; its last attempt lost its lease with no outcome, so a worker that marks "
        f"{row.action} unsafe to repeat will block the run instead of running it"
        if row.effect_uncertain
        else ""
    )
    polled = row.polled_at
    asking = polled is not None and now - polled <= NO_WORKER_AFTER
    running = row.action_running or 0
    if not asking and running == 0:
        last = (
            f"the last one was {_ago(now, polled)}, by {row.polled_by}"
            if polled is not None
            else "none ever has"
        )
        return Explanation(
            "no_worker",
            f"{since}, but no worker has asked for action {row.action} in the last "
            f"{NO_WORKER_AFTER.total_seconds():.0f}s ({last}): start a worker that serves "
            f"it{uncertain}",
            about_workers=True,
        )
    key, limit = row.concurrency_key, row.concurrency_limit
    if key is not None and limit is not None and (row.key_running or 0) >= limit:
        return Explanation(
            "concurrency_limited",
            f"{since}; its concurrency key {key!r} has {limit} of {limit} step(s) running: "
            f"it can start when one of them stops{uncertain}",
            about_workers=True,
        )
    if row.rate_reopens_at is not None:
        return Explanation(
            "rate_limited",
            f"{since}; the rate limit of action {row.action} is used up until "
            f"{_at(now, row.rate_reopens_at)}{uncertain}",
            about_workers=True,
        )
    if row.ready_ahead:
        more = "+" if row.ready_ahead >= 10000 else ""
        return Explanation(
            "queued",
            f"{since}; {row.ready_ahead}{more} ready step(s) of action {row.action} are "
            f"ahead of it and {running} are running{uncertain}",
            about_workers=True,
        )
    if not asking:
        return Explanation(
            "queued",
            f"{since}; the workers serving action {row.action} are busy ({running} running) "
            f"and none has asked for more since {_ago(now, polled)}{uncertain}",
            about_workers=True,
        )
    return Explanation(
        "ready",
        f"{since}; worker {row.polled_by} asked for action {row.action} "
        f"{_ago(now, polled)}: the next claim takes it{uncertain}",
        about_workers=True,
    )
