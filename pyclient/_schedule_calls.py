"""The requests of the schedule RPCs and the parsing of their answers, as the sync and
async clients send them (pyclient._requests holds the others)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from cyclone.v1 import schedule_service_pb2 as schedule_pb
from pyclient._requests import Call, _set_tags, _set_value
from pyclient.errors import InvalidArgument
from pyclient.models import Schedule, SchedulePage
from pyclient.workflow import Workflow

_OVERLAP = {"skip": schedule_pb.OVERLAP_POLICY_SKIP, "allow": schedule_pb.OVERLAP_POLICY_ALLOW}
_CATCH_UP = {"skip": schedule_pb.CATCH_UP_POLICY_SKIP, "all": schedule_pb.CATCH_UP_POLICY_ALL}


class schedule_calls:
    @staticmethod
    def create(
        name: str,
        workflow: Workflow,
        input: Any,
        cron: str | None,
        time_zone: str | None,
        every: float | dt.timedelta | None,
        overlap: str,
        catch_up: str,
        paused: bool,
        tags: Mapping[str, str] | None = None,
    ) -> Call[Schedule]:
        if (cron is None) == (every is None):
            raise InvalidArgument("give exactly one of cron and every")
        if overlap not in _OVERLAP:
            raise InvalidArgument(f"overlap must be one of {sorted(_OVERLAP)}, got {overlap!r}")
        if catch_up not in _CATCH_UP:
            raise InvalidArgument(f"catch_up must be one of {sorted(_CATCH_UP)}, got {catch_up!r}")
        s = schedule_pb.Schedule(
            name=name,
            workflow=workflow.to_proto(),
            time_zone=time_zone or "",
            overlap=_OVERLAP[overlap],
            catch_up=_CATCH_UP[catch_up],
            paused=paused,
        )
        if cron is not None:
            s.cron = cron
        else:
            seconds = every.total_seconds() if isinstance(every, dt.timedelta) else every
            s.interval.FromNanoseconds(round(float(seconds or 0) * 1e9))
        _set_value(s, "input", input, "run input")
        _set_tags(tags, s.tags)
        req = schedule_pb.CreateScheduleRequest(schedule=s)
        return Call("schedule", "CreateSchedule", req, _schedule)

    @staticmethod
    def one(method: str, name: str) -> Call[Schedule]:
        req = getattr(schedule_pb, f"{method}Request")(name=name)
        return Call("schedule", method, req, _schedule)

    @staticmethod
    def list(page_size: int | None, page_token: str | None) -> Call[SchedulePage]:
        req = schedule_pb.ListSchedulesRequest(
            page_size=page_size or 0, page_token=page_token or ""
        )

        def parse(r: schedule_pb.ListSchedulesResponse) -> SchedulePage:
            return SchedulePage(
                tuple(Schedule.from_proto(s) for s in r.schedules), r.next_page_token
            )

        return Call("schedule", "ListSchedules", req, parse)

    @staticmethod
    def delete(name: str) -> Call[None]:
        req = schedule_pb.DeleteScheduleRequest(name=name)
        return Call("schedule", "DeleteSchedule", req, lambda r: None)


def _schedule(r: Any) -> Schedule:
    return Schedule.from_proto(r.schedule)
