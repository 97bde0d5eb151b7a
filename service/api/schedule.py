"""ScheduleService (docs/schedules.md): schedules validated, created, read, listed,
paused, resumed and deleted; and the nodes the firing pass stores for a schedule
whose key templates are not evaluated yet."""

from __future__ import annotations

import json
import logging
import zoneinfo
from collections.abc import Awaitable, Callable
from datetime import datetime

from cronsim import CronSimError
from google.protobuf import json_format, struct_pb2

from cyclone import dag
from cyclone.v1 import schedule_service_pb2 as schedule_pb
from cyclone.v1 import schedule_service_pb2_grpc as schedule_grpc
from cyclone.v1 import types_pb2
from service import errors
from service.api import convert
from service.api.status import rpc
from service.api.submit import new_run, new_run_of
from service.api.validate import Context, limits_of, page_size, payloads_of, tags_json
from service.config import Settings
from service.db import Database
from service.db.runs import nodes_json
from service.db.schedules import DueSchedule, ScheduleRow
from service.engine.schedules import When

log = logging.getLogger("cyclone")


MAX_INTERVAL_S = 366 * 86400

MAX_CRON = 200

MAX_ZONE = 100

OVERLAP = {
    schedule_pb.OVERLAP_POLICY_UNSPECIFIED: "skip",
    schedule_pb.OVERLAP_POLICY_SKIP: "skip",
    schedule_pb.OVERLAP_POLICY_ALLOW: "allow",
}


OVERLAP_ENUM = {"skip": schedule_pb.OVERLAP_POLICY_SKIP, "allow": schedule_pb.OVERLAP_POLICY_ALLOW}

CATCH_UP = {
    schedule_pb.CATCH_UP_POLICY_UNSPECIFIED: "skip",
    schedule_pb.CATCH_UP_POLICY_SKIP: "skip",
    schedule_pb.CATCH_UP_POLICY_ALL: "all",
}


CATCH_UP_ENUM = {"skip": schedule_pb.CATCH_UP_POLICY_SKIP, "all": schedule_pb.CATCH_UP_POLICY_ALL}


def _name(value: str) -> str:
    try:
        dag.check_name("schedule", value)
    except dag.InvalidWorkflow as exc:
        raise errors.InvalidArgument(str(exc)) from None
    return value


def _when(schedule: schedule_pb.Schedule) -> tuple[str | None, str | None, int | None]:
    """(cron, time zone, interval seconds) of a schedule to create; INVALID_ARGUMENT
    names what is wrong."""
    spec = schedule.WhichOneof("spec")
    if spec is None:
        raise errors.InvalidArgument("schedule needs a cron expression or an interval")
    if spec == "interval":
        if schedule.time_zone:
            raise errors.InvalidArgument("time_zone applies to cron only, not to interval")
        d = schedule.interval
        if d.nanos or not 1 <= d.seconds <= MAX_INTERVAL_S:
            raise errors.InvalidArgument(
                f"interval must be whole seconds from 1 to {MAX_INTERVAL_S}, got "
                f"{d.seconds}s{f' {d.nanos}ns' if d.nanos else ''}"
            )
        return None, None, d.seconds
    cron = schedule.cron.strip()
    zone = schedule.time_zone or "UTC"
    if not cron or len(cron) > MAX_CRON or not cron.isprintable():
        raise errors.InvalidArgument(
            f"cron must be 1 to {MAX_CRON} printable characters, got {dag.excerpt(cron)}"
        )
    if len(zone) > MAX_ZONE or not zone.isprintable():
        raise errors.InvalidArgument(f"unknown time_zone {dag.excerpt(zone)}")
    try:
        tz = zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        raise errors.InvalidArgument(f"unknown time_zone {dag.excerpt(zone)}") from None
    try:
        When(cron, zone, None).after(datetime.now(tz))
    except (CronSimError, StopIteration) as exc:
        raise errors.InvalidArgument(f"cron {dag.excerpt(cron)}: {exc or 'never fires'}") from None
    return cron, zone, None


def schedule_proto(row: ScheduleRow) -> schedule_pb.Schedule:
    s = schedule_pb.Schedule(
        name=row.name,
        workflow=json_format.ParseDict(row.workflow, types_pb2.Workflow()),
        overlap=OVERLAP_ENUM[row.overlap],
        catch_up=CATCH_UP_ENUM[row.catch_up],
        paused=row.paused,
        next_fire_at=convert.timestamp(row.next_fire_at),
        last_fire_at=convert.timestamp(row.last_fire_at),
        last_run_id=str(row.last_run_id) if row.last_run_id else "",
        created_at=convert.timestamp(row.created_at),
        updated_at=convert.timestamp(row.updated_at),
    )
    convert.set_json(s, "input", row.input)
    s.tags.update(row.tags or {})
    if row.cron is not None:
        s.cron = row.cron
        s.time_zone = row.time_zone or ""
    else:
        s.interval.FromSeconds(row.interval_s or 0)
    return s


