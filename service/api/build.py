"""Protobuf building: rows of the db wing made into the API's messages, and the
serialized answers of CompleteMany."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cyclone.v1 import (
    types_pb2,
)
from cyclone.v1 import (
    worker_service_pb2 as worker_pb,
)
from cyclone.v1 import (
    workflow_service_pb2 as workflow_pb,
)
from service import errors
from service.api import convert, wire
from service.api.status import status as status_of
from service.db.records import (
    ClaimedStep,
    Completion,
    Refused,
    StepJson,
)
from service.db.runs import LogRow, RunRow, RunSummary


def _run_head(row: RunRow | RunSummary) -> types_pb2.Run:
    """A run without its steps."""
    run = types_pb2.Run(
        run_id=str(row.run_id),
        workflow=row.workflow,
        status=convert.RUN_STATUS[row.status],
        submit_key=row.submit_key or "",
        created_at=convert.timestamp(row.created_at),
        updated_at=convert.timestamp(row.updated_at),
        finished_at=convert.timestamp(row.finished_at),
        parent_run_id=str(row.parent_run_id or ""),
        parent_node=row.parent_node or "",
        parent_step_id=row.parent_step_id or "",
    )
    convert.set_json(run, "input", row.input)
    if row.error:
        e = row.error
        run.error.CopyFrom(
            types_pb2.RunError(
                kind=e.get("kind", ""),
                message=e.get("message", ""),
                node=e.get("node", ""),
                attempt=e.get("attempt") or 0,
                started_at=convert.timestamp(e.get("started_at")),
                step_id=e.get("step_id", ""),
            )
        )
    return run


def run_summary(row: RunSummary) -> types_pb2.Run:
    """A run as ListRuns shows it: its step counts, not its steps."""
    run = _run_head(row)
    for status, n in (row.step_counts or {}).items():
        run.step_counts[status] = n
    if row.start_at is not None:
        run.start_at.FromDatetime(row.start_at)
    return run


def step_error(e: Mapping[str, Any]) -> types_pb2.StepError:
    """One recorded error of a step, as read from cyclone.step_errors (Explain's rows
    carry no details nor retryable)."""
    return types_pb2.StepError(
        attempt=e["attempt"],
        kind=e["kind"],
        type=e["type"],
        message=e["message"],
        details=e.get("details", ""),
        retryable=e.get("retryable", False),
        at=convert.timestamp(e["at"]),
    )


def step_proto(s: StepJson, step_errors: list[types_pb2.StepError]) -> types_pb2.Step:
    """One step as GetRun shows it (with its journal when the row has one)."""
    step = types_pb2.Step(
        node=s["node"],
        action=s["action"],
        status=convert.STEP_STATUS[s["status"]],
        attempt=s["attempt"],
        max_attempts=s["max_attempts"],
        depends_on=s["depends_on"],
        trigger_rule=convert.TRIGGER_RULE_ENUM[s["trigger_rule"]],
        errors=step_errors,
        worker_id=s["worker_id"] or "",
        lease_expires_at=convert.timestamp(s["lease_expires_at"]),
        available_at=convert.timestamp(s["available_at"]),
        started_at=convert.timestamp(s["started_at"]),
        finished_at=convert.timestamp(s["finished_at"]),
        effect_uncertain=s["effect_uncertain"],
        last_heartbeat_at=convert.timestamp(s["last_heartbeat_at"]),
        resumes=s["resumes"],
        recoveries=s.get("recoveries") or 0,
        waiting_for=s["waiting_for"] or "",
        priority=s["priority"],
        concurrency_key=s["concurrency_key"] or "",
        build_id=s.get("build_id") or "",
        unsafe=bool(s.get("unsafe")),
    )
    step.timeout.FromNanoseconds(int(float(s["timeout_s"]) * 1e9))
    if "attempt_budget" in s:
        step.retry.max_attempts = s["attempt_budget"]
        step.retry.initial_backoff.FromNanoseconds(int(float(s["initial_backoff_s"]) * 1e9))
        step.retry.max_backoff.FromNanoseconds(int(float(s["max_backoff_s"]) * 1e9))
        step.retry.backoff_multiplier = s["backoff_multiplier"]
    step.concurrency_limit = s.get("concurrency_limit") or 0
    if waiting := s.get("waiting"):
        _waiting(step, waiting)
    elif reopens := s.get("rate_reopens_at"):
        set_flow_wait(step, "rate_limited", reopens)
    for field in ("input", "output", "progress"):
        convert.set_json(step, field, s[field])
    step.journal.extend(convert.step_call(j) for j in s.get("journal") or ())
    return step


#: Available at this time or later: a wait with no time limit (_wait_forever()).
FOREVER_YEAR = 9999


def _waiting(step: types_pb2.Step, waiting: str) -> None:
    """Step.waiting and the plain reason and time limit behind it."""
    what = step.waiting_for.partition(" ")[2]
    step.waiting = waiting
    step.waiting_reason = {
        "sleep": "a durable sleep",
        "event": f"event {what} (send it with SendEvent or `cyclone event send`)",
        "child": f"child run {what} to finish",
        "start": "its run's start time",
        "backoff": f"the retry backoff after attempt {step.attempt} failed",
    }.get(waiting, waiting)
    if step.HasField("available_at") and step.available_at.ToDatetime().year < FOREVER_YEAR:
        step.waiting_until.CopyFrom(step.available_at)


def set_flow_wait(step: types_pb2.Step, reason: str, until: Any) -> None:
    """A ready step that waits for a concurrency slot (GetRun and Explain count the key's
    running steps after reading the step) or for its action's rate limit (Explain's
    reasons concurrency_limited, rate_limited)."""
    if reason == "concurrency_limited":
        step.waiting = "concurrency"
        step.waiting_reason = (
            f"a free slot of concurrency key {step.concurrency_key!r} (it is full)"
        )
    elif reason == "rate_limited":
        step.waiting = "rate_limit"
        step.waiting_reason = f"the rate limit of action {step.action} (used up)"
        reopens = convert.timestamp(until)
        if reopens is not None:
            step.waiting_until.CopyFrom(reopens)


def run_proto(row: RunRow) -> types_pb2.Run:
    """A run with its steps, their errors and its audit trail."""
    run = _run_head(row)
    run.priority = row.priority
    if row.start_at is not None:
        run.start_at.FromDatetime(row.start_at)
    errors_by_node: dict[str, list[types_pb2.StepError]] = {}
    for e in row.errors:
        errors_by_node.setdefault(e["node"], []).append(step_error(e))
    for s in row.steps:
        step = step_proto(s, errors_by_node.get(s["node"], []))
        if row.status == "cancelled":
            for call in step.journal:
                if call.status == types_pb2.STEP_CALL_STATUS_WAITING:
                    call.status = types_pb2.STEP_CALL_STATUS_CANCELLED
        run.steps.append(step)
        run.step_counts[s["status"]] = run.step_counts[s["status"]] + 1
    for a in row.audit:
        entry = types_pb2.AuditEntry(
            action=a["action"],
            node=a["node"],
            actor=a["actor"],
            reason=a["reason"],
            at=convert.timestamp(a["at"]),
        )
        convert.set_json(entry, "details", a["details"])
        run.audit.append(entry)
    return run


#: BeginStepCall's decisions by the engine's names.
STEP_CALL_DECISION = {
    "run": worker_pb.STEP_CALL_DECISION_RUN,
    "recorded": worker_pb.STEP_CALL_DECISION_RECORDED,
    "uncertain": worker_pb.STEP_CALL_DECISION_UNCERTAIN,
}


#: Wait's decisions by the engine's names.
WAIT_DECISION = {
    "ready": worker_pb.WAIT_DECISION_READY,
    "suspended": worker_pb.WAIT_DECISION_SUSPENDED,
}


#: Explain's reasons (service.engine.explain) by their names in ExplainReason.
EXPLAIN_REASON = {
    name.removeprefix("EXPLAIN_REASON_").lower(): name
    for name, number in workflow_pb.ExplainReason.items()
    if number
}


def refusal(refused: Refused) -> worker_pb.CompleteError:
    """A refused batch item, with the status its single RPC would have answered."""
    error = refused.error
    status = status_of(error, "CompleteMany")
    answer = worker_pb.CompleteError(code=status.code.value[0], message=status.message)
    if isinstance(error, errors.LeaseLost) and error.current_attempt is not None:
        answer.current_attempt = error.current_attempt
    return answer


def rare_parts(r: ClaimedStep) -> worker_pb.ClaimedStep | None:
    """The parts of a claimed step that service.api.wire leaves to the Python API (its
    upstream failures, journal, run deadline and traceparent), or None when it has none."""
    if not r.upstream_failures and not r.journal and r.run_deadline is None and not r.traceparent:
        return None
    step = worker_pb.ClaimedStep()
    if r.run_deadline is not None:
        step.run_deadline.CopyFrom(convert.timestamp(r.run_deadline))
    if r.traceparent:
        step.traceparent = r.traceparent
    for u in r.upstream_failures or ():
        failure = step.upstream_failures.add(
            node=u["node"], status=convert.STEP_STATUS[u["status"]]
        )
        if (e := u["error"]) is not None:
            failure.error.CopyFrom(step_error(e))
    step.journal.extend(convert.step_call(j) for j in r.journal or ())
    return step


def log_line(row: LogRow) -> types_pb2.LogLine:
    line = types_pb2.LogLine(
        level=row.level, message=row.message, attempt=row.attempt, logger=row.logger
    )
    line.at.FromDatetime(row.at)
    return line


_RESULTS = wire.field_tag(worker_pb.CompleteManyResponse, "results")

#: CompleteManyResponse.results entries without a retry time, serialized, by (step
#: status, run status, duplicate): a few dozen at most, each made once.
_ANSWERS: dict[tuple[str, str, bool], bytes] = {}


def result_bytes(result: worker_pb.CompleteResult) -> bytes:
    """One entry of CompleteManyResponse.results, serialized."""
    return wire.length_delimited(_RESULTS, result.SerializeToString())


def answer_bytes(done: Completion) -> bytes:
    """The serialized CompleteManyResponse.results entry answering an applied outcome."""
    if done.retry_at is not None:
        return result_bytes(worker_pb.CompleteResult(response=complete_response(done)))
    key = (done.step_status, done.run_status, done.duplicate)
    answer = _ANSWERS.get(key)
    if answer is None:
        result = worker_pb.CompleteResult(response=complete_response(done))
        answer = _ANSWERS[key] = result_bytes(result)
    return answer


def complete_response(done: Completion) -> worker_pb.CompleteResponse:
    response = worker_pb.CompleteResponse(
        status=convert.STEP_STATUS[done.step_status],
        run_status=convert.RUN_STATUS[done.run_status],
        duplicate=done.duplicate,
    )
    if done.retry_at is not None:
        response.retry_at.FromDatetime(done.retry_at)
    return response


def attempt_of(run: types_pb2.Run, node: str) -> int:
    return next(s.attempt for s in run.steps if s.node == node)
