"""What needs a person: blocked and failed runs (ListRuns), steps backing off and
expired leases (ListSteps), and runs waiting on an action no worker serves (ListWorkers,
then ListSteps of each such action's ready steps); read by the server through its
indexes, whatever the number of runs."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from pyclient.client import AsyncClient
from pyclient.models import ActionActivity, Run, RunStep, WorkerSummary

#: Runs, and steps, listed per kind on the "needs a person" page.
LISTED = 100
#: Unserved actions whose waiting runs are listed (each is one more ListSteps).
ACTIONS_LISTED = 20
#: A worker serving an action asks for it every few seconds while it has room (a
#: long-poll claim at least every 5 s); past this, nobody is asking (as Explain says).
NO_WORKER_AFTER = dt.timedelta(seconds=30)


@dataclass
class Unserved:
    """An action with steps ready now that no worker has asked for lately."""

    activity: ActionActivity
    waiting: Sequence[RunStep]
    more: bool


@dataclass
class Attention:
    blocked: Sequence[Run]
    failed: Sequence[Run]
    backing_off: Sequence[RunStep]
    lease_expired: Sequence[RunStep]
    more_blocked: bool
    more_failed: bool
    more_backing_off: bool
    more_lease_expired: bool
    unserved: Sequence[Unserved] = ()


def unserved(actions: Sequence[ActionActivity], now: dt.datetime) -> list[ActionActivity]:
    """The actions with ready steps that no worker asks for: not the server's own, none
    running, and no Claim naming them in the last :data:`NO_WORKER_AFTER`."""
    return [
        a
        for a in actions
        if a.ready_ahead > 0
        and a.running == 0
        and not a.served_by_server
        and (a.last_polled_at is None or now - a.last_polled_at > NO_WORKER_AFTER)
    ]


async def _unserved(client: AsyncClient) -> list[Unserved]:
    workers = await client.list_workers()
    found = unserved(workers.actions, dt.datetime.now(dt.UTC))[:ACTIONS_LISTED]
    pages = await asyncio.gather(
        *(client.list_steps(ready=True, action=a.action, page_size=LISTED) for a in found)
    )
    return [
        Unserved(a, page.steps, bool(page.next_page_token))
        for a, page in zip(found, pages, strict=True)
    ]


async def attention(client: AsyncClient) -> Attention:
    blocked, failed, backing_off, expired, waiting = await asyncio.gather(
        client.list_runs(status="blocked", page_size=LISTED),
        client.list_runs(status="failed", page_size=LISTED),
        client.list_steps(backing_off=True, page_size=LISTED),
        client.list_steps(status="running", lease_expired=True, page_size=LISTED),
        _unserved(client),
    )
    return Attention(
        blocked.runs,
        failed.runs,
        backing_off.steps,
        expired.steps,
        bool(blocked.next_page_token),
        bool(failed.next_page_token),
        bool(backing_off.next_page_token),
        bool(expired.next_page_token),
        waiting,
    )


#: A worker not seen asking for work for this long is shown as quiet, not idle.
QUIET_AFTER = dt.timedelta(minutes=1)


def worker_state(worker: WorkerSummary, now: dt.datetime) -> str:
    """busy (holds steps), idle (asking for work, holding none) or quiet (neither lately:
    stopped, or busy with no room to ask)."""
    if worker.running:
        return "busy"
    if worker.last_seen_at is not None and now - worker.last_seen_at <= QUIET_AFTER:
        return "idle"
    return "quiet"
