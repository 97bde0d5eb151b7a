"""Runs: submitting one (and a child run of a step call), reading one with its
steps, listing and counting them, their log lines, errors and what Explain reads."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from uuid6 import uuid7

from cyclone.dag import NodeSpec
from service import errors
from service.db.completion import StepCallKey
from service.db.pool import Repository
from service.db.records import (
    AuditJson,
    CancelJson,
    LastErrorJson,
    PauseJson,
    RunErrorJson,
    StepCallJson,
    StepErrorJson,
    StepJson,
    UpstreamJson,
)


class Submitted(NamedTuple):
    """run_submit"""

    run_id: uuid.UUID
    created: bool
    ready: str | None


class RunRow(NamedTuple):
    """run_get: a run with its steps, errors and audit trail."""

    run_id: uuid.UUID
    workflow: str
    status: str
    input: Any
    error: RunErrorJson | None
    submit_key: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    parent_run_id: uuid.UUID | None
    parent_node: str | None
    parent_step_id: str | None
    steps: list[StepJson]
    errors: list[StepErrorJson]
    audit: list[AuditJson]
    priority: int
    start_at: datetime | None
    paused_at: datetime | None
    paused_by: str | None
    pause_reason: str | None
    tags: dict[str, str] | None
    deadline: datetime | None


class RunSummary(NamedTuple):
    """runs_list: a run with the count of its steps by status."""

    run_id: uuid.UUID
    workflow: str
    status: str
    input: Any
    error: RunErrorJson | None
    submit_key: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    parent_run_id: uuid.UUID | None
    parent_node: str | None
    parent_step_id: str | None
    step_counts: dict[str, int] | None
    start_at: datetime | None
    paused_at: datetime | None
    paused_by: str | None
    pause_reason: str | None
    tags: dict[str, str] | None
    deadline: datetime | None


class WorkflowName(NamedTuple):
    """runs_workflows: one workflow name."""

    name: str


#: The filters of runs_list and runs_count, None when not given: ``run_id_range``
#: (lowest and highest id of a prefix), ``workflows`` (the names a prefix matched) and
#: ``key_like`` (a LIKE pattern) and ``tags`` (a JSON object the run's tags contain)
#: besides the exact ones.
RUN_FILTERS = (
    "workflow",
    "statuses",
    "created_after",
    "created_before",
    "key",
    "run_id_range",
    "workflows",
    "key_like",
    "tags",
)


def run_filter_params(filters: dict[str, Any]) -> dict[str, Any]:
    """The filters as the queries' parameters (each one absent: None; the tags apart,
    see Runs._lead_tag)."""
    unknown = set(filters) - set(RUN_FILTERS)
    assert not unknown, f"unknown run filters {unknown}"
    skipped = ("run_id_range", "tags")
    params = {name: filters.get(name) for name in RUN_FILTERS if name not in skipped}
    lo_hi = filters.get("run_id_range")
    params["run_id_lo"] = str(lo_hi[0]) if lo_hi else None
    params["run_id_hi"] = str(lo_hi[1]) if lo_hi else None
    return params


#: run_tag_size counts a tag's runs up to this: past it, a tag is as common as any.
TAG_SIZE_CAP = 10_000


class TagSize(NamedTuple):
    """run_tag_size: how many runs carry one tag, up to the cap asked."""

    n: int


class RunCountRow(NamedTuple):
    """runs_count: the runs in one status, counted up to the limit asked."""

    status: str
    n: int


class ChildStarted(NamedTuple):
    """child_start: the child run of a step call, and whether this call submitted it."""

    child_run_id: uuid.UUID
    created: bool
    call: StepCallJson
    ready: str | None


class LogRow(NamedTuple):
    """step_logs_get: one log line of a step's attempt."""

    node: str
    attempt: int
    seq: int
    at: datetime
    level: str
    logger: str
    message: str


class KeyRunningRow(NamedTuple):
    """keys_running: steps running under one concurrency key."""

    concurrency_key: str
    running: int


class RunErrorRow(NamedTuple):
    """runs_errors"""

    run_id: uuid.UUID
    error: Any


class ExplainFacts(NamedTuple):
    """step_explain: everything Explain needs about one step (step columns are None
    when the run has no such node)."""

    run_status: str
    run_error: RunErrorJson | None
    now: datetime
    node: str | None
    action: str
    status: str
    attempt: int
    max_attempts: int
    trigger_rule: str
    deps_open: int
    available_at: datetime | None
    lease_expires_at: datetime | None
    deadline_at: datetime | None
    worker_id: str | None
    started_at: datetime | None
    last_heartbeat_at: datetime | None
    finished_at: datetime | None
    unsafe: bool | None
    effect_uncertain: bool
    last_error: LastErrorJson | None
    upstream: list[UpstreamJson]
    failed_upstream: list[UpstreamJson] | None
    polled_at: datetime | None
    polled_by: str | None
    claimed_at: datetime | None
    claimed_by: str | None
    ready_ahead: int | None
    action_running: int | None
    cancel: CancelJson | None
    run_id: uuid.UUID
    waiting_for: str | None
    resumes: int | None
    recoveries: int | None
    concurrency_key: str | None
    concurrency_limit: int | None
    key_running: int | None
    rate_reopens_at: datetime | None
    pause: PauseJson | None


