"""Request validation shared by the services: texts, names, limits, page tokens,
the log lines and waits of worker requests. Raises domain errors (service.errors)."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, TypeAlias, TypeVar

import grpc
from google.protobuf import duration_pb2

from cyclone import dag
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
from service.api import auth, convert
from service.api.ids import parse_uuid
from service.config import Settings
from service.db.waits import WaitKey
from service.engine.waits import event_wait

T = TypeVar("T")

MAX_WORKER_ID = 200

#: The longest ClaimRequest.shard_node (a host name of up to 253 characters, a port).
MAX_SHARD_NODE = 300

MAX_REASON = 2000

MAX_ERROR_TEXT = 64 * 1024

#: Most JSON text a step call's error may keep in args and attributes together.
MAX_ERROR_DATA = 16 * 1024

#: Longest step_id and function name of a step call, and the largest seq.
MAX_STEP_CALL_NAME = 200

MAX_STEP_CALL_SEQ = 100_000

#: Most step calls one node's journal holds (the engine's limit, cyclone.step_call_begin
#: and its kin in service/schema/45_step_calls.sql).
MAX_STEP_CALLS = 10_000

#: Most actions one Claim may name.
MAX_CLAIM_ACTIONS = 1000

#: The function a child run's step call is journaled under (StartChild).
CHILD_FUNCTION = "cyclone.start_child"


def seconds(d: duration_pb2.Duration) -> float:
    return d.seconds + d.nanos / 1e9


def text(value: str, what: str, limit: int) -> str:
    if len(value) > limit:
        raise errors.InvalidArgument(f"{what} is {len(value)} characters; the limit is {limit}")
    if "\x00" in value:
        raise errors.InvalidArgument(f"{what} contains a NUL character")
    return value


#: A run's tags: at most MAX_TAGS; a key of 1-MAX_TAG_KEY ASCII letters, digits or
#: . _ - / : ; a value of at most MAX_TAG_VALUE characters, no NUL. A ListRuns or
#: CountRuns filter names at most MAX_TAG_FILTER of them.
MAX_TAGS = 16

MAX_TAG_KEY = 64

MAX_TAG_VALUE = 256

MAX_TAG_FILTER = 4

_TAG_KEY = re.compile(r"[A-Za-z0-9._\-/:]+")


def tag_key(key: str, field: str) -> str:
    """A tag's key, checked; its errors name the field and quote the key."""
    if not key:
        raise errors.InvalidArgument(f"{field}: a tag key is empty")
    if len(key) > MAX_TAG_KEY:
        raise errors.InvalidArgument(
            f"{field}: tag key {dag.excerpt(key)} is {len(key)} characters; "
            f"at most {MAX_TAG_KEY} are allowed"
        )
    if not _TAG_KEY.fullmatch(key):
        raise errors.InvalidArgument(
            f"{field}: tag key {dag.excerpt(key)} may hold only ASCII letters, digits and . _ - / :"
        )
    return key


def tags_json(tags: Mapping[str, str], field: str, most: int = MAX_TAGS) -> str | None:
    """Tags (a request's map), checked, as the JSON object the engine stores and
    matches; None for none."""
    if len(tags) > most:
        raise errors.InvalidArgument(f"{field} has {len(tags)} tags; at most {most} are allowed")
    for key, value in sorted(tags.items()):
        tag_key(key, field)
        if len(value) > MAX_TAG_VALUE:
            raise errors.InvalidArgument(
                f"{field}: the value of tag {key!r} is {len(value)} characters; "
                f"at most {MAX_TAG_VALUE} are allowed"
            )
        if "\x00" in value:
            raise errors.InvalidArgument(
                f"{field}: the value of tag {key!r} contains a NUL character"
            )
    return json.dumps(dict(sorted(tags.items()))) if tags else None


Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


def actor_of(context: Context) -> str:
    """Who to name in audit entries: the authenticated caller when auth is on."""
    identity = auth.caller.get()
    if identity is not None:
        return identity.name
    for key, value in context.invocation_metadata() or ():
        if key == "cyclone-actor" and value:
            return text(str(value), "cyclone-actor metadata", 200)
    return context.peer() or "unknown"


