"""Schedule firing (docs/schedules.md): fire times, what a pass does with a due
schedule (its plan), and the firing pass each server runs in a loop.

Fire times are computed here (a cron expression needs cronsim; an interval is
arithmetic); the engine keeps the schedules and submits the firings
(service/schema/85_schedules.sql), in the firing pass's transaction."""

from __future__ import annotations

import itertools
import logging
import zoneinfo
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta

from cronsim import CronSim

from cyclone import dag
from service.db import Database
from service.db.schedules import DueSchedule, FirePlan
from service.metrics import Metrics

#: The nodes to store for a schedule whose nodes still hold key templates
#: (service.api.schedule.keyed).
Keyed = Callable[[DueSchedule], Awaitable[list[dag.NodeSpec]]]

log = logging.getLogger("cyclone")


#: A firing is missed when a server gets to it more than this late (downtime, or every
#: server too busy); the catch-up policy decides what becomes of it.
MISSED_AFTER = timedelta(seconds=15)

#: CATCH_UP_POLICY_ALL makes up at most this many missed firings of a schedule (the
#: most recent); older ones are skipped.
CATCH_UP_LIMIT = 100

#: Missed firings older than the CATCH_UP_LIMIT most recent are counted exactly for an
#: interval, and up to this many for a cron expression, whose fire times are found one
#: by one: a long outage costs a pass a bounded amount of work.
MISSED_COUNT_LIMIT = 1000

#: Most firings of one schedule one pass submits; the rest wait for the next pass.
FIRINGS_PER_PASS = 20

#: Most schedules one pass fires (one transaction); a full pass is followed by another.
SCHEDULES_PER_PASS = 100

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_SECOND = timedelta(seconds=1)


