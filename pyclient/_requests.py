"""What each method of Client and AsyncClient does, described once: the request it
builds (checked as the server checks it), the RPC, how to read the answer
(:class:`calls`; the schedules' are in pyclient._schedule_calls); with the polling
schedule of ``wait()`` and the address and metadata every client uses. The two classes
only differ in how they wait."""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from google.protobuf import message as pb_message

from cyclone import dag, flow
from cyclone.jsonvalue import to_value
from cyclone.v1 import (
    admin_service_pb2 as admin_pb,
)
from cyclone.v1 import (
    admin_service_pb2_grpc as admin_grpc,
)
from cyclone.v1 import (
    schedule_service_pb2_grpc as schedule_grpc,
)
from cyclone.v1 import (
    types_pb2,
)
from cyclone.v1 import (
    workflow_service_pb2 as wf_pb,
)
from cyclone.v1 import (
    workflow_service_pb2_grpc as wf_grpc,
)
from pyclient.errors import InvalidArgument, WaitTimeout
from pyclient.models import (
    ActionActivity,
    Build,
    BuildMoved,
    BuildRun,
    EventSent,
    Explanation,
    NamePause,
    Paused,
    Retried,
    Run,
    RunCount,
    RunPage,
    RunPause,
    RunStatus,
    RunStep,
    Step,
    StepPage,
    StepStatus,
    Submitted,
    Workers,
    WorkerSummary,
    WorkflowDeadline,
)
from pyclient.workflow import RetryPolicy, Workflow

DEFAULT_ADDRESS = "127.0.0.1:50051"
#: Per-call deadline, in seconds, unless the client is given another.
DEFAULT_CALL_TIMEOUT = 30.0

T = TypeVar("T")
UNSET: Any = object()


def default_address() -> str:
    """``$CYCLONE_ADDRESS`` or 127.0.0.1:50051."""
    return os.environ.get("CYCLONE_ADDRESS") or DEFAULT_ADDRESS