def step_call_name(value: str, what: str) -> str:
    """A step call's step_id or function: 1 to 200 printable characters."""
    if not value:
        raise errors.InvalidArgument(f"{what} is required")
    if len(value) > MAX_STEP_CALL_NAME:
        raise errors.InvalidArgument(
            f"{what} is {len(value)} characters; the limit is {MAX_STEP_CALL_NAME}"
        )
    if not value.isprintable():
        raise errors.InvalidArgument(
            f"{what} {dag.excerpt(value)} holds a control or other unprintable character"
        )
    return value


#: A step call's arguments digest: a SHA-256 as lowercase hexadecimal.
_ARGS_DIGEST = re.compile(r"[0-9a-f]{64}")


def args_digest(value: str) -> str:
    """A step call's args_digest: empty (none), or 64 lowercase hexadecimal characters."""
    if value and not _ARGS_DIGEST.fullmatch(value):
        raise errors.InvalidArgument(
            f"args_digest must be 64 lowercase hexadecimal characters (a SHA-256) or empty, "
            f"got {dag.excerpt(value)}"
        )
    return value


#: Most node names WorkerServicer keeps as checked (node_names).
MAX_NODE_NAMES = 10_000


def node_name(value: str) -> str:
    dag.check_name("node", value)
    return value


def payloads_of(settings: Settings) -> convert.Payloads:
    return convert.Payloads(settings.max_payload_bytes, settings.max_json_depth)


def limits_of(settings: Settings) -> dag.Limits:
    """The workflow limits of this server (--max-nodes and the others)."""
    return dag.Limits(
        settings.max_nodes, settings.max_dependencies, settings.max_dependents, settings.max_edges
    )


def page_size(asked: int) -> int:
    """A List call's page size: 1 to 1000, 50 when not given."""
    size = asked or 50
    if not 1 <= size <= 1000:
        raise errors.InvalidArgument(f"page_size must be between 1 and 1000, got {size}")
    return size


def item(i: int, field: str, parse: Callable[[Any], T], request: Any) -> T:
    """One item of a batch, validated; its errors name it (field[i])."""
    try:
        return parse(request)
    except (errors.CycloneError, dag.InvalidWorkflow) as exc:
        raise type(exc)(f"{field}[{i}]: {exc}") from None


#: CountRuns counts each status exactly up to its limit: this one by default, at most
#: MAX_COUNT_LIMIT (each count reads up to limit + 1 index entries).
DEFAULT_COUNT_LIMIT = 1000

MAX_COUNT_LIMIT = 100_000

#: Longest worker_id or action a ListSteps filter takes.
MAX_FILTER = 200

#: ListWorkers' most workers.
MAX_WORKERS_LISTED = 1000


def run_filters(
    request: workflow_pb.ListRunsRequest | workflow_pb.CountRunsRequest,
) -> dict[str, Any]:
    """ListRuns' and CountRuns' filters, validated, as the db wing takes them."""
    if len(request.statuses) > len(convert.RUN_STATUS):
        raise errors.InvalidArgument(
            f"statuses names {len(request.statuses)} statuses; there are {len(convert.RUN_STATUS)}"
        )
    statuses = []
    for s in request.statuses:
        if s not in convert.RUN_STATUS_NAME:
            raise errors.InvalidArgument(f"unknown run status {s} in statuses")
        statuses.append(convert.RUN_STATUS_NAME[s])
    if request.workflow:
        dag.check_name("workflow", request.workflow)
    if request.key:
        dag.check_submit_key(request.key)
    return {
        "workflow": request.workflow or None,
        "statuses": statuses or None,
        "created_after": (
            convert.to_datetime(request.created_after, "created_after")
            if request.HasField("created_after")
            else None
        ),
        "created_before": (
            convert.to_datetime(request.created_before, "created_before")
            if request.HasField("created_before")
            else None
        ),
        "key": request.key or None,
        "run_id_range": run_id_range(request.run_id_prefix),
        "workflow_prefix": name_prefix("workflow_prefix", request.workflow_prefix),
        "key_like": key_like(request.key_prefix),
        "tags": tags_json(request.tags, "tags", MAX_TAG_FILTER),
    }


