"""Completion: outcomes applied one by one or in a batch, and step calls begun
and ended, alone or with outcomes in one transaction (step_report_many)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, NamedTuple, Protocol, TypeVar

from service import errors
from service.db.pool import Pool, Repository, domain_error
from service.db.records import (
    Completion,
    Outcome,
    Refused,
    StepCallBegun,
    StepCallEnded,
    StepCallJson,
)

T = TypeVar("T")


class ByShard(Protocol):
    """Outcomes applied on a sharded database (service.db.shard_reports.ShardReports)."""

    async def complete(self, outcomes: Sequence[Outcome]) -> list[Completion | Refused]: ...


class ShardRowLike(Protocol):
    """An answer row of a batch: step_complete_many's, or step_complete_shard's."""

    @property
    def step_status(self) -> str | None: ...
    @property
    def run_status(self) -> str | None: ...
    @property
    def duplicate(self) -> bool | None: ...
    @property
    def retry_at(self) -> datetime | None: ...
    @property
    def error_state(self) -> str | None: ...
    @property
    def error_message(self) -> str | None: ...
    @property
    def error_detail(self) -> str | None: ...


class OutcomeRow(NamedTuple):
    """step_complete, step_fail, step_abandon"""

    step_status: str
    run_status: str
    duplicate: bool
    retry_at: datetime | None
    ready: str | None


class BatchRow(NamedTuple):
    """step_complete_many: one row per item; error_state set when it was refused."""

    i: int
    step_status: str | None
    run_status: str | None
    duplicate: bool | None
    retry_at: datetime | None
    error_state: str | None
    error_message: str | None
    error_detail: str | None
    ready: str | None


class ReportRow(NamedTuple):
    """step_report_many: one row per item, a step call's end (kind "end") or begin
    ("begin"), or a completion ("step"); error_state set when it was refused."""

    kind: str
    i: int
    step_status: str | None
    run_status: str | None
    duplicate: bool | None
    retry_at: datetime | None
    decision: str | None
    call: StepCallJson | None
    error_state: str | None
    error_message: str | None
    error_detail: str | None
    ready: str | None


@dataclass(frozen=True, slots=True)
class Report:
    """step_report_many's answers, one per item of each kind, in request order."""

    ends: list[StepCallEnded | Refused]
    begins: list[StepCallBegun | Refused]
    completions: list[Completion | Refused]


@dataclass(frozen=True, slots=True)
class StepCallEnd:
    """The end of one step call: its key and exactly one of output or error (JSON)."""

    key: StepCallKey
    output_json: str | None
    error_json: str | None


@dataclass(frozen=True, slots=True)
class StepCallKey:
    """One step call of a held step, as BeginStepCall and EndStepCall name it (ids as
    canonical text, service.api.ids.uuid_text)."""

    run_id: str
    node: str
    lease_token: str
    step_id: str
    seq: int
    function: str
    unsafe: bool
    #: The digest of the call's arguments (64 lowercase hex characters), or "" for none.
    args_digest: str = ""

    def params(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "node": self.node,
            "lease_token": self.lease_token,
            "step_id": self.step_id,
            "seq": self.seq,
            "function": self.function,
            "unsafe": self.unsafe,
            "args_digest": self.args_digest,
        }


class _RawJson(str):
    """JSON text to embed as is when dumping a batch."""


def outcomes_json(outcomes: Sequence[Outcome]) -> str:
    """step_complete_many's items, a JSON array of {i, run_id, node, lease_token,
    output | failure}. An outcome's ids are canonical UUID text and its node a checked
    name (service.db.records.Outcome): they are written as they are, and its output is
    JSON text already, so only a failure goes through the JSON encoder."""
    items = []
    for i, o in enumerate(outcomes):
        head = f'{{"i":{i},"run_id":"{o.run_id}","node":"{o.node}","lease_token":"{o.lease_token}"'
        if o.failure is None:
            items.append(f'{head},"output":{o.output_json or "null"}}}')
        else:
            failure = json.dumps(asdict(o.failure), separators=(",", ":"))
            items.append(f'{head},"failure":{failure}}}')
    return "[" + ",".join(items) + "]"