def call_metadata(token: str | None, actor: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata sent with every call: the bearer token and the audit actor."""
    md: list[tuple[str, str]] = []
    if token:
        md.append(("authorization", f"Bearer {token}"))
    if actor:
        md.append(("cyclone-actor", actor))
    return tuple(md)


#: A start time: an aware datetime, or a delay from now.
StartAt = dt.datetime | dt.timedelta


def _set_tags(tags: Mapping[str, str] | None, into: Any) -> None:
    """Tags (a mapping of key = value strings) into a request's map field; the server
    checks their bounds."""
    for key, value in dict(tags or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidArgument(f"tags are key = value strings, got {key!r} = {value!r}")
        into[key] = value


def _set_time(
    req: wf_pb.SubmitRequest | wf_pb.SubmitOnceRequest, field: str, when: StartAt | None
) -> None:
    """A time field of a submit (start_at, deadline): an aware datetime, or a delay from
    now."""
    if when is None:
        return
    if isinstance(when, dt.timedelta):
        when = dt.datetime.now(dt.UTC) + when
    if when.tzinfo is None:
        raise InvalidArgument(f"{field} must be an aware datetime (with a time zone)")
    getattr(req, field).FromDatetime(when)


def _set_flow(
    req: wf_pb.SubmitRequest | wf_pb.SubmitOnceRequest,
    start_at: StartAt | None,
    priority: int,
    deadline: StartAt | None = None,
) -> None:
    """Start time, priority and deadline of a submit, checked as the server checks
    them."""
    try:
        flow.check_priority("run", priority)
    except dag.InvalidWorkflow as exc:
        raise InvalidArgument(str(exc)) from None
    req.priority = priority
    _set_time(req, "start_at", start_at)
    _set_time(req, "deadline", deadline)


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One RPC to make: which service and method, the request, how to read the answer."""

    service: str  # "workflow", "admin" or "schedule"
    method: str
    request: pb_message.Message
    parse: Callable[[Any], T]
    #: Seconds the server may wait before it answers (QueryRun, UpdateRun's timeout),
    #: added to the client's call timeout.
    wait: float = 0.0


@dataclass(frozen=True, slots=True)
class ResolveTarget:
    """What a resolve names: the node and the step call, or (``lookup``) a target that
    the run's error tells apart, as ``cyclone resolve RUN TARGET`` does."""

    node: str
    step_id: str | None
    lookup: bool = False

    def on(self, blocked_node: str | None, blocked_step_id: str | None) -> ResolveTarget:
        """The target read against the run's error: a step id when the run is blocked
        on a step call, its node otherwise."""
        if blocked_step_id and blocked_node and self.node != blocked_node:
            return ResolveTarget(blocked_node, self.node)
        if blocked_step_id and self.node == blocked_step_id:
            return ResolveTarget(blocked_node or "", self.node)
        # The node (the server names the step call when that is what blocks the run).
        return ResolveTarget(self.node, None)


class calls:
    @staticmethod
    def submit(
        workflow: Workflow,
        input: Any,
        start_at: StartAt | None = None,
        priority: int = 0,
        tags: Mapping[str, str] | None = None,
        deadline: StartAt | None = None,
    ) -> Call[str]:
        req = wf_pb.SubmitRequest(workflow=workflow.to_proto())
        _set_value(req, "input", input, "run input")
        _set_flow(req, start_at, priority, deadline)
        _set_tags(tags, req.tags)
        return Call("workflow", "Submit", req, lambda r: r.run_id)

    @staticmethod
    def submit_once(
        workflow: Workflow,
        key: str,
        input: Any,
        start_at: StartAt | None = None,
        priority: int = 0,
        tags: Mapping[str, str] | None = None,
        deadline: StartAt | None = None,
    ) -> Call[Submitted]:
        try:
            dag.check_submit_key(key)
        except dag.InvalidWorkflow as exc:
            raise InvalidArgument(str(exc)) from None
        req = wf_pb.SubmitOnceRequest(workflow=workflow.to_proto(), key=key)
        _set_value(req, "input", input, "run input")
        _set_flow(req, start_at, priority, deadline)
        _set_tags(tags, req.tags)
        return Call("workflow", "SubmitOnce", req, lambda r: Submitted(r.run_id, r.created))

    @staticmethod
    def start(
        name: str | Callable[..., Any],
        input: Any,
        key: str | None,
        timeout: float | dt.timedelta | None,
        retry: RetryPolicy | None,
    ) -> Call[str]:
        """Submit (SubmitOnce with a key) the one-node workflow of a durable function:
        workflow, node and action named after it."""
        if not isinstance(name, str):
            name = getattr(name, "__cyclone_action__", None) or name.__name__
        wf = Workflow(name)
        wf.node(name, action=name, timeout=timeout, retry=retry)
        if key is None:
            return calls.submit(wf, input)
        once = calls.submit_once(wf, key, input)
        return Call(once.service, once.method, once.request, lambda r: r.run_id)

    @staticmethod
    def get_run(run_id: str, logs: bool = False, logs_node: str = "") -> Call[Run]:
        req = wf_pb.GetRunRequest(run_id=run_id, logs=logs, logs_node=logs_node)
        return Call("workflow", "GetRun", req, lambda r: Run.from_proto(r.run))

    @staticmethod
    def list_runs(
        workflow: str | None,
        status: str | Iterable[str] | None,
        created_after: dt.datetime | None,
        created_before: dt.datetime | None,
        page_size: int | None,
        page_token: str,
        key: str | None = None,
        prefixes: Mapping[str, str | None] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> Call[RunPage]:
        req = wf_pb.ListRunsRequest(page_size=page_size or 0, page_token=page_token)
        _set_run_filters(req, workflow, status, created_after, created_before, key, prefixes)
        _set_tags(tags, req.tags)

        def parse(r: wf_pb.ListRunsResponse) -> RunPage:
            runs = tuple(Run.from_proto(p) for p in r.runs)
            return RunPage(runs, r.next_page_token, r.prev_page_token)

        return Call("workflow", "ListRuns", req, parse)

    @staticmethod
    def count_runs(
        workflow: str | None,
        status: str | Iterable[str] | None,
        created_after: dt.datetime | None,
        created_before: dt.datetime | None,
        key: str | None,
        limit: int | None,
        prefixes: Mapping[str, str | None] | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> Call[dict[str, RunCount]]:
        req = wf_pb.CountRunsRequest(limit=limit or 0)
        _set_run_filters(req, workflow, status, created_after, created_before, key, prefixes)
        _set_tags(tags, req.tags)

        def parse(r: wf_pb.CountRunsResponse) -> dict[str, RunCount]:
            return {str(c.status): c for c in map(RunCount.from_proto, r.counts)}

        return Call("workflow", "CountRuns", req, parse)

    @staticmethod
    def list_steps(
        status: str | None,
        lease_expired: bool,
        backing_off: bool,
        worker_id: str | None,
        action: str | None,
        page_size: int | None,
        page_token: str,
        ready: bool = False,
    ) -> Call[StepPage]:
        if status is not None and status not in StepStatus.__members__.values():
            raise InvalidArgument(f"unknown step status {status!r}")
        code = f"STEP_STATUS_{status.upper()}" if status else "STEP_STATUS_UNSPECIFIED"
        req = wf_pb.ListStepsRequest(
            status=code,
            lease_expired=lease_expired,
            backing_off=backing_off,
            worker_id=worker_id or "",
            action=action or "",
            page_size=page_size or 0,
            page_token=page_token,
            ready=ready,
        )

        def parse(r: wf_pb.ListStepsResponse) -> StepPage:
            steps = tuple(RunStep(s.run_id, s.workflow, Step.from_proto(s.step)) for s in r.steps)
            return StepPage(steps, r.next_page_token)

        return Call("workflow", "ListSteps", req, parse)

    @staticmethod
    def list_workers() -> Call[Workers]:
        def parse(r: wf_pb.ListWorkersResponse) -> Workers:
            return Workers(
                tuple(WorkerSummary.from_proto(w) for w in r.workers),
                tuple(ActionActivity.from_proto(a) for a in r.actions),
            )

        return Call("workflow", "ListWorkers", wf_pb.ListWorkersRequest(), parse)

    @staticmethod
    def cancel(run_id: str, reason: str, keep_children: bool) -> Call[Run]:
        req = wf_pb.CancelRunRequest(run_id=run_id, reason=reason, keep_children=keep_children)
        return Call("workflow", "CancelRun", req, lambda r: Run.from_proto(r.run))

    @staticmethod
    def send_event(run_id: str, name: str, payload: Any, key: str | None) -> Call[EventSent]:
        req = wf_pb.SendEventRequest(run_id=run_id, name=name, key=key or "")
        _set_value(req, "payload", payload, "the event's payload")
        return Call(
            "workflow", "SendEvent", req, lambda r: EventSent(int(r.event_id), bool(r.created))
        )

    @staticmethod
    def explain(run_id: str, node: str) -> Call[Explanation]:
        req = wf_pb.ExplainRequest(run_id=run_id, node=node)
        return Call("workflow", "Explain", req, Explanation.from_proto)

    @staticmethod
    def retry(run_id: str, node: str, reason: str) -> Call[Run]:
        req = admin_pb.RetryRequest(run_id=run_id, node=node, reason=reason)
        return Call("admin", "Retry", req, lambda r: Run.from_proto(r.run))

    @staticmethod
    def set_run_tags(
        run_id: str, set_tags: Mapping[str, str] | None, remove: Iterable[str], reason: str
    ) -> Call[Run]:
        req = admin_pb.SetRunTagsRequest(run_id=run_id, remove_keys=list(remove), reason=reason)
        _set_tags(set_tags, req.set_tags)
        return Call("admin", "SetRunTags", req, lambda r: Run.from_proto(r.run))

    @staticmethod
    def retry_all(run_id: str, reason: str) -> Call[Retried]:
        req = admin_pb.RetryAllRequest(run_id=run_id, reason=reason)
        return Call(
            "admin", "RetryAll", req, lambda r: Retried(tuple(r.nodes), Run.from_proto(r.run))
        )

    @staticmethod
    def resolve_target(
        target: str, node: str | None, step_id: str | None, chosen: list[bool]
    ) -> ResolveTarget:
        """Client.resolve's words: ``target`` (a step id or a node, as for the CLI),
        ``node=`` (the node of a step call), ``step_id=``."""
        if sum(chosen) != 1:
            raise InvalidArgument("resolve needs exactly one of result=, error= or discard=True")
        if step_id:
            if target and node and target != node:
                raise InvalidArgument("with step_id=, give the node once (target or node=)")
            return ResolveTarget(node or target, step_id)
        if node and target:
            return ResolveTarget(node, target)  # as cyclone resolve RUN STEP_ID --node NODE
        if node or not target:
            return ResolveTarget(node or "", None)
        return ResolveTarget(target, None, lookup=True)

    @staticmethod
    def resolve(
        run_id: str,
        node: str,
        result: Any,
        error: str | None,
        discard: bool,
        reason: str,
        step_id: str | None,
    ) -> Call[Run]:
        chosen = [result is not UNSET, error is not None, bool(discard)]
        if sum(chosen) != 1:
            raise InvalidArgument("resolve needs exactly one of result=, error= or discard=True")
        if not node and not step_id:
            raise InvalidArgument("resolve needs the node, or the step_id of a step call")
        req = admin_pb.ResolveRequest(
            run_id=run_id, node=node, reason=reason, step_id=step_id or ""
        )
        if result is not UNSET:
            _set_value(req, "result", result, "result", allow_null=True)
        elif error is not None:
            req.error = error
        else:
            req.discard = True
        return Call("admin", "Resolve", req, lambda r: Run.from_proto(r.run))

    @staticmethod
    def list_builds() -> Call[list[Build]]:
        return Call(
            "admin",
            "ListBuilds",
            admin_pb.ListBuildsRequest(),
            lambda r: [Build.from_proto(b) for b in r.builds],
        )

    @staticmethod
    def list_build_runs(build_id: str, limit: int) -> Call[list[BuildRun]]:
        req = admin_pb.ListBuildRunsRequest(build_id=build_id, limit=limit)
        return Call(
            "admin",
            "ListBuildRuns",
            req,
            lambda r: [BuildRun(x.run_id, x.workflow, tuple(x.nodes)) for x in r.runs],
        )

    @staticmethod
    def set_build_compatible(build_id: str, compatible_with: str, reason: str) -> Call[Build]:
        req = admin_pb.SetBuildCompatibleRequest(
            build_id=build_id, compatible_with=compatible_with, reason=reason
        )
        return Call("admin", "SetBuildCompatible", req, lambda r: Build.from_proto(r.build))

    @staticmethod
    def retire_build(build_id: str, reason: str) -> Call[Build]:
        req = admin_pb.RetireBuildRequest(build_id=build_id, reason=reason)
        return Call("admin", "RetireBuild", req, lambda r: Build.from_proto(r.build))

    @staticmethod
    def move_build(from_build_id: str, to_build_id: str, reason: str) -> Call[BuildMoved]:
        req = admin_pb.MoveBuildRequest(
            from_build_id=from_build_id, to_build_id=to_build_id, reason=reason
        )
        return Call("admin", "MoveBuild", req, lambda r: BuildMoved(r.nodes_moved, r.runs_moved))

    @staticmethod
    def pause_run(run_id: str, reason: str) -> Call[Paused]:
        req = admin_pb.PauseRunRequest(run_id=run_id, reason=reason)
        return Call("admin", "PauseRun", req, lambda r: Paused(Run.from_proto(r.run), r.changed))

    @staticmethod
    def resume_run(run_id: str, reason: str) -> Call[Paused]:
        req = admin_pb.ResumeRunRequest(run_id=run_id, reason=reason)
        return Call("admin", "ResumeRun", req, lambda r: Paused(Run.from_proto(r.run), r.changed))

    @staticmethod
    def pause_name(kind: str, name: str, reason: str, pause: bool) -> Call[NamePause]:
        """PauseWorkflow, ResumeWorkflow, PauseAction, ResumeAction (``kind``)."""
        verb = "Pause" if pause else "Resume"
        method = verb + kind.capitalize()
        req = getattr(admin_pb, method + "Request")(name=name, reason=reason)

        def answer(r: Any) -> NamePause:
            held = RunPause.from_proto(r.pause) if pause and r.HasField("pause") else None
            return NamePause(kind, name, bool(r.changed), held)

        return Call("admin", method, req, answer)

    @staticmethod
    def list_pauses() -> Call[list[NamePause]]:
        kinds = {types_pb2.PAUSE_KIND_WORKFLOW: "workflow", types_pb2.PAUSE_KIND_ACTION: "action"}
        return Call(
            "admin",
            "ListPauses",
            admin_pb.ListPausesRequest(),
            lambda r: [
                NamePause(kinds.get(p.kind, "?"), p.name, False, RunPause.from_proto(p.pause))
                for p in r.pauses
            ],
        )

    @staticmethod
    def set_workflow_deadline(
        workflow: str, deadline: float | dt.timedelta, reason: str
    ) -> Call[WorkflowDeadline]:
        req = admin_pb.SetWorkflowDeadlineRequest(workflow=workflow, reason=reason)
        if isinstance(deadline, dt.timedelta):
            req.deadline.FromTimedelta(deadline)
        else:
            req.deadline.FromNanoseconds(round(deadline * 1e9))
        return Call(
            "admin", "SetWorkflowDeadline", req, lambda r: WorkflowDeadline.from_proto(r.deadline)
        )

    @staticmethod
    def clear_workflow_deadline(workflow: str, reason: str) -> Call[WorkflowDeadline]:
        req = admin_pb.ClearWorkflowDeadlineRequest(workflow=workflow, reason=reason)
        return Call(
            "admin", "ClearWorkflowDeadline", req, lambda r: WorkflowDeadline.from_proto(r.deadline)
        )

    @staticmethod
    def list_workflow_deadlines() -> Call[list[WorkflowDeadline]]:
        return Call(
            "admin",
            "ListWorkflowDeadlines",
            admin_pb.ListWorkflowDeadlinesRequest(),
            lambda r: [WorkflowDeadline.from_proto(d) for d in r.deadlines],
        )


#: The prefix filters of list_runs and count_runs.
RUN_PREFIXES = ("run_id_prefix", "workflow_prefix", "key_prefix")


def _set_run_filters(
    req: wf_pb.ListRunsRequest | wf_pb.CountRunsRequest,
    workflow: str | None,
    status: str | Iterable[str] | None,
    created_after: dt.datetime | None,
    created_before: dt.datetime | None,
    key: str | None,
    prefixes: Mapping[str, str | None] | None = None,
) -> None:
    """ListRuns' and CountRuns' filters; ``prefixes``: run_id_prefix, workflow_prefix,
    key_prefix."""
    for name, value in (prefixes or {}).items():
        if name not in RUN_PREFIXES:
            raise InvalidArgument(f"unknown run filter {name!r}; expected {RUN_PREFIXES}")
        setattr(req, name, value or "")
    statuses = [status] if isinstance(status, str) else list(status or ())
    try:
        req.statuses.extend(RunStatus(s).to_proto() for s in statuses)
    except ValueError:
        raise InvalidArgument(
            f"unknown run status in {statuses}; expected some of "
            f"{', '.join(s.value for s in RunStatus)}"
        ) from None
    req.workflow = workflow or ""
    req.key = key or ""
    if created_after is not None:
        req.created_after.FromDatetime(created_after)
    if created_before is not None:
        req.created_before.FromDatetime(created_before)


def _set_value(
    req: pb_message.Message, field: str, value: Any, what: str, allow_null: bool = False
) -> None:
    if value is None and not allow_null:
        return
    try:
        getattr(req, field).CopyFrom(to_value(value))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{what} is not JSON: {exc}") from None


class Waiter:
    """The polling schedule of wait(): 50 ms doubling up to ``cap``, until ``timeout``."""

    def __init__(self, run_id: str, timeout: float | None, cap: float):
        self.run_id, self.timeout, self.cap = run_id, timeout, cap
        self.end = None if timeout is None else time.monotonic() + timeout
        self.delay = 0.05

    def pause_after(self, run: Run) -> float | None:
        """None when ``run`` is done waiting for; else how long to sleep before the next poll."""
        if run.status != RunStatus.RUNNING:
            return None
        delay, self.delay = self.delay, min(self.delay * 2, self.cap)
        if self.end is None:
            return delay
        remaining = self.end - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(f"run {self.run_id} is still {run.status} after {self.timeout:g}s")
        return min(delay, remaining)


def stubs(channel: Any) -> dict[str, Any]:
    return {
        "workflow": wf_grpc.WorkflowServiceStub(channel),
        "admin": admin_grpc.AdminServiceStub(channel),
        "schedule": schedule_grpc.ScheduleServiceStub(channel),
    }
