"""What needs a person: blocked and failed runs (ListRuns), steps backing off and
expired leases (ListSteps), read by the server through its indexes, whatever the
number of runs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from pyclient.client import AsyncClient
from pyclient.models import Run, RunStep

#: Runs, and steps, listed per kind on the "needs a person" page.
LISTED = 100


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


async def attention(client: AsyncClient) -> Attention:
    blocked, failed, backing_off, expired = await asyncio.gather(
        client.list_runs(status="blocked", page_size=LISTED),
        client.list_runs(status="failed", page_size=LISTED),
        client.list_steps(backing_off=True, page_size=LISTED),
        client.list_steps(status="running", lease_expired=True, page_size=LISTED),
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
    )
