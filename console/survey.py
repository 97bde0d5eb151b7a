"""What needs a person, and who the workers are, gathered through the API.

The API has no query for steps across runs, nor a list of workers: both are read here
from the newest running runs (GetRun each, at most SAMPLE_RUNS of them), and the
activity of each action from Explain of one of its ready steps. The pages say so.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyclient.client import AsyncClient
from pyclient.models import ActionActivity, Run, Step, StepStatus

#: Newest running runs read whole for the steps-backing-off, lease and worker views.
SAMPLE_RUNS = 200
#: Runs listed per kind on the "needs a person" page.
LISTED = 100
#: GetRun calls in flight at once.
CONCURRENCY = 8


@dataclass(frozen=True, slots=True)
class StepRef:
    run: Run
    step: Step


@dataclass
class Attention:
    blocked: Sequence[Run]
    failed: Sequence[Run]
    more_blocked: bool
    more_failed: bool
    backing_off: list[StepRef] = field(default_factory=list)
    lease_expired: list[StepRef] = field(default_factory=list)
    sampled: int = 0


@dataclass
class WorkerSeen:
    worker_id: str
    actions: set[str] = field(default_factory=set)
    running: int = 0
    last_heartbeat_at: dt.datetime | None = None


async def running_runs(client: AsyncClient) -> list[Run]:
    """The newest running runs, each with its steps."""
    page = await client.list_runs(status="running", page_size=SAMPLE_RUNS)
    limit = asyncio.Semaphore(CONCURRENCY)

    async def whole(run_id: str) -> Run:
        async with limit:
            return await client.get_run(run_id)

    return list(await asyncio.gather(*(whole(r.run_id) for r in page.runs)))


async def attention(client: AsyncClient, now: dt.datetime) -> Attention:
    blocked, failed, runs = await asyncio.gather(
        client.list_runs(status="blocked", page_size=LISTED),
        client.list_runs(status="failed", page_size=LISTED),
        running_runs(client),
    )
    found = Attention(
        blocked.runs, failed.runs, bool(blocked.next_page_token), bool(failed.next_page_token)
    )
    found.sampled = len(runs)
    for run in runs:
        for step in run.steps:
            if (
                step.status == StepStatus.AVAILABLE
                and step.errors
                and step.available_at is not None
                and step.available_at > now
            ):
                found.backing_off.append(StepRef(run, step))
            if (
                step.status == StepStatus.RUNNING
                and step.lease_expires_at is not None
                and step.lease_expires_at < now
            ):
                found.lease_expired.append(StepRef(run, step))
    return found


async def workers(client: AsyncClient) -> tuple[list[WorkerSeen], list[ActionActivity], int]:
    """Workers holding steps of the sampled runs, and the activity of each action that
    has a ready step there; and how many runs were sampled."""
    runs = await running_runs(client)
    seen: dict[str, WorkerSeen] = {}
    ready: dict[str, tuple[str, str]] = {}  # action -> (run_id, node) of a ready step
    for run in runs:
        for step in run.steps:
            if step.status == StepStatus.RUNNING and step.worker_id:
                w = seen.setdefault(step.worker_id, WorkerSeen(step.worker_id))
                w.actions.add(step.action)
                w.running += 1
                beat = step.last_heartbeat_at
                if beat is not None and (w.last_heartbeat_at is None or beat > w.last_heartbeat_at):
                    w.last_heartbeat_at = beat
            elif step.status == StepStatus.AVAILABLE:
                ready.setdefault(step.action, (run.run_id, step.node))
    explained = await asyncio.gather(*(client.explain(r, n) for r, n in ready.values()))
    activity = [e.action for e in explained if e.action is not None]
    return (
        sorted(seen.values(), key=lambda w: w.worker_id),
        sorted(activity, key=lambda a: a.action),
        len(runs),
    )
