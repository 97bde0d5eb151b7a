"""Completions' accounting: each outcome applied is counted, timed against its
hand-out and logged; a step call found uncertain ends its node's lease; and a report
(CompleteMany, a Work stream's report) is applied in one call of the db wing."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from service.db import Database
from service.db.completion import Report, StepCallEnd, StepCallKey
from service.db.records import Completion, Outcome, Refused, StepCallBegun
from service.engine.activity import Handouts
from service.metrics import Metrics

log = logging.getLogger("cyclone")

_FAILED_OUTCOME = {"available": "retry", "pending": "held", "uncertain": "uncertain"}

_FINAL = ("completed", "discarded")

_FINAL_RUN = ("completed", "failed")


class Outcomes:
    """The bookkeeping of outcomes and step calls applied for workers."""

    def __init__(self, db: Database, metrics: Metrics, handouts: Handouts) -> None:
        self.db = db
        self.metrics = metrics
        self.handouts = handouts
        # The finished-runs counter by final status: labels() costs a lock per call.
        self.finished_by_status: dict[str, Any] = {}

    async def apply(
        self,
        ends: Sequence[StepCallEnd],
        begins: Sequence[StepCallKey],
        outcomes: Sequence[Outcome],
        *,
        brief: bool,
    ) -> tuple[Report | None, Sequence[Completion | Refused]]:
        """A report's items applied in one transaction: with step calls, the db wing's
        whole report; with outcomes alone, just their answers."""
        if ends or begins:
            report = await self.db.reports.step_report_many(ends, begins, outcomes, brief=brief)
            return report, report.completions
        return None, await self.db.reports.step_complete_many(outcomes)

    def uncertain_call(self, call: StepCallKey, row: StepCallBegun) -> None:
        """A step call begun UNCERTAIN: the node's lease is over, no outcome of it will
        come."""
        handout = self.handouts.pop(call.lease_token)
        if row.run_status == "blocked":
            self.metrics.blocked.labels(handout.action if handout else "").inc()
        log_uncertain_call(call, row)

    def finished(self, status: str) -> Any:
        """The counter of runs finished with ``status``."""
        finished = self.finished_by_status.get(status)
        if finished is None:
            finished = self.finished_by_status[status] = self.metrics.finished.labels(status)
        return finished

    def applied(
        self,
        outcome: Outcome,
        done: Completion,
        now: float | None = None,
        finished: dict[str, int] | None = None,
    ) -> bool:
        """Count, time and log an accepted outcome. True when its log line still needs
        the attempt: the step was handed out by another server. ``now``: time.monotonic()
        of the answer, when the caller has it; ``finished``: runs finished by status,
        tallied there for the caller to count rather than counted here."""
        if done.duplicate:
            return False
        failure = outcome.failure
        m = self.metrics
        if failure is None:
            m.completed.inc()
        else:
            m.failed.labels(_FAILED_OUTCOME.get(done.step_status, done.step_status)).inc()
            if done.step_status == "discarded":
                m.discarded.labels("handler").inc()
        if done.run_status in _FINAL_RUN and done.step_status in _FINAL:
            if finished is None:
                self.finished(done.run_status).inc()
            else:
                finished[done.run_status] = finished.get(done.run_status, 0) + 1
        handout = self.handouts.pop(outcome.lease_token)
        if handout is not None and handout.traceparent and self.handouts.spans is not None:
            self.handouts.spans.completed(
                handout.traceparent, outcome.run_id, outcome.node, done.step_status, done.run_status
            )
        if done.step_status == "uncertain":
            # An unsafe handler stopped without an outcome: the run is blocked now.
            m.blocked.labels(handout.action if handout else "").inc()
        logged = failure is not None or log.isEnabledFor(logging.DEBUG)
        if handout is None:
            return logged
        per_action = m.action(handout.action)
        seconds = per_action.completed_seconds if failure is None else per_action.failed_seconds
        seconds.observe((time.monotonic() if now is None else now) - handout.claimed)
        if logged:
            log_outcome(outcome, done, handout.attempt)
        return False

    async def attempt(self, outcome: Outcome) -> int | None:
        """The attempt of a step another server handed out, for its log line."""
        return await self.db.steps.step_attempt(outcome.run_id, outcome.node)


def log_outcome(outcome: Outcome, done: Completion, attempt: int | None) -> None:
    run_id, node = outcome.run_id, outcome.node
    status, retry_at = done.step_status, done.retry_at
    extra = {"run_id": str(run_id), "node": node, "attempt": attempt}
    failure = outcome.failure
    if failure is None:
        log.debug("completed %s/%s attempt %s", run_id, node, attempt, extra=extra)
    elif status in ("uncertain", "pending") and failure.uncertain:
        # A holding state, not a failure: a warning, as for any blocked run.
        log.warning(
            "step %s/%s stopped at attempt %s without an outcome and is unsafe to repeat "
            "(%s: %s); its run is blocked until resolved with `cyclone resolve`",
            run_id,
            node,
            attempt,
            failure.type,
            failure.message,
            extra=extra,
        )
    elif status == "discarded":
        log.error(
            "step %s/%s discarded at attempt %s: %s: %s",
            run_id,
            node,
            attempt,
            failure.type,
            failure.message,
            extra=extra,
        )
    else:
        # A retry in a blocked run is held (pending) until the run is resolved.
        when = "held until its blocked run is resolved" if status == "pending" else retry_at
        log.info(
            "step %s/%s failed at attempt %s, retry at %s: %s: %s",
            run_id,
            node,
            attempt,
            when,
            failure.type,
            failure.message,
            extra=extra,
        )


def log_uncertain_call(call: StepCallKey, row: StepCallBegun) -> None:
    extra = {"run_id": str(call.run_id), "node": call.node, "step_id": call.step_id}
    attempt = row.call["attempt"] if row.call else None
    if row.run_status == "blocked" and row.call is not None:
        log.warning(
            "run %s blocked: node %s, step call %s (function %s) started at attempt %s with "
            "no outcome and is unsafe to repeat; resolve it with `cyclone resolve %s %s`",
            call.run_id,
            call.node,
            call.step_id,
            row.call["function"],
            attempt,
            call.run_id,
            call.step_id,
            extra=extra,
        )
    else:
        log.warning(
            "node %s of run %s held: step call %s is uncertain and the run is %s",
            call.node,
            call.run_id,
            call.step_id,
            row.run_status,
            extra=extra,
        )
