"""A schedule firing every second for a minute with three
cyclone-server processes, one killed (SIGKILL) midway, yields exactly one run per
firing, counted from the database."""

from __future__ import annotations

import re
from datetime import UTC, timedelta

import psycopg
import pytest

from cyclone.v1 import schedule_service_pb2 as pb
from cyclone.v1 import schedule_service_pb2_grpc
from tests.helpers import eventually, node, seconds, workflow
from tests.test_processes import stubs

pytestmark = pytest.mark.slow

FIRINGS = 60


@pytest.mark.timeout(300)
def test_three_servers_fire_each_second_once_and_a_killed_one_loses_nothing(
    server_process, database_url
):
    servers = [server_process("--schedule-interval", "0.2") for _ in range(3)]
    schedules = schedule_service_pb2_grpc.ScheduleServiceStub(stubs(servers[1].address).channel)
    made = schedules.CreateSchedule(
        pb.CreateScheduleRequest(
            schedule=pb.Schedule(
                name="every-second",
                workflow=workflow("tick", node("t", action="tick")),
                interval=seconds(1),
                overlap=pb.OVERLAP_POLICY_ALLOW,
                catch_up=pb.CATCH_UP_POLICY_ALL,
            )
        )
    ).schedule
    first = made.next_fire_at.ToDatetime(tzinfo=UTC)

    with psycopg.connect(database_url, autocommit=True) as conn:

        def fired() -> int:
            return conn.execute(
                "SELECT count(*) FROM cyclone.runs WHERE workflow = 'tick'"
            ).fetchone()[0]

        eventually(lambda: fired() >= FIRINGS // 2, "half the firings", timeout=FIRINGS + 30)
        servers[0].process.kill()  # SIGKILL: no goodbye, maybe in the middle of a pass
        servers[0].process.wait()
        eventually(lambda: fired() >= FIRINGS, "the other firings", timeout=FIRINGS + 30)
        # Pausing waits for a pass that holds the schedule; then nothing fires.
        schedules.PauseSchedule(pb.PauseScheduleRequest(name="every-second"))
        [(last_fire_at,)] = conn.execute(
            "SELECT last_fire_at FROM cyclone.schedules WHERE name = 'every-second'"
        ).fetchall()
        keys = [
            k
            for (k,) in conn.execute(
                "SELECT submit_key FROM cyclone.runs WHERE workflow = 'tick' ORDER BY submit_key"
            ).fetchall()
        ]

    # One run per whole second from the first fire time to the last: none lost, none twice.
    expected = int((last_fire_at - first).total_seconds()) + 1
    assert expected >= FIRINGS
    assert keys == [
        f"schedule:every-second:{first + timedelta(seconds=i):%Y-%m-%dT%H:%M:%SZ}"
        for i in range(expected)
    ]
    # The firings were shared out, and the killed server had fired before it died.
    firing_servers = {
        i
        for i, server in enumerate(servers)
        if re.search(r"schedule every-second fired for", "".join(server.output))
    }
    assert 0 in firing_servers and len(firing_servers) >= 2, firing_servers