def logs_items(outcomes: Sequence[Outcome]) -> str | None:
    """step_logs_add's items for the outcomes that carry log lines; None when none does."""
    items = [
        {
            "run_id": o.run_id,
            "node": o.node,
            "lease_token": o.lease_token,
            "lines": _RawJson(o.logs_json),
        }
        for o in outcomes
        if o.logs_json is not None
    ]
    return _dump_items(items) if items else None


def _dump_items(items: list[dict[str, Any]]) -> str:
    # Outputs and errors already JSON text (_RawJson) are spliced in rather than
    # parsed and dumped again.
    parts = []
    for item in items:
        raws = {k: item.pop(k) for k in [k for k, v in item.items() if isinstance(v, _RawJson)]}
        text = json.dumps(item, separators=(",", ":"))
        for key, raw in raws.items():
            text = f'{text[:-1]},"{key}":{raw}}}'
        parts.append(text)
    return "[" + ",".join(parts) + "]"


async def _alone(call: Awaitable[T]) -> T | Refused:
    """One item of a batch applied on its own (a sharded database): its refusal is its
    answer, as in a batch; an unavailable database still fails the call."""
    try:
        return await call
    except errors.Unavailable:
        raise
    except errors.CycloneError as exc:
        return Refused(exc)


def batch_answer(row: BatchRow | ShardRowLike) -> Completion | Refused:
    if row.error_state is not None:
        return Refused(domain_error(row.error_state, row.error_message or "", row.error_detail))
    assert row.step_status is not None and row.run_status is not None
    return Completion(row.step_status, row.run_status, bool(row.duplicate), row.retry_at)


