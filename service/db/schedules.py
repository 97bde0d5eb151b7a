"""Schedules: their rows, the engine's clock, and the firing pass's
transaction."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

import psycopg
from uuid6 import uuid7

from cyclone.dag import NodeSpec
from service import errors
from service.db.pool import Repository, translate
from service.db.records import NoRows
from service.db.runs import encoded_nodes

R = TypeVar("R", bound=tuple[Any, ...])


class ScheduleTurn(NamedTuple):
    """schedules_turn: whether this server's firing pass may go on (Citus)."""

    turn: bool


class ScheduleRow(NamedTuple):
    """schedule_create, schedule_get, schedules_list, schedule_pause, schedule_resume:
    one schedule (workflow: the Workflow message as JSON)."""

    name: str
    workflow: dict[str, Any]
    input: Any
    cron: str | None
    time_zone: str | None
    interval_s: int | None
    overlap: str
    catch_up: str
    paused: bool
    next_fire_at: datetime
    last_fire_at: datetime | None
    last_run_id: uuid.UUID | None
    created_at: datetime
    updated_at: datetime
    # The tags each firing's run carries (a JSON object); None for none.
    tags: dict[str, str] | None


class DueSchedule(NamedTuple):
    """schedules_due: a schedule due to fire, locked by the firing transaction, with
    the database's time. One whose nodes still hold key templates (not nodes_keyed)
    comes with its workflow (the Workflow message as JSON) and input; otherwise both
    are None."""

    now: datetime
    name: str
    cron: str | None
    time_zone: str | None
    interval_s: int | None
    catch_up: str
    next_fire_at: datetime
    nodes_keyed: bool = True
    workflow: dict[str, Any] | None = None
    input: Any = None


class Fired(NamedTuple):
    """schedule_fire: one firing of a schedule (run_id None: skipped for overlap)."""

    fire_at: datetime
    submit_key: str
    run_id: uuid.UUID | None
    outcome: str


class Now(NamedTuple):
    """clock_now: the engine's time (cyclone.now())."""

    now: datetime


class ScheduleName(NamedTuple):
    """schedule_delete: the schedule deleted."""

    name: str


class ReadyActions(NamedTuple):
    """ready_actions: the actions a transaction made claimable so far."""

    ready: str | None


def _schedule_found(name: str, row: R | None) -> R:
    if row is None:
        raise errors.NotFound(f"schedule {name!r} not found")
    return row


@dataclass(frozen=True, slots=True)
class FirePlan:
    """What one pass does with a due schedule: the fire times to submit (ascending),
    how many it skips as missed, and its next fire time after them."""

    fire_times: list[datetime]
    missed: int
    next_fire_at: datetime


@dataclass(slots=True)
class Fires:
    """What one firing pass did: how many schedules were due, each firing (with its
    schedule's name), the firings skipped as missed, by schedule, whether a schedule
    is left due (it had more firings than one pass submits), and the schedules that
    failed to fire, with the error (left due, tried again at the next pass)."""

    due: int
    fired: list[tuple[str, Fired]]
    missed: dict[str, int]
    more: bool
    failed: dict[str, str]


class Schedules(Repository):
    """Schedules, the engine's clock and the firing pass."""

    async def clock_now(self) -> datetime:
        """The engine's time (cyclone.now(): the tests' clock moves it)."""
        row = await self._one("clock_now", Now)
        assert row is not None
        return row.now

    async def clock_advance(self, seconds: float) -> None:
        await self._all("clock_advance", NoRows, seconds=seconds)

    async def schedule_create(self, **values: Any) -> ScheduleRow:
        """Insert a schedule (the columns of schedule_create); AlreadyExists when one has
        the name."""
        row = await self._one("schedule_create", ScheduleRow, **values)
        if row is None:
            raise errors.AlreadyExists(f"schedule {values['schedule']!r} exists")
        return row

    async def schedule_get(self, name: str) -> ScheduleRow:
        return _schedule_found(name, await self._one("schedule_get", ScheduleRow, schedule=name))

    async def schedules_list(self, *, after: str | None, limit: int) -> list[ScheduleRow]:
        return await self._all("schedules_list", ScheduleRow, after=after, limit=limit)

    async def schedule_pause(self, name: str) -> ScheduleRow:
        return _schedule_found(name, await self._one("schedule_pause", ScheduleRow, schedule=name))

    async def schedule_resume(self, name: str, next_fire_at: datetime) -> ScheduleRow:
        row = await self._one(
            "schedule_resume", ScheduleRow, schedule=name, next_fire_at=next_fire_at
        )
        return _schedule_found(name, row)

    async def schedule_delete(self, name: str) -> None:
        _schedule_found(name, await self._one("schedule_delete", ScheduleName, schedule=name))

    async def schedules_fire(
        self,
        plan: Callable[[DueSchedule], FirePlan],
        limit: int,
        keyed: Callable[[DueSchedule], Awaitable[Sequence[NodeSpec]]],
    ) -> Fires:
        """One firing pass, in one transaction: lock up to ``limit`` due schedules
        (skipping those another server holds), fire each as ``plan`` says, move each
        forward, commit. A server that dies before the commit fires nothing: the
        schedules stay due for the next pass of any server. Each schedule is fired
        under a savepoint: one that fails (its plan, its keys, or its submit) is left
        due, with its error in ``failed``, and the others fire. A schedule whose nodes
        still hold key templates first gets the nodes ``keyed`` gives in their place."""
        fires = Fires(due=0, fired=[], missed={}, more=False, failed={})
        sharded = await self.is_sharded()
        async with self._connection() as driver, driver.transaction():
            if sharded:
                [turn] = await self._run(driver, "schedules_turn", ScheduleTurn)
                if not turn.turn:
                    return fires  # another server is firing: passed by, not waited for
            due = await self._run(driver, "schedules_due", DueSchedule, limit=limit)
            fires.due = len(due)
            for schedule in due:
                try:
                    fire = plan(schedule)
                    nodes = (
                        None if schedule.nodes_keyed else await encoded_nodes(await keyed(schedule))
                    )
                    async with driver.transaction():
                        if nodes is not None:
                            await self._run(
                                driver,
                                "schedule_nodes_keyed",
                                NoRows,
                                schedule=schedule.name,
                                nodes=nodes,
                            )
                        rows = await self._run(
                            driver,
                            "schedule_fire",
                            Fired,
                            schedule=schedule.name,
                            fire_times=fire.fire_times,
                            run_ids=[str(uuid7()) for _ in fire.fire_times],
                            next_fire_at=fire.next_fire_at,
                        )
                except psycopg.Error as exc:
                    if driver.broken or driver.closed:
                        raise
                    fires.failed[schedule.name] = str(translate(exc))
                    continue
                except Exception as exc:  # the plan (a fire time the cron library cannot
                    # give), or keys that cannot be evaluated for the schedule's input
                    fires.failed[schedule.name] = f"{type(exc).__name__}: {exc}"
                    continue
                if fire.missed:
                    fires.missed[schedule.name] = fire.missed
                fires.more |= fire.next_fire_at <= schedule.now
                fires.fired.extend((schedule.name, row) for row in rows)
            ready = await self._run(driver, "ready_actions", ReadyActions)
        self._published(r.ready for r in ready)
        return fires
