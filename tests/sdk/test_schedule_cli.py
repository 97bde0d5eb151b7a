"""Schedules through the Python client and the `cyclone schedule` commands, on a real
server: create, get, list, pause, resume, delete, and a firing seen through both."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from pyclient import InvalidArgument, NotFound, Workflow, cli


def _cli(capsys, server, *argv: str) -> tuple[int, str, str]:
    code = cli.main([*argv, "--address", server.address])
    out, err = capsys.readouterr()
    return code, out, err


def test_client_schedules_end_to_end(client, cyclone_server):
    wf = Workflow("report")
    wf.node("build")
    made = client.create_schedule(
        "nightly", wf, {"full": True}, cron="30 2 * * *", time_zone="Europe/Paris"
    )
    assert (made.cron, made.time_zone, made.interval) == ("30 2 * * *", "Europe/Paris", None)
    assert (made.overlap, made.catch_up, made.paused) == ("skip", "skip", False)
    assert made.input == {"full": True} and made.workflow == "report"
    every = client.create_schedule(
        "poll",
        wf,
        every=dt.timedelta(minutes=5),
        overlap="allow",
        catch_up="all",
        paused=True,
        tags={"team": "billing"},
    )
    assert every.interval == dt.timedelta(minutes=5) and every.paused
    assert every.tags == {"team": "billing"} and made.tags == {}
    assert (every.overlap, every.catch_up) == ("allow", "all")
    assert client.get_schedule("nightly") == made
    page = client.list_schedules(page_size=1)
    assert [s.name for s in page.schedules] == ["nightly"]
    rest = client.list_schedules(page_token=page.next_page_token)
    assert [s.name for s in rest.schedules] == ["poll"] and not rest.next_page_token
    assert client.resume_schedule("poll").paused is False
    assert client.pause_schedule("nightly").paused is True

    # A firing, seen through the client: the run's key names the schedule.
    resumed = client.get_schedule("poll")
    assert resumed.next_fire_at is not None
    now = cyclone_server.sql("SELECT cyclone.now()")[0][0]
    cyclone_server.advance_clock((resumed.next_fire_at - now).total_seconds() + 0.01)
    assert cyclone_server.fire_schedules() == 1
    fired = client.get_schedule("poll")
    run = client.get_run(fired.last_run_id)
    assert run.submit_key == f"schedule:poll:{resumed.next_fire_at:%Y-%m-%dT%H:%M:%SZ}"
    assert run.tags == {"team": "billing"}
    assert fired.last_fire_at == resumed.next_fire_at

    client.delete_schedule("poll")
    with pytest.raises(NotFound):
        client.get_schedule("poll")
    with pytest.raises(InvalidArgument, match="exactly one of cron and every"):
        client.create_schedule("both", wf, cron="* * * * *", every=5)
    with pytest.raises(InvalidArgument, match="Bad hour"):
        client.create_schedule("bad", wf, cron="0 25 * * *")


def test_cli_schedule_commands(capsys, cyclone_server, tmp_path: Path):
    path = tmp_path / "report.yaml"
    path.write_text("name: report\ninput: {full: true}\nnodes:\n  - name: build\n")
    code, out, _ = _cli(
        capsys,
        cyclone_server,
        "schedule",
        "create",
        "nightly",
        str(path),
        "--cron",
        "0 9 * * 1-5",
        "--time-zone",
        "America/New_York",
        "--catch-up",
        "all",
    )
    assert code == 0, out
    assert "schedule nightly" in out and "cron '0 9 * * 1-5' in America/New_York" in out
    assert "overlap skip, catch-up all" in out
    code, out, _ = _cli(
        capsys,
        cyclone_server,
        "schedule",
        "create",
        "poll",
        str(path),
        "--every",
        "60",
        "--tag",
        "team=ops",
        "--tag",
        "kind=poll",
    )
    assert code == 0 and "every 60s" in out
    assert "tags       kind=poll, team=ops" in out

    code, out, _ = _cli(capsys, cyclone_server, "schedule", "list")
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["NAME", "WORKFLOW", "WHEN", "NEXT"]
    assert [line.split()[0] for line in lines[1:]] == ["nightly", "poll"]

    code, out, _ = _cli(capsys, cyclone_server, "schedule", "pause", "poll")
    assert code == 0 and "(paused)" in out
    code, out, _ = _cli(capsys, cyclone_server, "schedule", "get", "poll", "--json")
    got = json.loads(out)
    assert got["paused"] is True and got["interval"] == 60.0 and got["input"] == {"full": True}
    assert got["tags"] == {"team": "ops", "kind": "poll"}
    code, out, _ = _cli(capsys, cyclone_server, "schedule", "resume", "poll")
    assert code == 0 and "(paused)" not in out
    code, out, _ = _cli(capsys, cyclone_server, "schedule", "delete", "poll")
    assert (code, out.strip()) == (0, "schedule poll deleted")
    code, out, err = _cli(capsys, cyclone_server, "schedule", "get", "poll")
    assert code == 1 and "not found" in err
    code, out, err = _cli(
        capsys, cyclone_server, "schedule", "create", "bad", str(path), "--cron", "* * *"
    )
    assert code == 1 and "Wrong number of fields" in err
    assert cyclone_server.sql("SELECT name FROM cyclone.schedules") == [("nightly",)]


def test_async_client_schedules(cyclone_server):
    import asyncio

    from pyclient import AsyncClient

    wf = Workflow("report")
    wf.node("build")

    async def main() -> None:
        async with AsyncClient(cyclone_server.address) as client:
            made = await client.create_schedule("hourly", wf, cron="0 * * * *")
            assert made.time_zone == "UTC" and made.next_fire_at.minute == 0
            assert await client.get_schedule("hourly") == made
            assert [s.name for s in (await client.list_schedules()).schedules] == ["hourly"]
            assert (await client.pause_schedule("hourly")).paused
            assert not (await client.resume_schedule("hourly")).paused
            await client.delete_schedule("hourly")
            with pytest.raises(NotFound):
                await client.get_schedule("hourly")

    asyncio.run(main())