class ScheduleServicer(schedule_grpc.ScheduleServiceServicer):
    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.limits = limits_of(settings)
        self.payloads = payloads_of(settings)

    @rpc
    async def CreateSchedule(
        self, request: schedule_pb.CreateScheduleRequest, context: Context
    ) -> schedule_pb.CreateScheduleResponse:
        s = request.schedule
        name = _name(s.name)
        if not s.HasField("workflow"):
            raise errors.InvalidArgument("workflow is required")
        cron, zone, interval_s = _when(s)
        if s.overlap not in OVERLAP:
            raise errors.InvalidArgument(f"unknown overlap policy {s.overlap}")
        if s.catch_up not in CATCH_UP:
            raise errors.InvalidArgument(f"unknown catch_up policy {s.catch_up}")
        # The input is fixed: each key is evaluated here, once, and a firing submits
        # the nodes as they are stored, as SubmitOnce would submit them.
        run = await new_run_of(s, self.limits, self.payloads)
        when = When(cron, zone, interval_s)
        row = await self.db.schedules.schedule_create(
            schedule=name,
            workflow=json.dumps(json_format.MessageToDict(s.workflow)),
            workflow_name=s.workflow.name,
            nodes=nodes_json(run.nodes),
            input=run.input_json,
            cron=cron,
            time_zone=zone,
            interval_s=interval_s,
            overlap=OVERLAP[s.overlap],
            catch_up=CATCH_UP[s.catch_up],
            paused=s.paused,
            next_fire_at=when.after(await self.db.schedules.clock_now()),
            tags=tags_json(s.tags, "tags"),
        )
        log.info(
            "schedule %s created (workflow %s, %s), first firing at %s",
            name,
            s.workflow.name,
            f"cron {cron!r} in {zone}" if cron else f"every {interval_s}s",
            row.next_fire_at.isoformat(),
            extra={"schedule": name, "workflow": s.workflow.name},
        )
        return schedule_pb.CreateScheduleResponse(schedule=schedule_proto(row))

    @rpc
    async def GetSchedule(
        self, request: schedule_pb.GetScheduleRequest, context: Context
    ) -> schedule_pb.GetScheduleResponse:
        row = await self.db.schedules.schedule_get(_name(request.name))
        return schedule_pb.GetScheduleResponse(schedule=schedule_proto(row))

    @rpc
    async def ListSchedules(
        self, request: schedule_pb.ListSchedulesRequest, context: Context
    ) -> schedule_pb.ListSchedulesResponse:
        size = page_size(request.page_size)
        after = None
        if request.page_token:
            try:
                dag.check_name("schedule", request.page_token)
            except dag.InvalidWorkflow:
                raise errors.InvalidArgument("page_token is not one this server issued") from None
            after = request.page_token
        rows = await self.db.schedules.schedules_list(after=after, limit=size + 1)
        return schedule_pb.ListSchedulesResponse(
            schedules=[schedule_proto(r) for r in rows[:size]],
            next_page_token=rows[size - 1].name if len(rows) > size else "",
        )

    @rpc
    async def PauseSchedule(
        self, request: schedule_pb.PauseScheduleRequest, context: Context
    ) -> schedule_pb.PauseScheduleResponse:
        name = _name(request.name)
        row = await self.db.schedules.schedule_pause(name)
        log.info("schedule %s paused", name, extra={"schedule": name})
        return schedule_pb.PauseScheduleResponse(schedule=schedule_proto(row))

    @rpc
    async def ResumeSchedule(
        self, request: schedule_pb.ResumeScheduleRequest, context: Context
    ) -> schedule_pb.ResumeScheduleResponse:
        name = _name(request.name)
        current = await self.db.schedules.schedule_get(name)
        when = When(current.cron, current.time_zone, current.interval_s)
        row = await self.db.schedules.schedule_resume(
            name, when.after(await self.db.schedules.clock_now())
        )
        log.info(
            "schedule %s resumed, next firing at %s",
            name,
            row.next_fire_at.isoformat(),
            extra={"schedule": name},
        )
        return schedule_pb.ResumeScheduleResponse(schedule=schedule_proto(row))

    @rpc
    async def DeleteSchedule(
        self, request: schedule_pb.DeleteScheduleRequest, context: Context
    ) -> schedule_pb.DeleteScheduleResponse:
        name = _name(request.name)
        await self.db.schedules.schedule_delete(name)
        log.info("schedule %s deleted", name, extra={"schedule": name})
        return schedule_pb.DeleteScheduleResponse()


def keyed(settings: Settings) -> Callable[[DueSchedule], Awaitable[list[dag.NodeSpec]]]:
    """For the firing pass: the nodes of a schedule whose nodes still hold key
    templates (stored by a server that did not evaluate them), as CreateSchedule
    stores them now (service.api.submit.new_run: validated, keys evaluated for its
    input). A schedule whose input lacks a key's field cannot fire: its error says
    which."""
    limits, payloads = limits_of(settings), payloads_of(settings)

    async def nodes(schedule: DueSchedule) -> list[dag.NodeSpec]:
        assert schedule.workflow is not None
        workflow = json_format.ParseDict(schedule.workflow, types_pb2.Workflow())
        run_input = (
            None
            if schedule.input is None
            else json_format.ParseDict(schedule.input, struct_pb2.Value())
        )
        return (await new_run(workflow, run_input, limits, payloads)).nodes

    return nodes