class ExplainCounts(NamedTuple):
    """step_explain_counts: Explain's counts of other steps (read across shards)."""

    ready_ahead: int | None
    action_running: int | None
    key_running: int | None


def submit_key_id(workflow: str, submit_key: str) -> uuid.UUID:
    """The id of a SubmitOnce key and of the run it makes, as cyclone.submit_key_id
    computes it: a name-based UUID (version 8) of SHA-256 over a prefix, the workflow, a
    NUL and the key."""
    digest = hashlib.sha256(
        b"cyclone submit key\0" + workflow.encode() + b"\0" + submit_key.encode()
    ).digest()
    raw = bytearray(digest[:16])
    raw[6] = raw[6] & 0x0F | 0x80
    raw[8] = raw[8] & 0x3F | 0x80
    return uuid.UUID(bytes=bytes(raw))


#: Nodes plus edges past which a workflow is validated and encoded in a worker thread
#: rather than on the event loop, so that other calls keep being answered meanwhile.
BIG_WORKFLOW = 2000


def nodes_json(nodes: Sequence[NodeSpec]) -> str:
    """The nodes of a validated workflow as run_submit's JSON argument; linear time.
    Encoded node by node: one call of the C encoder over megabytes would hold the GIL,
    and so the event loop, for all of its duration."""
    return (
        "["
        + ",".join(
            json.dumps(
                {
                    "name": n.name,
                    "action": n.action,
                    "depends_on": n.depends_on,
                    "trigger_rule": n.trigger_rule,
                    "max_attempts": n.max_attempts,
                    "initial_backoff_s": n.initial_backoff_s,
                    "max_backoff_s": n.max_backoff_s,
                    "backoff_multiplier": n.backoff_multiplier,
                    "timeout_s": n.timeout_s,
                    "input": n.input,
                    "dependents": n.dependents,
                    "priority": n.priority,
                    "concurrency_key": n.concurrency_key,
                    "concurrency_limit": n.concurrency_limit,
                    "position": i,
                },
                separators=(",", ":"),
            )
            for i, n in enumerate(nodes)
        )
        + "]"
    )


async def encoded_nodes(nodes: Sequence[NodeSpec]) -> str:
    """nodes_json, off the event loop for a large workflow."""
    if len(nodes) + sum(len(n.depends_on) for n in nodes) > BIG_WORKFLOW:
        # Encoding a large workflow takes a while: not on the event loop.
        return await asyncio.to_thread(nodes_json, nodes)
    return nodes_json(nodes)