class Reports(Repository):
    """Outcomes applied and step calls begun and ended (cyclone.step_* transitions)."""

    def __init__(self, pool: Pool, by_shard: ByShard) -> None:
        super().__init__(pool)
        #: Outcomes on a sharded database, applied where their runs live.
        self.by_shard = by_shard

    async def step_complete(self, outcome: Outcome) -> Completion:
        """Apply one outcome: an output, or a failure (step_fail; step_abandon when an
        unsafe handler stopped without an outcome). On a sharded database, on the node
        that holds its run."""
        if await self.is_sharded():
            [answer] = await self.by_shard.complete([outcome])
            if isinstance(answer, Refused):
                raise answer.error
            return answer
        key = {"run_id": outcome.run_id, "node": outcome.node, "lease_token": outcome.lease_token}
        failure = outcome.failure
        logs = logs_items([outcome])
        if failure is None:
            [row] = await self._logged(
                "step_complete", OutcomeRow, logs, **key, output=outcome.output_json
            )
        elif failure.uncertain:
            [row] = await self._logged(
                "step_abandon",
                OutcomeRow,
                logs,
                **key,
                type=failure.type,
                message=failure.message,
                details=failure.details,
            )
        else:
            [row] = await self._logged(
                "step_fail",
                OutcomeRow,
                logs,
                **key,
                type=failure.type,
                message=failure.message,
                details=failure.details,
                retryable=failure.retryable,
                retry_after_s=failure.retry_after_s,
            )
        return Completion(row.step_status, row.run_status, row.duplicate, row.retry_at)

    async def step_complete_many(self, outcomes: Sequence[Outcome]) -> list[Completion | Refused]:
        """Apply several outcomes in one transaction; one answer per outcome, in order.
        An outcome the engine refused (a lost lease, an unknown step) is a Refused that
        changed nothing, and does not affect the others. On a sharded database the
        outcomes of each shard are one transaction on the node that holds it
        (docs/scaling.md)."""
        if await self.is_sharded():
            return await self.by_shard.complete(outcomes)
        rows = await self._logged(
            "step_complete_many", BatchRow, logs_items(outcomes), items=outcomes_json(outcomes)
        )
        return [batch_answer(row) for row in sorted(rows, key=lambda r: r.i)]

    async def step_report_many(
        self,
        ends: Sequence[StepCallEnd],
        begins: Sequence[StepCallKey],
        outcomes: Sequence[Outcome],
        *,
        brief: bool = False,
    ) -> Report:
        """End step calls, begin others, then apply outcomes, in one transaction: one
        answer per item, in order, each refusal standing alone as in
        step_complete_many, committed durably (ends too: a body's next step call
        starts only once its last one's end is recorded). ``brief``: the entries of
        ends and of RUN answers may be left out (None). On a sharded database each item
        is its own single-shard transaction, in the same order (docs/scaling.md)."""
        if await self.is_sharded():
            return await self._report_alone(ends, begins, outcomes)
        end_items = []
        for i, end in enumerate(ends):
            item: dict[str, Any] = {"i": i, **end.key.params()}
            if end.error_json is not None:
                item["error"] = _RawJson(end.error_json)
            else:
                item["output"] = _RawJson(end.output_json or "null")
            end_items.append(item)
        rows = await self._logged(
            "step_report_many",
            ReportRow,
            logs_items(outcomes),
            ends=_dump_items(end_items),
            begins=_dump_items([{"i": i, **key.params()} for i, key in enumerate(begins)]),
            items=outcomes_json(outcomes),
            brief=brief,
        )
        answers: dict[tuple[str, int], Any] = {}
        for row in rows:
            if row.error_state is not None:
                answers[row.kind, row.i] = Refused(
                    domain_error(row.error_state, row.error_message or "", row.error_detail)
                )
            elif row.kind == "end":
                assert (brief or row.call is not None) and row.duplicate is not None
                answers[row.kind, row.i] = StepCallEnded(row.duplicate, row.call)
            elif row.kind == "begin":
                assert row.decision is not None and row.run_status is not None
                answers[row.kind, row.i] = StepCallBegun(row.decision, row.run_status, row.call)
            else:
                assert row.step_status is not None and row.run_status is not None
                answers[row.kind, row.i] = Completion(
                    row.step_status, row.run_status, bool(row.duplicate), row.retry_at
                )
        # A missing answer is a KeyError: a bug, answered INTERNAL.
        return Report(
            ends=[answers["end", i] for i in range(len(ends))],
            begins=[answers["begin", i] for i in range(len(begins))],
            completions=[answers["step", i] for i in range(len(outcomes))],
        )

    async def _report_alone(
        self,
        ends: Sequence[StepCallEnd],
        begins: Sequence[StepCallKey],
        outcomes: Sequence[Outcome],
    ) -> Report:
        """step_report_many item by item (Citus: a transaction may lock one shard)."""
        ended = [
            await _alone(
                self.step_call_end(e.key, output_json=e.output_json, error_json=e.error_json)
            )
            for e in ends
        ]
        begun = [await _alone(self.step_call_begin(key)) for key in begins]
        done = await self.by_shard.complete(outcomes) if outcomes else []
        return Report(ends=ended, begins=begun, completions=done)

    async def step_call_begin(self, call: StepCallKey) -> StepCallBegun:
        """BeginStepCall: what the caller must do with one step call of a held step."""
        row = await self._one("step_call_begin", StepCallBegun, **call.params())
        assert row is not None
        return row

    async def step_call_end(
        self, call: StepCallKey, *, output_json: str | None, error_json: str | None
    ) -> StepCallEnded:
        """EndStepCall: record one step call's outcome (exactly one of the two)."""
        row = await self._one(
            "step_call_end", StepCallEnded, **call.params(), output=output_json, error=error_json
        )
        assert row is not None
        return row
