"""Schedules kept by the server: the RPCs, validation, and the firing pass (catch-up,
overlap, pause) on the engine's clock (RunningServer.advance_clock), not real time."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import grpc
import psycopg
import pytest

from cyclone.v1 import schedule_service_pb2 as pb
from tests.helpers import claim, complete, node, rpc_error, seconds, value, workflow


def schedule(
    name: str = "tick",
    *,
    cron: str | None = None,
    zone: str = "",
    every: float | None = None,
    overlap: int = pb.OVERLAP_POLICY_ALLOW,
    catch_up: int = pb.CATCH_UP_POLICY_SKIP,
    paused: bool = False,
    input: object = None,
) -> pb.Schedule:
    s = pb.Schedule(
        name=name,
        workflow=workflow("report", node("build", action="build")),
        overlap=overlap,
        catch_up=catch_up,
        paused=paused,
        time_zone=zone,
    )
    if cron is not None:
        s.cron = cron
    if every is not None:
        s.interval.CopyFrom(seconds(every))
    if input is not None:
        s.input.CopyFrom(value(input))
    return s


def create(server, s: pb.Schedule) -> pb.Schedule:
    return server.schedules.CreateSchedule(pb.CreateScheduleRequest(schedule=s)).schedule


def runs_of(server, name: str = "tick") -> list[tuple[str, str]]:
    """(submit_key, status) of the runs a schedule submitted, oldest first."""
    return server.sql(
        "SELECT submit_key, status FROM cyclone.runs WHERE submit_key LIKE %s ORDER BY submit_key",
        f"schedule:{name}:%",
    )


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def db_now(server) -> datetime:
    return server.sql("SELECT cyclone.now()")[0][0]


def to_next_firing(server, name: str = "tick") -> None:
    """Move the engine's clock just past the schedule's next fire time."""
    [(due,)] = server.sql("SELECT next_fire_at FROM cyclone.schedules WHERE name = %s", name)
    server.advance_clock((due - db_now(server)).total_seconds() + 0.01)


def test_create_get_list_pause_resume_delete(cyclone_server):
    made = create(cyclone_server, schedule(cron="0 9 * * 1-5", zone="Europe/Paris", input=[1]))
    assert made.cron == "0 9 * * 1-5" and made.time_zone == "Europe/Paris"
    assert made.overlap == pb.OVERLAP_POLICY_ALLOW and not made.paused
    nxt = made.next_fire_at.ToDatetime(tzinfo=UTC)
    local = nxt.astimezone(ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute, local.weekday() < 5) == (9, 0, True)
    assert nxt > db_now(cyclone_server)

    got = cyclone_server.schedules.GetSchedule(pb.GetScheduleRequest(name="tick")).schedule
    assert got == made
    assert got.workflow.nodes[0].action == "build"

    create(cyclone_server, schedule("a-first", every=60))
    listed = cyclone_server.schedules.ListSchedules(pb.ListSchedulesRequest(page_size=1))
    assert [s.name for s in listed.schedules] == ["a-first"]
    rest = cyclone_server.schedules.ListSchedules(
        pb.ListSchedulesRequest(page_size=1, page_token=listed.next_page_token)
    )
    assert [s.name for s in rest.schedules] == ["tick"] and rest.next_page_token == ""

    paused = cyclone_server.schedules.PauseSchedule(pb.PauseScheduleRequest(name="tick"))
    assert paused.schedule.paused
    resumed = cyclone_server.schedules.ResumeSchedule(pb.ResumeScheduleRequest(name="tick"))
    assert not resumed.schedule.paused

    cyclone_server.schedules.DeleteSchedule(pb.DeleteScheduleRequest(name="tick"))
    err = rpc_error(cyclone_server.schedules.GetSchedule, pb.GetScheduleRequest(name="tick"))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = rpc_error(cyclone_server.schedules.DeleteSchedule, pb.DeleteScheduleRequest(name="tick"))
    assert err.code() == grpc.StatusCode.NOT_FOUND


def test_a_second_schedule_with_the_name_already_exists(cyclone_server):
    create(cyclone_server, schedule(every=60))
    err = rpc_error(
        cyclone_server.schedules.CreateSchedule,
        pb.CreateScheduleRequest(schedule=schedule(every=5)),
    )
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    [(interval,)] = cyclone_server.sql("SELECT interval_s FROM cyclone.schedules")
    assert interval == 60


def _without_workflow() -> pb.Schedule:
    s = schedule(every=60)
    s.ClearField("workflow")
    return s


def _bad_workflow() -> pb.Schedule:
    s = schedule(every=60)
    s.workflow.nodes[0].depends_on.append("ghost")
    return s


HOSTILE = [
    (schedule(), "cron expression or an interval"),
    (schedule(cron="61 * * * *"), "Bad minute"),
    (schedule(cron="* * *"), "Wrong number of fields"),
    (schedule(cron="0 0 31 2 *"), "cron"),
    (schedule(cron="x" * 300), "cron must be"),
    (schedule(cron="* * * * *\x00"), "cron must be"),
    (schedule(cron="* * * * *", zone="Mars/Olympus"), "unknown time_zone"),
    (schedule(cron="* * * * *", zone="../../etc/passwd"), "unknown time_zone"),
    (schedule(every=60, zone="UTC"), "time_zone applies to cron only"),
    (schedule(every=0.5), "interval must be whole seconds"),
    (schedule(every=1.5), "interval must be whole seconds"),
    (schedule(every=-5), "interval must be whole seconds"),
    (schedule(every=400 * 86400), "interval must be whole seconds"),
    (schedule("bad name", every=60), "schedule name"),
    (schedule("", every=60), "schedule name"),
    (schedule("x" * 200, every=60), "schedule name"),
    (schedule(every=60, overlap=7), "overlap"),
    (schedule(every=60, catch_up=9), "catch_up"),
    (_without_workflow(), "workflow is required"),
    (_bad_workflow(), "unknown node 'ghost'"),
]


@pytest.mark.parametrize(("s", "message"), HOSTILE)
def test_hostile_schedules_are_invalid_and_leave_nothing(cyclone_server, s, message):
    err = rpc_error(cyclone_server.schedules.CreateSchedule, pb.CreateScheduleRequest(schedule=s))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert message in err.details()
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.schedules") == [(0,)]


@pytest.mark.parametrize(
    "call",
    ["GetSchedule", "PauseSchedule", "ResumeSchedule", "DeleteSchedule"],
)
def test_hostile_names_are_invalid(cyclone_server, call):
    request = getattr(pb, f"{call}Request")(name="x'; DROP TABLE cyclone.schedules; --")
    err = rpc_error(getattr(cyclone_server.schedules, call), request)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_hostile_pages_are_invalid(cyclone_server):
    for request in (
        pb.ListSchedulesRequest(page_size=1001),
        pb.ListSchedulesRequest(page_size=-1),
        pb.ListSchedulesRequest(page_token="not a name!"),
    ):
        err = rpc_error(cyclone_server.schedules.ListSchedules, request)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_due_interval_schedule_submits_one_run_keyed_by_its_fire_time(cyclone_server):
    # A schedule made in the last moments of a minute would be due at once.
    to_minute = 60 - db_now(cyclone_server).timestamp() % 60
    if to_minute < 5:
        time.sleep(to_minute + 0.1)
    made = create(cyclone_server, schedule(every=60, input={"k": 1}))
    assert cyclone_server.fire_schedules() == 0  # not due yet
    to_next_firing(cyclone_server)
    assert cyclone_server.fire_schedules() == 1
    assert cyclone_server.fire_schedules() == 0  # fired once
    fire_at = made.next_fire_at.ToDatetime(tzinfo=UTC)
    assert fire_at.timestamp() % 60 == 0  # multiples of the interval since the epoch
    key = f"schedule:tick:{fire_at:%Y-%m-%dT%H:%M:%SZ}"
    [(run_id, workflow_name, input)] = cyclone_server.sql(
        "SELECT run_id, workflow, input FROM cyclone.runs WHERE submit_key = %s", key
    )
    assert (workflow_name, input) == ("report", {"k": 1})
    got = cyclone_server.schedules.GetSchedule(pb.GetScheduleRequest(name="tick")).schedule
    assert got.last_run_id == str(run_id)
    assert got.last_fire_at == made.next_fire_at
    assert got.next_fire_at.ToDatetime(tzinfo=UTC) == fire_at + timedelta(seconds=60)


def test_a_schedules_tags_are_shown_and_carried_by_each_run_it_submits(cyclone_server):
    s = schedule("tagged", every=60)
    s.tags.update({"team": "billing", "source": "nightly"})
    made = create(cyclone_server, s)
    assert dict(made.tags) == {"team": "billing", "source": "nightly"}
    got = cyclone_server.schedules.GetSchedule(pb.GetScheduleRequest(name="tagged")).schedule
    assert dict(got.tags) == dict(made.tags)
    listed = cyclone_server.schedules.ListSchedules(pb.ListSchedulesRequest()).schedules
    assert [dict(x.tags) for x in listed] == [dict(made.tags)]
    to_next_firing(cyclone_server, "tagged")
    assert cyclone_server.fire_schedules() == 1
    [(run_id, tags)] = cyclone_server.sql(
        "SELECT run_id, tags FROM cyclone.runs WHERE submit_key LIKE %s", "schedule:tagged:%"
    )
    assert tags == {"team": "billing", "source": "nightly"}
    # The run is found by its tags, as a submitted one is.
    found = cyclone_server.sql(
        "SELECT run_id FROM cyclone.run_tags WHERE key = 'source' AND value = 'nightly'"
    )
    assert found == [(run_id,)]


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ({f"k{i}": "v" for i in range(17)}, "17 tags"),
        ({"bad key!": "v"}, "tag key"),
        ({"k": "v" * 257}, "257 characters"),
        ({"k": "a\x00b"}, "NUL"),
    ],
)
def test_a_schedules_hostile_tags_are_invalid_and_leave_nothing(cyclone_server, tags, message):
    s = schedule(every=60)
    s.tags.update(tags)
    err = rpc_error(cyclone_server.schedules.CreateSchedule, pb.CreateScheduleRequest(schedule=s))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    assert message in err.details()
    assert cyclone_server.sql("SELECT count(*) FROM cyclone.schedules") == [(0,)]


def test_after_downtime_skip_drops_missed_firings_and_catch_up_submits_each(cyclone_server):
    create(cyclone_server, schedule("skipper", every=60))
    create(cyclone_server, schedule("catcher", every=60, catch_up=pb.CATCH_UP_POLICY_ALL))
    to_next_firing(cyclone_server, "catcher")
    cyclone_server.advance_clock(9 * 60 + 30)  # ten firings missed by every server
    assert cyclone_server.fire_schedules() == 10
    assert runs_of(cyclone_server, "skipper") == []
    caught = runs_of(cyclone_server, "catcher")
    assert len(caught) == 10
    times = [datetime.fromisoformat(k[len("schedule:catcher:") :]) for k, _ in caught]
    assert all(b - a == timedelta(seconds=60) for a, b in itertools.pairwise(times))
    # Both go on from their next fire time after now.
    now = db_now(cyclone_server)
    for name in ("skipper", "catcher"):
        got = cyclone_server.schedules.GetSchedule(pb.GetScheduleRequest(name=name)).schedule
        assert now < got.next_fire_at.ToDatetime(tzinfo=UTC) <= now + timedelta(seconds=60)


def test_catch_up_is_bounded(cyclone_server):
    # Hourly, so that no new firing comes due in real time while the passes run.
    create(cyclone_server, schedule(every=3600, catch_up=pb.CATCH_UP_POLICY_ALL))
    to_next_firing(cyclone_server)
    cyclone_server.advance_clock(999 * 3600 + 60)  # 1,000 missed firings
    cyclone_server.fire_schedules()  # in passes of 20, until none is due
    times = [datetime.fromisoformat(k[len("schedule:tick:") :]) for k, _ in runs_of(cyclone_server)]
    assert len(times) == 100
    # The most recent ones, one an hour.
    assert db_now(cyclone_server) - times[-1] < timedelta(hours=1)
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(times))


def test_a_firing_a_little_late_is_not_missed(cyclone_server):
    create(cyclone_server, schedule(every=60))
    to_next_firing(cyclone_server)
    cyclone_server.advance_clock(3)  # a busy server: 3 s late, within the 15 s grace
    assert cyclone_server.fire_schedules() == 1


def test_overlap_skip_submits_nothing_while_the_last_run_runs(cyclone_server):
    create(cyclone_server, schedule(every=60, overlap=pb.OVERLAP_POLICY_SKIP))
    to_next_firing(cyclone_server)
    assert cyclone_server.fire_schedules() == 1
    to_next_firing(cyclone_server)
    assert cyclone_server.fire_schedules() == 0  # the first run is still running
    assert [s for _, s in runs_of(cyclone_server)] == ["running"]
    [step] = claim(cyclone_server, "build")
    complete(cyclone_server, step)
    to_next_firing(cyclone_server)
    assert cyclone_server.fire_schedules() == 1
    assert [s for _, s in runs_of(cyclone_server)] == ["completed", "running"]


def test_overlap_allow_submits_every_firing(cyclone_server):
    create(cyclone_server, schedule(every=60, overlap=pb.OVERLAP_POLICY_ALLOW))
    for _ in range(3):
        to_next_firing(cyclone_server)
        assert cyclone_server.fire_schedules() == 1
    assert [s for _, s in runs_of(cyclone_server)] == ["running"] * 3


def test_a_paused_schedule_does_not_fire_and_resumes_from_now(cyclone_server):
    create(cyclone_server, schedule(every=60, catch_up=pb.CATCH_UP_POLICY_ALL, paused=True))
    cyclone_server.advance_clock(300)
    assert cyclone_server.fire_schedules() == 0
    resumed = cyclone_server.schedules.ResumeSchedule(pb.ResumeScheduleRequest(name="tick"))
    # The firings it would have had while paused are not made up.
    assert resumed.schedule.next_fire_at.ToDatetime(tzinfo=UTC) > db_now(cyclone_server)
    assert cyclone_server.fire_schedules() == 0
    to_next_firing(cyclone_server)
    assert cyclone_server.fire_schedules() == 1


def test_cron_fires_in_its_time_zone(cyclone_server):
    made = create(cyclone_server, schedule(cron="30 2 * * *", zone="Asia/Kolkata"))
    fire_at = made.next_fire_at.ToDatetime(tzinfo=UTC)
    assert (fire_at.hour, fire_at.minute) == (21, 0)  # 02:30 at UTC+05:30
    to_next_firing(cyclone_server)
    assert cyclone_server.fire_schedules() == 1
    assert runs_of(cyclone_server) == [(f"schedule:tick:{fire_at:%Y-%m-%dT%H:%M:%SZ}", "running")]


def test_catch_up_across_chathams_change_submits_each_missed_firing_once(cyclone_server):
    """Every server down across 2027-04-04 in Pacific/Chatham, where 03:45 (+13:45)
    becomes 02:45 (+12:45): 02:45 happens twice and fires once, the first time."""
    cyclone_server.advance_clock((utc(2027, 4, 2, 12) - db_now(cyclone_server)).total_seconds())
    made = create(
        cyclone_server,
        schedule(cron="*/15 2 * * *", zone="Pacific/Chatham", catch_up=pb.CATCH_UP_POLICY_ALL),
    )
    assert made.next_fire_at.ToDatetime(tzinfo=UTC) == utc(2027, 4, 2, 12, 15)  # 02:00 +13:45
    cyclone_server.advance_clock(2 * 86400 + 3 * 3600)  # to 2027-04-04 15:00Z
    assert cyclone_server.fire_schedules() == 12
    assert [k for k, _ in runs_of(cyclone_server)] == [
        f"schedule:tick:{t:%Y-%m-%dT%H:%M:%SZ}"
        for day, minutes in ((2, (15, 30, 45, 60)), (3, (15, 30, 45, 60)), (4, (75, 90, 105, 120)))
        for t in (utc(2027, 4, day, 12) + timedelta(minutes=m) for m in minutes)
    ]
    # And it goes on firing: at 02:00 (+12:45) the next day.
    got = cyclone_server.schedules.GetSchedule(pb.GetScheduleRequest(name="tick")).schedule
    assert got.next_fire_at.ToDatetime(tzinfo=UTC) == utc(2027, 4, 5, 13, 15)
    to_next_firing(cyclone_server)
    assert cyclone_server.fire_schedules() == 1
    assert len(runs_of(cyclone_server)) == 13


def test_a_schedule_another_server_holds_is_skipped_then_fired_once_its_holder_dies(
    server_factory, database_url
):
    """A server that dies in the middle of a pass: its transaction holds the schedule
    and has submitted the run; the other servers pass it by (SKIP LOCKED); when the
    holder's connection dies, its transaction rolls back and the next pass fires it."""
    held_by_a_dying_server(server_factory, database_url)


