"""Cron fire times across changes of a zone's offset, in every zone of the tz database,
against a brute-force reading of the rules of docs/schedules.md: step through UTC
minute by minute (second by second for an expression with seconds), read the zone's
wall clock, and fire at each instant whose wall time matches, the first time the clock
shows it (fold 0), and once at the end of each jump of the clock over a matching time.

Zones that read the same wall time at every instant of the years checked (same
offsets, same changes) share one brute-force enumeration; every zone is planned and
compared."""

from __future__ import annotations

import functools
import itertools
import zoneinfo
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from service.db.schedules import DueSchedule
from service.engine.schedules import (
    CATCH_UP_LIMIT,
    FIRINGS_PER_PASS,
    MISSED_COUNT_LIMIT,
    When,
    plan,
)

FROM, TO = datetime(2026, 12, 1, tzinfo=UTC), datetime(2028, 1, 1, tzinfo=UTC)
#: The window checked around each change of offset (and around the middle of the
#: period for a zone without one), by the step of the brute force.
AROUND = {60: timedelta(hours=2, minutes=30), 1: timedelta(minutes=40)}

EXPRESSIONS = [
    "*/15 2 * * *",  # four times in the hour that most changes skip or repeat
    "30 1 * * *",  # in the repeated half hour of Lord Howe
    "*/15 1 * * *",  # twice in it, and on either side of it
    "45 2 * * *",  # in Chatham's repeated and skipped hour (02:45 to 03:45)
    "0 * * * *",
    "*/7 * * * *",
    "45 2 * * 0",  # Sundays, the day most changes fall on
    "0 0 * * *",  # midnight, which some zones skip (America/Santiago, Asia/Beirut)
    "0 0 1 * *",
    "15,45 0-3 1-7 * 0,5,6",  # lists, ranges, day of month or day of week
    "0,30 */10 * * * *",  # seconds
]


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# The brute force ------------------------------------------------------------------


def field(text: str, low: int, high: int) -> set[int]:
    """The values a cron field matches: lists of *, n, a-b, each with an optional /step."""
    values: set[int] = set()
    for part in text.split(","):
        spec, _, step = part.partition("/")
        if spec == "*":
            first, last = low, high
        elif "-" in spec:
            first, last = (int(x) for x in spec.split("-"))
        else:
            first = int(spec)
            last = high if step else first
        values.update(range(first, last + 1, int(step or 1)))
    return values


def matcher(expr: str) -> Callable[[datetime], bool]:
    """Whether a wall time (naive) matches ``expr``: five fields, or six with seconds
    first; day of month and day of week both restricted means either (Debian cron)."""
    parts = expr.split()
    if len(parts) == 5:
        parts.insert(0, "0")
    sec, minute, hour, dom, month, dow = parts
    s, m, h = field(sec, 0, 59), field(minute, 0, 59), field(hour, 0, 23)
    d, mo = field(dom, 1, 31), field(month, 1, 12)
    w = {x % 7 for x in field(dow, 0, 7)}
    either = not dom.startswith("*") and not dow.startswith("*")

    def matches(wall: datetime) -> bool:
        if wall.second not in s or wall.minute not in m or wall.hour not in h:
            return False
        if wall.month not in mo:
            return False
        on_dom, on_dow = wall.day in d, wall.isoweekday() % 7 in w
        return (on_dom or on_dow) if either else (on_dom and on_dow)

    return matches


def brute_force(expr: str, zone: zoneinfo.ZoneInfo, start: datetime, end: datetime) -> list:
    """The fire times from ``start`` to ``end`` (whole minutes), instant by instant."""
    matches = matcher(expr)
    step = timedelta(seconds=1 if len(expr.split()) == 6 else 60)
    fires = []
    before = (start - step).astimezone(zone).replace(tzinfo=None)
    t = start
    while t <= end:
        local = t.astimezone(zone)
        wall = local.replace(tzinfo=None)
        fire = local.fold == 0 and matches(wall)
        skipped = before + step
        while not fire and skipped < wall:  # the clock jumped over these
            fire = matches(skipped)
            skipped += step
        if fire:
            fires.append(t)
        before = wall
        t += step
    return fires


def changes(zone: zoneinfo.ZoneInfo) -> tuple[datetime, ...]:
    """The instants from FROM to TO at which the zone's offset changes (found day by
    day, then to the second)."""
    found = []
    day = FROM
    while day < TO:
        nxt = day + timedelta(days=1)
        if day.astimezone(zone).utcoffset() != nxt.astimezone(zone).utcoffset():
            low, high = int(day.timestamp()), int(nxt.timestamp())
            while high - low > 1:
                mid = (low + high) // 2
                moved = datetime.fromtimestamp(mid, UTC).astimezone(zone).utcoffset()
                if moved == day.astimezone(zone).utcoffset():
                    low = mid
                else:
                    high = mid
            found.append(datetime.fromtimestamp(high, UTC))
        day = nxt
    return tuple(found)


