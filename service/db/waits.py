"""Waits and events: a durable function's sleeps, event waits and child waits,
and the events sent to a run."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from service.db.completion import logs_items
from service.db.pool import Repository
from service.db.records import Outcome, StepCallJson


class Waited(NamedTuple):
    """step_wait: ready (the entry has its outcome) or suspended (it is waiting, the
    node gave up its lease), and the actions made claimable (a suspension notifies)."""

    decision: str
    call: StepCallJson
    ready: str | None


class EventSent(NamedTuple):
    """event_send: the event's id, whether this call sent it, the actions woken."""

    event_id: int
    created: bool
    ready: str | None


def _as_param(value: Any) -> Any:
    return str(value) if isinstance(value, uuid.UUID) else value


@dataclass(frozen=True, slots=True)
class WaitKey:
    """One wait of a held step, as Wait names it: a sleep (wake_at), an event (event,
    timeout_s: None for no limit) or a child run (child)."""

    run_id: str
    node: str
    lease_token: str
    step_id: str
    seq: int
    function: str
    wake_at: datetime | None = None
    event: str | None = None
    timeout_s: float | None = None
    child: uuid.UUID | None = None

    def params(self) -> dict[str, Any]:
        """The named query's parameters: every field, ids as text."""
        return {name: _as_param(getattr(self, name)) for name in self.__slots__}


class Waits(Repository):
    """Waits of durable functions and events sent to runs."""

    async def step_wait(self, wait: WaitKey, logs_json: str | None = None) -> Waited:
        """Wait: a durable function waits (step_wait, service/schema/47_waits.sql; for a
        child run through child_wait, 48_children.sql, which locks the child first).
        ``logs_json``: the body's log lines (a JSON array), stored in the same
        transaction first, under the lease's attempt."""
        name = "step_wait" if wait.child is None else "child_wait"
        logs = None
        if logs_json is not None:
            outcome = Outcome(wait.run_id, wait.node, wait.lease_token, logs_json=logs_json)
            logs = logs_items([outcome])
        [row] = await self._logged(name, Waited, logs, **wait.params())
        return row

    async def event_send(
        self,
        run_id: uuid.UUID,
        name: str,
        *,
        payload_json: str | None,
        key: str | None,
        actor: str,
    ) -> EventSent:
        """SendEvent: keep an event for the run's waits and wake its waiting nodes."""
        row = await self._one(
            "event_send",
            EventSent,
            run_id=str(run_id),
            event_name=name,
            payload=payload_json,
            key=key,
            actor=actor,
        )
        assert row is not None
        return row