class Runs(Repository):
    """Runs: created, read, listed, counted; their logs, errors and Explain's facts."""

    async def run_submit(
        self,
        *,
        workflow: str,
        nodes: Sequence[NodeSpec],
        input_json: str | None,
        submit_key: str | None,
        start_at: datetime | None = None,
        priority: int = 0,
        tags_json: str | None = None,
        deadline: datetime | None = None,
        traceparent: str | None = None,
    ) -> tuple[uuid.UUID, bool]:
        encoded = await encoded_nodes(nodes)
        # A keyed run's id is its key's: run_submit would take it anyway, and on Citus
        # the call is routed by it, to the node of its shard (Pool.shard_for).
        run_id = str(uuid7() if submit_key is None else submit_key_id(workflow, submit_key))
        rows = await self._all_on(
            self.pool.shard_for(run_id),
            "run_submit",
            Submitted,
            run_id=run_id,
            workflow=workflow,
            submit_key=submit_key,
            input=input_json,
            nodes=encoded,
            start_at=start_at,
            priority=priority,
            tags=tags_json,
            deadline=deadline,
            traceparent=traceparent,
        )
        assert rows
        return rows[0].run_id, rows[0].created

    async def run_get(self, run_id: uuid.UUID, node: str | None = None) -> RunRow:
        """The run with its steps (only ``node``'s when given), errors and audit trail."""
        row = await self._one("run_get", RunRow, run_id=str(run_id), node=node)
        if row is None:
            raise errors.NotFound(f"run {run_id} not found")
        return row

    async def runs_list(
        self,
        *,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        newer: bool = False,
        **filters: Any,
    ) -> list[RunSummary]:
        """A page of runs, newest first: older than ``after`` (the first page without
        it), or with ``newer`` the page just newer than it. ``filters``: see
        :data:`RUN_FILTERS`."""
        params = {
            **run_filter_params(filters),
            **await self._tag_params(filters.get("tags")),
            "after_created": after[0] if after else None,
            "after_run_id": str(after[1]) if after else None,
            "limit": limit,
        }
        if filters.get("tags"):
            name = "runs_list_tagged_newer" if newer else "runs_list_tagged"
        else:
            name = "runs_list_newer" if newer else "runs_list"
        rows = await self._all(name, RunSummary, **params)
        return rows[::-1] if newer else rows

    async def _tag_params(self, tags_json: str | None, sized: bool = False) -> dict[str, Any]:
        """A tag filter's parameters: the whole filter (a JSON object) and the tag whose
        index range leads the read, the rarest (each counted up to TAG_SIZE_CAP when
        there are several, or when ``sized``: then ``lead_size`` is the lead's count).
        None when no tags are given."""
        if not tags_json:
            return {}
        tags: dict[str, str] = json.loads(tags_json)
        sizes = {(key, value): TAG_SIZE_CAP for key, value in tags.items()}
        if len(tags) > 1 or sized:
            for key, value in tags.items():
                row = await self._one(
                    "run_tag_size", TagSize, tag_key=key, tag_value=value, cap=TAG_SIZE_CAP
                )
                assert row is not None
                sizes[key, value] = row.n
        lead = min(sizes, key=lambda tag: sizes[tag])
        params = {"tags": tags_json, "tag_key": lead[0], "tag_value": lead[1]}
        return {**params, "lead_size": sizes[lead]} if sized else params

    async def runs_workflows(self, prefix: str, limit: int) -> list[str]:
        """The workflow names that start with ``prefix``, at most ``limit``."""
        rows = await self._all("runs_workflows", WorkflowName, prefix=prefix, limit=limit)
        return [r.name for r in rows]

    async def runs_count(
        self, *, statuses: list[str], limit: int, **filters: Any
    ) -> dict[str, int]:
        """Runs per status in ``statuses``, each counted up to ``limit``. With tags
        whose rarest is carried by fewer than TAG_SIZE_CAP runs, those runs are read
        once and counted by status (exact); else each status is counted apart."""
        tag_params = await self._tag_params(filters.get("tags"), sized=True)
        whole = tag_params.pop("lead_size", TAG_SIZE_CAP) < TAG_SIZE_CAP
        if whole:
            name = "runs_count_tag_whole"
        else:
            name = "runs_count_tagged" if tag_params else "runs_count"
        rows = await self._all(
            name,
            RunCountRow,
            **{**run_filter_params(filters), "statuses": statuses},
            **tag_params,
            **({} if whole else {"limit": limit}),
        )
        return {**dict.fromkeys(statuses, 0), **{r.status: r.n for r in rows}}

    async def child_start(
        self,
        parent: StepCallKey,
        *,
        workflow: str,
        nodes: Sequence[NodeSpec],
        input_json: str | None,
    ) -> ChildStarted:
        """StartChild: submit the child run of one step call of a held step, or find the
        one it started before."""
        encoded = await encoded_nodes(nodes)
        key = parent.params()
        del key["function"], key["unsafe"], key["args_digest"]
        row = await self._one(
            "child_start",
            ChildStarted,
            **key,
            child_run_id=str(uuid7()),
            workflow=workflow,
            input=input_json,
            nodes=encoded,
        )
        assert row is not None
        return row

    async def step_logs(
        self, run_id: uuid.UUID, node: str | None = None, attempt: int | None = None
    ) -> list[LogRow]:
        """A run's log lines (one node's, one attempt's), by node, attempt and order."""
        return await self._all(
            "step_logs_get", LogRow, run_id=str(run_id), node=node, attempt=attempt
        )

    async def keys_running(self, keys: Sequence[str]) -> dict[str, int]:
        """How many steps run under each of ``keys`` (a key with none is left out)."""
        rows = await self._all("keys_running", KeyRunningRow, keys=list(keys))
        return {r.concurrency_key: r.running for r in rows}

    async def runs_errors(self, run_ids: Sequence[str]) -> dict[str, Any]:
        """The errors of these runs (those a claim blocked), by run (ids as text)."""
        rows = await self._all("runs_errors", RunErrorRow, run_ids=list(run_ids))
        return {str(row.run_id): row.error for row in rows}

    async def step_explain(self, run_id: uuid.UUID, node: str) -> ExplainFacts:
        """What Explain needs about one step; NotFound for an unknown run or node."""
        row = await self._one("step_explain", ExplainFacts, run_id=str(run_id), node=node)
        if row is None:
            raise errors.NotFound(f"run {run_id} not found")
        if row.node is None:
            raise errors.NotFound(f"run {run_id} has no node {node!r}")
        counts = await self._one(
            "step_explain_counts", ExplainCounts, run_id=str(run_id), node=node
        )
        return row if counts is None else row._replace(**counts._asdict())