def held_by_a_dying_server(server_factory, database_url, first: str | None = None) -> None:
    """The test above; ``first``: a statement the holder runs before it locks the
    schedule, as a server does on Citus (tests/citus/test_citus.py)."""
    one, two = server_factory(), server_factory()
    create(one, schedule(every=60))
    to_next_firing(one)
    holder = psycopg.connect(database_url)
    if first is not None:
        assert holder.execute(first).fetchone() == (True,)
    holder.execute("SELECT * FROM cyclone.schedules WHERE name = 'tick' FOR UPDATE")
    [(due,)] = holder.execute("SELECT next_fire_at FROM cyclone.schedules").fetchall()
    holder.execute(
        "SELECT * FROM cyclone.schedule_fire('tick', ARRAY[%s]::timestamptz[],"
        " ARRAY[gen_random_uuid()], %s)",
        (due, due + timedelta(seconds=60)),
    )
    assert two.fire_schedules() == 0  # held by the dying server: passed by, not waited for
    # The server dies before its commit: its backend is gone (and its locks with it)
    # once pg_terminate_backend returns.
    killer = psycopg.connect(database_url, autocommit=True)
    with killer:
        [(gone,)] = killer.execute(
            "SELECT pg_terminate_backend(%s::integer, 10000)", (holder.info.backend_pid,)
        ).fetchall()
    assert gone
    holder.close()
    assert two.fire_schedules() == 1
    assert one.fire_schedules() == 0
    assert runs_of(one) == [(f"schedule:tick:{due.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}", "running")]


def test_a_schedule_that_cannot_fire_stays_due_and_does_not_hold_back_the_others(
    cyclone_server, caplog
):
    create(cyclone_server, schedule("broken", every=60))
    create(cyclone_server, schedule("fine", every=60))
    # Stored nodes that run_submit refuses (as a bad data fix might leave them).
    cyclone_server.sql(
        """UPDATE cyclone.schedules SET nodes = '[{"name": "x"}]' WHERE name = 'broken'"""
    )
    to_next_firing(cyclone_server, "broken")
    to_next_firing(cyclone_server, "fine")
    assert cyclone_server.fire_schedules() == 1
    assert [s for _, s in runs_of(cyclone_server, "fine")] == ["running"]
    assert runs_of(cyclone_server, "broken") == []
    assert "schedule broken could not fire" in caplog.text
    [(due,)] = cyclone_server.sql(
        "SELECT next_fire_at <= cyclone.now() FROM cyclone.schedules WHERE name = 'broken'"
    )
    assert due  # left due: the next pass tries again
    assert cyclone_server.fire_schedules() == 0
