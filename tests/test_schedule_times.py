"""Fire times and the firing plan (service.engine.schedules), without a server: cron in a
time zone across daylight saving changes, intervals, catch-up and its bounds."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from service.db.schedules import DueSchedule
from service.engine.schedules import CATCH_UP_LIMIT, FIRINGS_PER_PASS, MISSED_AFTER, When, plan


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_cron_in_a_zone_across_daylight_saving_changes():
    paris = When("30 2 * * *", "Europe/Paris", None)
    # 2026-03-29: 02:00 becomes 03:00 in Paris; 02:30 does not exist and fires at 03:00.
    assert paris.after(utc(2026, 3, 28, 12)) == utc(2026, 3, 29, 1, 0)
    assert paris.after(utc(2026, 3, 29, 12)) == utc(2026, 3, 30, 0, 30)  # 02:30 CEST
    # 2026-10-25: 03:00 becomes 02:00; 02:30 happens twice and fires once.
    first = paris.after(utc(2026, 10, 24, 12))
    assert first == utc(2026, 10, 25, 0, 30)  # 02:30 CEST, the first of the two
    assert paris.after(first) == utc(2026, 10, 26, 1, 30)  # 02:30 CET the next day


def test_the_rules_of_docs_schedules_md_for_frequent_expressions():
    def paris(cron: str, start: datetime, n: int) -> list[str]:
        times = itertools.islice(When(cron, "Europe/Paris", None).times_from(start), n)
        return [t.astimezone(ZoneInfo("Europe/Paris")).strftime("%H:%M%z") for t in times]

    # 02:00 becomes 03:00: the skipped times fire once, at 03:00, with 03:00 itself.
    assert paris("*/15 2 * * *", utc(2026, 3, 28, 12), 2) == ["03:00+0200", "02:00+0200"]
    assert paris("*/15 2,3 * * *", utc(2026, 3, 29), 3) == [
        "03:00+0200",
        "03:15+0200",
        "03:30+0200",
    ]
    # 03:00 becomes 02:00: the first of the two 02:00 to 02:59 fires, not the second.
    assert paris("*/15 * * * *", utc(2026, 10, 25, 0), 6) == [
        "02:00+0200", "02:15+0200", "02:30+0200", "02:45+0200", "03:00+0100", "03:15+0100",
    ]  # fmt: skip


def test_times_from_a_start_include_it_and_go_forward():
    when = When("*/15 * * * *", "America/New_York", None)
    assert list(itertools.islice(when.times_from(utc(2026, 1, 1, 12, 0)), 3)) == [
        utc(2026, 1, 1, 12, 0),
        utc(2026, 1, 1, 12, 15),
        utc(2026, 1, 1, 12, 30),
    ]
    assert next(when.times_from(utc(2026, 1, 1, 12, 0, 0, 1))) == utc(2026, 1, 1, 12, 15)
    assert when.after(utc(2026, 1, 1, 12, 0)) == utc(2026, 1, 1, 12, 15)


def test_interval_fire_times_are_multiples_since_the_epoch():
    hourly = When(None, None, 3600)
    assert hourly.after(utc(2026, 1, 1, 12, 0, 0)) == utc(2026, 1, 1, 13)
    assert hourly.after(utc(2026, 1, 1, 12, 59, 59)) == utc(2026, 1, 1, 13)
    assert next(hourly.times_from(utc(2026, 1, 1, 13, 0, 0))) == utc(2026, 1, 1, 13)
    assert next(hourly.times_from(utc(2026, 1, 1, 12, 0, 0, 1))) == utc(2026, 1, 1, 13)


def due(now: datetime, next_fire_at: datetime, catch_up: str, every: int = 60) -> DueSchedule:
    return DueSchedule(now, "s", None, None, every, catch_up, next_fire_at)


def test_skip_fires_what_is_on_time_and_drops_what_was_missed():
    now = utc(2026, 1, 1, 12, 0, 5)
    p = plan(due(now, utc(2026, 1, 1, 11, 0), "skip"))
    assert p.fire_times == [utc(2026, 1, 1, 12, 0)]  # 5 s late: on time
    assert p.missed == 60
    assert p.next_fire_at == utc(2026, 1, 1, 12, 1)
    late = plan(due(now + MISSED_AFTER, utc(2026, 1, 1, 12, 0), "skip"))
    assert (late.fire_times, late.missed) == ([], 1)


def test_catch_up_fires_each_missed_firing_in_passes_and_is_bounded():
    now = utc(2026, 1, 1, 12, 0, 0, 500000)
    p = plan(due(now, utc(2026, 1, 1, 11, 0), "all"))
    assert p.fire_times == [utc(2026, 1, 1, 11, i) for i in range(FIRINGS_PER_PASS)]
    assert p.next_fire_at == utc(2026, 1, 1, 11, FIRINGS_PER_PASS)  # the next pass goes on
    assert p.missed == 0
    years = plan(due(now, utc(2025, 1, 1), "all", every=1))
    # Beyond the bound: counted (arithmetic for an interval), not enumerated.
    every_second_of_a_year = (now.replace(microsecond=0) - utc(2025, 1, 1)).total_seconds() + 1
    assert years.missed == every_second_of_a_year - CATCH_UP_LIMIT
    assert years.fire_times[0] == now.replace(microsecond=0) - timedelta(seconds=CATCH_UP_LIMIT - 1)