@functools.cache
def zones() -> dict[str, tuple[tuple, tuple[datetime, ...]]]:
    """Every zone: its key (offset at FROM, and each change with the offset after it),
    and the instants of its changes."""
    out = {}
    for name in sorted(zoneinfo.available_timezones()):
        zone = zoneinfo.ZoneInfo(name)
        moved = changes(zone)
        key = (
            FROM.astimezone(zone).utcoffset(),
            tuple((t, t.astimezone(zone).utcoffset()) for t in moved),
        )
        out[name] = (key, moved)
    return out


_expected: dict[tuple, list[datetime]] = {}


def expected(expr: str, name: str, start: datetime, end: datetime) -> list[datetime]:
    key = zones()[name][0]
    if (expr, key, start) not in _expected:
        _expected[expr, key, start] = brute_force(expr, zoneinfo.ZoneInfo(name), start, end)
    return _expected[expr, key, start]


def windows(name: str, expr: str) -> Iterator[tuple[datetime, datetime]]:
    around = AROUND[1 if len(expr.split()) == 6 else 60]
    for t in zones()[name][1] or (utc(2027, 7, 1),):
        yield t - around, t + around


def caught_up(expr: str, name: str, next_fire_at: datetime, now: datetime) -> tuple[list, int]:
    """Every firing the passes of a catch_up all schedule submit, from ``next_fire_at``
    until ``now``, and how many they count as missed; stops at a pass the database
    would refuse (cyclone.schedule_fire: fire times that do not go forward)."""
    fired: list[datetime] = []
    missed = 0
    while next_fire_at <= now:
        p = plan(DueSchedule(now, "s", expr, name, None, "all", next_fire_at))
        times = [next_fire_at - timedelta(microseconds=1), *p.fire_times, p.next_fire_at]
        if (
            len(p.fire_times) > FIRINGS_PER_PASS
            or p.next_fire_at <= next_fire_at
            or any(a >= b for a, b in itertools.pairwise(times))
        ):
            return [*fired, *p.fire_times, "refused"], missed
        fired += p.fire_times
        missed += p.missed
        next_fire_at = p.next_fire_at
    return fired, missed


# The property ---------------------------------------------------------------------


def strictly_increasing_whole_seconds(times: list[datetime]) -> bool:
    return all(t.microsecond == 0 and t.tzinfo == UTC for t in times) and all(
        a < b for a, b in itertools.pairwise(times)
    )


@pytest.mark.parametrize("expr", EXPRESSIONS)
def test_every_zone_fires_as_the_brute_force_across_its_changes(expr):
    assert sum(1 for _, moved in zones().values() if moved) > 50  # a tz database is there
    wrong = []
    for name in zones():
        when = When(expr, name, None)
        for start, end in windows(name, expr):
            want = expected(expr, name, start, end)
            assert strictly_increasing_whole_seconds(want)
            # Forward, from the start of the window (how next_fire_at is set).
            got = []
            t = start - timedelta(seconds=1)
            while (t := when.after(t)) <= end and len(got) <= len(want):
                got.append(t)
            # A catch-up from the start of the window to its end.
            fired, missed = caught_up(expr, name, start, end)
            if (
                got != want
                or fired != want[-CATCH_UP_LIMIT:]
                or missed != max(0, len(want) - CATCH_UP_LIMIT)
                or not strictly_increasing_whole_seconds(got)
            ):
                wrong.append((name, start, want, got, fired, missed))
    assert not wrong, f"{len(wrong)} windows wrong, the first: {wrong[:2]}"


# Regressions: the zones whose changes are not whole hours at 02:00 ----------------


def local(times: list[datetime], zone: str) -> list[str]:
    return [t.astimezone(zoneinfo.ZoneInfo(zone)).strftime("%d %H:%M%z") for t in times]


def test_chatham_catches_up_each_missed_firing_once_across_its_change():
    # 2027-04-04 03:45 (+13:45) becomes 02:45 (+12:45): 02:45 happens twice.
    p = plan(
        DueSchedule(
            utc(2027, 4, 4, 15), "s", "*/15 2 * * *", "Pacific/Chatham", None, "all",
            utc(2027, 4, 2, 12, 15),
        )
    )  # fmt: skip
    assert local(p.fire_times, "Pacific/Chatham") == [
        "03 02:00+1345", "03 02:15+1345", "03 02:30+1345", "03 02:45+1345",
        "04 02:00+1345", "04 02:15+1345", "04 02:30+1345", "04 02:45+1345",
        "05 02:00+1245", "05 02:15+1245", "05 02:30+1245", "05 02:45+1245",
    ]  # fmt: skip
    assert p.fire_times[4:8] == [utc(2027, 4, 3, 12, 15 * i) for i in range(1, 4)] + [
        utc(2027, 4, 3, 13)
    ]
    assert (p.missed, p.next_fire_at) == (0, utc(2027, 4, 5, 13, 15))  # 06 02:00+1245