#: Most workflow names a run filter's workflow_prefix may match.
MAX_PREFIX_NAMES = 1000


async def resolved_run_filters(
    request: workflow_pb.ListRunsRequest | workflow_pb.CountRunsRequest,
    workflows: Callable[[str, int], Awaitable[list[str]]],
) -> dict[str, Any]:
    """run_filters, a workflow prefix turned into the names it matches (``workflows``:
    the names that start with a prefix, at most a limit)."""
    filters = run_filters(request)
    prefix = filters.pop("workflow_prefix")
    if prefix is not None:
        names = await workflows(prefix, MAX_PREFIX_NAMES + 1)
        if len(names) > MAX_PREFIX_NAMES:
            raise errors.InvalidArgument(
                f"workflow_prefix {dag.excerpt(prefix)} matches more than "
                f"{MAX_PREFIX_NAMES} workflows; give more of the name"
            )
        filters["workflows"] = names
    return filters


_HEX = re.compile(r"[0-9a-f]{1,32}")


def run_id_range(prefix: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The lowest and highest run id that start with these hex digits (dashes and
    surrounding blanks ignored); None when no prefix is given."""
    if not prefix:
        return None
    digits = prefix.strip().replace("-", "").lower()
    if not _HEX.fullmatch(digits):
        raise errors.InvalidArgument(
            f"run_id_prefix {dag.excerpt(prefix)} is not 1 to 32 hex digits of a run id"
        )
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def name_prefix(field: str, prefix: str) -> str | None:
    if not prefix:
        return None
    if len(prefix) > dag.MAX_NAME_LENGTH:
        raise errors.InvalidArgument(
            f"{field} is {len(prefix)} characters; a name has at most {dag.MAX_NAME_LENGTH}"
        )
    return prefix


def key_like(prefix: str) -> str | None:
    """A LIKE pattern for the keys that start with ``prefix``."""
    if not prefix:
        return None
    if len(prefix) > dag.MAX_SUBMIT_KEY_LENGTH or "\x00" in prefix:
        raise errors.InvalidArgument(
            f"key_prefix: at most {dag.MAX_SUBMIT_KEY_LENGTH} characters and no NUL"
        )
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def steps_kind(request: workflow_pb.ListStepsRequest) -> str:
    """Which steps a ListSteps request lists: running, backing_off or ready."""
    available = (types_pb2.STEP_STATUS_UNSPECIFIED, types_pb2.STEP_STATUS_AVAILABLE)
    if request.ready:
        if request.backing_off or request.lease_expired or request.status not in available:
            raise errors.InvalidArgument(
                "ready lists the available steps due now; it cannot be combined with "
                "backing_off, lease_expired or another status"
            )
        if not request.action:
            raise errors.InvalidArgument("ready needs an action: the ready steps of which action")
        return "ready"
    if request.backing_off:
        if request.status not in available:
            raise errors.InvalidArgument(
                "backing_off lists available steps; it cannot be combined with status "
                + types_pb2.StepStatus.Name(request.status)
            )
        if request.lease_expired:
            raise errors.InvalidArgument("lease_expired applies to running steps only")
        return "backing_off"
    if request.status != types_pb2.STEP_STATUS_RUNNING:
        raise errors.InvalidArgument(
            "status must be STEP_STATUS_RUNNING, or set backing_off for the available "
            "steps backing off, or ready for an action's ready steps; other steps are "
            "listed per run (GetRun)"
        )
    return "running"


def encode_page_token(at: datetime, run_id: uuid.UUID, node: str | None = None) -> str:
    """A position in a list: a run's (created_at, run_id), or a step's (time, run_id,
    node)."""
    parts = [at.isoformat(), str(run_id)] + ([node] if node is not None else [])
    return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode()


#: Longer than any token this server issues (about 100 characters).
MAX_PAGE_TOKEN = 256


def decode_page_token(token: str) -> tuple[datetime, uuid.UUID]:
    """The run a ListRuns page token names."""
    at, run_id, _ = decode_position(token, node=False)
    return at, run_id


#: The mark of a ListRuns token for the page of newer runs (prev_page_token).
NEWER = "newer"


def decode_runs_page_token(token: str) -> tuple[datetime, uuid.UUID, bool]:
    """The run a ListRuns page token names, and whether it asks for the newer page."""
    try:
        return (*decode_page_token(token), False)
    except errors.InvalidArgument:
        at, run_id, mark = decode_position(token)
        if mark != NEWER:
            raise
        return at, run_id, True


def decode_position(token: str, *, node: bool = True) -> tuple[datetime, uuid.UUID, str]:
    """The position a page token names (a step's with ``node``; else node is "").
    Anything this server did not issue (too long, not base64, not a JSON list of two
    strings, or three for a step, a naive time, not a UUID) is INVALID_ARGUMENT, and a
    token is never parsed past its length limit."""
    bad = errors.InvalidArgument("page_token is not one this server issued")
    if len(token) > MAX_PAGE_TOKEN:
        raise bad
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
        if not (
            isinstance(decoded, list)
            and len(decoded) == (3 if node else 2)
            and all(isinstance(part, str) for part in decoded)
        ):
            raise bad
        at = datetime.fromisoformat(decoded[0])
        if at.tzinfo is None:
            raise bad
        return at, uuid.UUID(decoded[1]), decoded[2] if node else ""
    except (ValueError, TypeError, UnicodeError, RecursionError):
        raise bad from None


#: Lines one Heartbeat or Complete may carry; the cap per attempt is the engine's
#: (service/schema/55_step_logs.sql: 1000 lines, 256 KiB), this bounds one request.
MAX_LOG_LINES = 1001

MAX_LOG_MESSAGE = 4096


def logs_json(
    request: worker_pb.HeartbeatRequest | worker_pb.CompleteRequest | worker_pb.WaitRequest,
) -> str | None:
    """step_logs_add's lines of a request, as JSON; None when it carries none. Every line
    sent is checked, kept or not: a NUL character in a text (which Postgres refuses) or
    a time outside the Timestamp range refuses the whole request, naming the line."""
    if not request.logs:
        return None
    lines = []
    for i, line in enumerate(request.logs):
        level, logger, message = line.level, line.logger, line.message
        for field, text in (("level", level), ("logger", logger), ("message", message)):
            if "\x00" in text:
                raise errors.InvalidArgument(f"logs[{i}].{field} contains a NUL character")
        at = convert.to_datetime(line.at, f"logs[{i}].at") if line.HasField("at") else None
        if i >= MAX_LOG_LINES:
            continue  # more than an attempt keeps: checked, not sent on
        item: dict[str, Any] = {
            "level": level[:16],
            "logger": logger[:200],
            "message": message[:MAX_LOG_MESSAGE],
        }
        if at is not None:
            item["at"] = at.isoformat()
        lines.append(item)
    return json.dumps(lines, ensure_ascii=False)


def check_seq(seq: int) -> None:
    if not 1 <= seq <= MAX_STEP_CALL_SEQ:
        raise errors.InvalidArgument(f"seq must be between 1 and {MAX_STEP_CALL_SEQ}, got {seq}")


def wait_key(run_id: str, node: str, token: str, request: worker_pb.WaitRequest) -> WaitKey:
    """A validated Wait: the step call's key and what it waits for."""
    check_seq(request.seq)
    key = WaitKey(run_id, node, token, step_call_name(request.step_id, "step_id"), request.seq, "")
    until = request.WhichOneof("until")
    if until == "wake_at":
        wake_at = convert.to_datetime(request.wake_at, "wake_at")
        return dataclasses.replace(key, function="cyclone.sleep", wake_at=wake_at)
    if until == "event":
        event = request.event
        timeout = seconds(event.timeout) if event.HasField("timeout") else None
        name, timeout = event_wait(event.name, timeout, "event")
        return dataclasses.replace(key, function="cyclone.event", event=name, timeout_s=timeout)
    if until == "child_run_id":
        child = parse_uuid(request.child_run_id, "child_run_id")
        return dataclasses.replace(key, function="cyclone.child", child=child)
    raise errors.InvalidArgument("until is required: wake_at, event or child_run_id")