class When:
    """A schedule's fire times: a cron expression in a time zone, or an interval (the
    multiples of it since the Unix epoch). Fire times are whole seconds, in UTC, and
    are only ever computed forward, unique and strictly increasing.

    A cron expression matches local wall times, read on a plain calendar (cronsim on
    naive datetimes, which knows no time zone). Each becomes an instant in the zone:
    a wall time that happens twice (the clock goes back) fires at its first
    occurrence only; wall times the clock skips (it jumps forward) fire once, at the
    first instant after the jump, whatever the size of the jump (an hour, 30
    minutes, a whole day). docs/schedules.md states these rules."""

    def __init__(self, cron: str | None, time_zone: str | None, interval_s: int | None):
        self.cron = cron
        self.interval_s = interval_s
        self.zone = zoneinfo.ZoneInfo(time_zone) if cron is not None and time_zone else UTC

    def after(self, t: datetime) -> datetime:
        """The first fire time strictly after ``t``."""
        return next(self.times_from(t.replace(microsecond=0) + _SECOND))

    def times_from(self, start: datetime) -> Iterator[datetime]:
        """The fire times at or after ``start``, ascending (a cron expression's end
        after 50 years without a match)."""
        if self.interval_s is not None:
            step = timedelta(seconds=self.interval_s)
            first = -((_EPOCH - start) // step)  # the multiples of step at or after start
            return (_EPOCH + k * step for k in itertools.count(first))
        return self._cron_from(start)

    def _cron_from(self, start: datetime) -> Iterator[datetime]:
        assert self.cron is not None
        # The wall times from the one the clock showed just before start: a time the
        # clock skipped just before start fires at start, the end of that jump.
        begin = (start - _SECOND).astimezone(self.zone).replace(tzinfo=None, microsecond=0)
        due = start  # the earliest instant still to yield
        for wall in CronSim(self.cron, begin):
            t = self._instant(wall)
            if t >= due:  # not before start, and not an instant yielded already
                yield t
                due = t + _SECOND

    def _instant(self, wall: datetime) -> datetime:
        """When the zone's clock first shows ``wall`` (a naive datetime); if it never
        does (the clock jumps over it), the first instant after the jump."""
        at = wall.replace(tzinfo=self.zone, fold=0).astimezone(UTC)
        if at.astimezone(self.zone).replace(tzinfo=None) == wall:
            return at  # fold=0: the first of two occurrences, if there are two
        # Skipped. Read with the offsets from either side of the jump, the wall time
        # gives an instant before the jump and one after it; the jump is the first
        # second between them at which the clock shows a time later than the wall.
        other = wall.replace(tzinfo=self.zone, fold=1).astimezone(UTC)
        before, after = sorted((_since_epoch(at), _since_epoch(other)))
        while after - before > 1:
            mid = (before + after) // 2
            shown = (_EPOCH + timedelta(seconds=mid)).astimezone(self.zone)
            if shown.replace(tzinfo=None) > wall:
                after = mid
            else:
                before = mid
        return _EPOCH + timedelta(seconds=after)

    def due(self, first: datetime, now: datetime) -> tuple[list[datetime], int]:
        """The fire times from ``first`` to ``now``: the CATCH_UP_LIMIT most recent,
        ascending, and how many older ones there are (for a cron expression, counted
        up to MISSED_COUNT_LIMIT). Bounded work whatever the gap between the two."""
        if self.interval_s is not None:
            step = timedelta(seconds=self.interval_s)
            low, high = -((_EPOCH - first) // step), (now - _EPOCH) // step
            kept = max(0, min(CATCH_UP_LIMIT, high - low + 1))
            older = max(0, high - low + 1 - kept)
            return [_EPOCH + k * step for k in range(high - kept + 1, high + 1)], older
        walked = self._walk(first, now, MISSED_COUNT_LIMIT + CATCH_UP_LIMIT + 1)
        if len(walked) <= MISSED_COUNT_LIMIT + CATCH_UP_LIMIT:  # all of them: exact
            return walked[-CATCH_UP_LIMIT:], max(0, len(walked) - CATCH_UP_LIMIT)
        return self._latest(first, now), MISSED_COUNT_LIMIT

    def _walk(self, start: datetime, end: datetime, cap: int) -> list[datetime]:
        """The fire times from ``start`` to ``end``, at most the ``cap`` first."""
        within = itertools.takewhile(lambda t: t <= end, self.times_from(start))
        return list(itertools.islice(within, cap))

    def _latest(self, first: datetime, now: datetime) -> list[datetime]:
        """The CATCH_UP_LIMIT most recent fire times from ``first`` to ``now``, when
        there are more than that: walked forward from a start found near ``now``, by
        windows of whole seconds back from it, doubled, then halved, each walk capped.
        Widening a window by a second adds at most one fire time, so the search finds
        one that holds more than CATCH_UP_LIMIT and fewer than the cap."""
        need, cap = CATCH_UP_LIMIT + 1, 4 * (CATCH_UP_LIMIT + 1)

        def walk(width: int) -> list[datetime]:
            return self._walk(max(first, now - timedelta(seconds=width)), now, cap)

        narrow, wide = 0, need  # [now - narrow, now] holds fewer than need
        got = walk(wide)
        while len(got) < need:  # ends: the whole range from first holds more than cap
            narrow, wide = wide, 2 * wide
            got = walk(wide)
        while len(got) >= cap:  # stopped at its cap before now: a narrower window
            mid = (narrow + wide) // 2
            probe = walk(mid)
            if len(probe) < need:
                narrow = mid
            else:
                wide, got = mid, probe
        return got[-CATCH_UP_LIMIT:]


def _since_epoch(t: datetime) -> int:
    """Whole seconds from the epoch to ``t``, rounded down."""
    return int((t - _EPOCH) // timedelta(seconds=1))


def plan(schedule: DueSchedule) -> FirePlan:
    """What a pass does with a due schedule: the due fire times from its next_fire_at
    to now, walked forward, the CATCH_UP_LIMIT most recent at most (older ones are
    missed); those missed (more than MISSED_AFTER late) dropped unless the policy is
    to catch up; FIRINGS_PER_PASS of them submitted, oldest first, the schedule then
    due at the first one left, or at its first fire time after now."""
    when = When(schedule.cron, schedule.time_zone, schedule.interval_s)
    now = schedule.now
    due, older = when.due(schedule.next_fire_at, now)
    fire = due if schedule.catch_up == "all" else [t for t in due if now - t <= MISSED_AFTER]
    missed = older + len(due) - len(fire)
    if len(fire) > FIRINGS_PER_PASS:
        return FirePlan(fire[:FIRINGS_PER_PASS], missed, fire[FIRINGS_PER_PASS])
    return FirePlan(fire, missed, when.after(now))


async def fire_due(db: Database, metrics: Metrics, keyed: Keyed) -> int:
    """Fire every due schedule, a transaction per SCHEDULES_PER_PASS; returns how many
    firings submitted a run. Bounded: a schedule fired is due again only at a later
    fire time, or with firings left to catch up (at most CATCH_UP_LIMIT), so passes
    stop once none is due, or after 50."""
    submitted = 0
    for _ in range(50):
        fires = await db.schedules.schedules_fire(plan, SCHEDULES_PER_PASS, keyed)
        for name, fired in fires.fired:
            metrics.schedule_firings.labels(name, fired.outcome).inc()
            extra = {"schedule": name, "run_id": str(fired.run_id or "")}
            when = fired.fire_at.isoformat()
            if fired.outcome == "submitted":
                submitted += 1
                log.info("schedule %s fired for %s: run %s", name, when, fired.run_id, extra=extra)
            elif fired.outcome == "existing":
                log.info(
                    "schedule %s: the firing for %s had its run %s already",
                    name,
                    when,
                    fired.run_id,
                    extra=extra,
                )
            else:
                log.info(
                    "schedule %s: firing for %s skipped, its last run is still running",
                    name,
                    when,
                    extra=extra,
                )
        for name, missed in fires.missed.items():
            metrics.schedule_firings.labels(name, "missed").inc(missed)
            log.warning(
                "schedule %s: %d missed firing(s) skipped", name, missed, extra={"schedule": name}
            )
        for name, error in fires.failed.items():
            metrics.schedule_firings.labels(name, "failed").inc()
            log.error(
                "schedule %s could not fire (tried again at the next pass): %s",
                name,
                error,
                extra={"schedule": name},
            )
        if (fires.due < SCHEDULES_PER_PASS or fires.failed) and not fires.more:
            break
    return submitted