def test_chatham_fires_its_skipped_hour_once_at_the_end_of_the_jump():
    # 2027-09-26 02:45 (+12:45) becomes 03:45 (+13:45): 02:45 to 03:44 are skipped.
    want = ["26 02:00+1245", "26 02:15+1245", "26 02:30+1245", "26 03:45+1345"]
    p = plan(
        DueSchedule(
            utc(2027, 9, 25, 16), "s", "*/15 2,3 * * *", "Pacific/Chatham", None, "all",
            utc(2027, 9, 25, 12),
        )
    )  # fmt: skip
    assert (local(p.fire_times, "Pacific/Chatham"), p.missed) == (want, 0)
    assert local([p.next_fire_at], "Pacific/Chatham") == ["27 02:00+1345"]
    assert When("45 2 * * *", "Pacific/Chatham", None).after(utc(2027, 9, 25)) == p.fire_times[-1]
    # Hourly: 03:00 is skipped, and fires at 03:45.
    hourly = When("0 * * * *", "Pacific/Chatham", None)
    assert hourly.after(utc(2027, 9, 25, 13, 15)) == p.fire_times[-1]


def test_lord_howe_fires_its_repeated_half_hour_once():
    # 2027-04-04 02:00 (+11) becomes 01:30 (+10:30): 01:30 to 01:59 happen twice.
    when = When("*/15 1 * * *", "Australia/Lord_Howe", None)
    t, got = utc(2027, 4, 3, 12), []
    while (t := when.after(t)) < utc(2027, 4, 4, 12):
        got.append(t)
    want = ["04 01:00+1100", "04 01:15+1100", "04 01:30+1100", "04 01:45+1100"]
    assert local(got, "Australia/Lord_Howe") == want
    p = plan(
        DueSchedule(
            utc(2027, 4, 4), "s", "*/15 1 * * *", "Australia/Lord_Howe", None, "all",
            utc(2027, 4, 3, 12),
        )
    )  # fmt: skip
    assert (local(p.fire_times, "Australia/Lord_Howe"), p.missed) == (want, 0)
    # And 02:00 to 02:45, after the repeat, each fire.
    two = When("*/15 2 * * *", "Australia/Lord_Howe", None)
    t, got = utc(2027, 4, 3, 12), []
    while (t := two.after(t)) < utc(2027, 4, 4, 12):
        got.append(t)
    assert local(got, "Australia/Lord_Howe") == [
        "04 02:00+1030", "04 02:15+1030", "04 02:30+1030", "04 02:45+1030",
    ]  # fmt: skip


def test_lord_howe_fires_its_skipped_half_hour_once_at_02_30():
    # 2027-10-03 02:00 (+10:30) becomes 02:30 (+11): 02:00 to 02:29 are skipped.
    p = plan(
        DueSchedule(
            utc(2027, 10, 2, 18), "s", "*/15 1,2 * * *", "Australia/Lord_Howe", None, "all",
            utc(2027, 10, 2, 13),
        )
    )  # fmt: skip
    assert local(p.fire_times, "Australia/Lord_Howe") == [
        "03 01:00+1030", "03 01:15+1030", "03 01:30+1030", "03 01:45+1030",
        "03 02:30+1100", "03 02:45+1100",
    ]  # fmt: skip
    hourly = When("0 * * * *", "Australia/Lord_Howe", None)
    assert local([hourly.after(utc(2027, 10, 2, 14, 45))], "Australia/Lord_Howe") == [
        "03 02:30+1100"
    ]


# The catch-up's bound ---------------------------------------------------------------


def test_a_cron_down_for_a_year_plans_its_latest_firings_with_bounded_work():
    every_second = plan(
        DueSchedule(
            utc(2027, 6, 1, 12, 0, 0) + timedelta(microseconds=500000), "s", "* * * * * *",
            "Europe/Paris", None, "all", utc(2026, 6, 1),
        )
    )  # fmt: skip
    assert every_second.fire_times == [
        utc(2027, 6, 1, 11, 58, 21) + timedelta(seconds=i) for i in range(FIRINGS_PER_PASS)
    ]
    assert every_second.missed == MISSED_COUNT_LIMIT  # counted up to the limit
    # Dense on one day a month: the latest hundred are the last minutes of June 1st.
    first_days = plan(
        DueSchedule(
            utc(2027, 6, 15), "s", "* * 1 * *", "Europe/Paris", None, "all", utc(2027, 1, 1)
        )
    )
    assert local(first_days.fire_times[:1], "Europe/Paris") == ["01 22:20+0200"]
    assert first_days.next_fire_at == utc(2027, 6, 1, 20, 40)  # 22:40 Paris
    assert first_days.missed == MISSED_COUNT_LIMIT
    # A backlog within the limit is counted exactly.
    hours = plan(
        DueSchedule(
            utc(2027, 6, 15), "s", "0 * * * *", "Europe/Paris", None, "skip", utc(2027, 5, 1)
        )
    )
    assert (hours.fire_times, hours.missed) == ([utc(2027, 6, 15)], 45 * 24)
