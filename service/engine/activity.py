"""What this server saw of its workers, kept in memory.

- :class:`Handouts`: the steps this server handed out, by lease token, until their
  outcome comes back, so that a completion can be timed (the step-duration histogram)
  and logged with its attempt, neither of which the completion itself carries.
- :class:`ActionActivity`: the actions workers asked for and got steps of, written to
  ``cyclone.action_claims`` every few seconds (service.server) so that Explain can
  tell a step nobody serves from one waiting its turn; and the workers that asked, with
  their actions and build, written to ``cyclone.workers_seen`` (ListWorkers).

Both cost a few dictionary operations per Claim and none per query: the claim and
completion statements are left exactly as they are.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

from service.db.workers import ActionSeen, WorkerSeen

if TYPE_CHECKING:
    from service.tracing import StepSpans

#: Longest a handout is kept after its deadline (the lease cannot outlive the
#: deadline, so an outcome arriving later is refused anyway).
_SLACK_S = 60.0


class Handout(NamedTuple):
    action: str
    attempt: int
    #: time.monotonic() of the claim.
    claimed: float
    #: time.monotonic() after which no outcome can count any more.
    expires: float
    #: The run's traceparent, when tracing is on and the run has one.
    traceparent: str | None = None


class Handouts:
    """Steps handed out by this server, by lease token, until their outcome arrives.

    A worker that vanishes never reports its step: its entry is dropped once the
    step's deadline has passed (:meth:`prune`). Past ``limit`` entries new ones are not
    kept; their outcomes are then neither timed nor logged with an attempt.
    """

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._by_token: dict[str, Handout] = {}
        #: Spans of steps in their run's trace, when tracing is on (service.tracing).
        self.spans: StepSpans | None = None

    def __len__(self) -> int:
        return len(self._by_token)

    def add(
        self, token: str, action: str, attempt: int, lifetime_s: float, now: float | None = None
    ) -> None:
        """Keep a handout; ``now``: time.monotonic() of its claim, when the caller has it."""
        if len(self._by_token) >= self.limit:
            return
        if now is None:
            now = time.monotonic()
        self._by_token[token] = Handout(action, attempt, now, now + lifetime_s + _SLACK_S)

    def trace(self, token: str, traceparent: str) -> None:
        """Keep the run's traceparent with a handout, for its outcome's span."""
        handout = self._by_token.get(token)
        if handout is not None:
            self._by_token[token] = handout._replace(traceparent=traceparent)

    def pop(self, token: str) -> Handout | None:
        return self._by_token.pop(token, None)

    def prune(self) -> int:
        """Forget handouts whose deadline passed; returns how many."""
        now = time.monotonic()
        gone = [t for t, h in self._by_token.items() if h.expires < now]
        for token in gone:
            del self._by_token[token]
        return len(gone)


class ActionActivity:
    """Per action: the last Claim that named it, and the last one that got a step of it.

    :meth:`take` hands over what was seen since the previous call, as ages in seconds,
    for ``service.db.workers.Workers.action_claims_note``.
    """

    def __init__(self, limit: int = 10_000) -> None:
        #: Most actions kept between two reports: names come from workers, so past it
        #: new names wait for the next report rather than grow memory.
        self.limit = limit
        self._polled: dict[str, tuple[float, str]] = {}
        self._claimed: dict[str, tuple[float, str]] = {}
        self._workers: dict[str, tuple[float, tuple[str, ...], str | None]] = {}

    def polled(self, actions: Iterable[str], worker_id: str, build_id: str | None = None) -> None:
        now = time.monotonic()
        seen = (now, worker_id)
        names = tuple(actions)
        for action in names:
            if action in self._polled or len(self._polled) < self.limit:
                self._polled[action] = seen
        if worker_id in self._workers or len(self._workers) < self.limit:
            self._workers[worker_id] = (now, names, build_id)

    def take_workers(self) -> list[WorkerSeen]:
        """The workers that asked for work since the last call, by worker_id."""
        workers, self._workers = self._workers, {}
        now = time.monotonic()
        return [
            WorkerSeen(worker_id, sorted(set(actions)), build_id, now - at)
            for worker_id, (at, actions, build_id) in sorted(workers.items())
        ]

    def claimed(self, actions: Iterable[str], worker_id: str) -> None:
        seen = (time.monotonic(), worker_id)
        for action in actions:
            self._claimed[action] = seen

    def take(self) -> list[ActionSeen]:
        polled, self._polled = self._polled, {}
        claimed, self._claimed = self._claimed, {}
        now = time.monotonic()
        seen = []
        for action in sorted(polled.keys() | claimed.keys()):
            # A claim is a poll too.
            p_at, p_by = max(polled.get(action, (-1.0, "")), claimed.get(action, (-1.0, "")))
            c = claimed.get(action)
            seen.append(
                ActionSeen(
                    action=action,
                    polled_ago=now - p_at,
                    polled_by=p_by,
                    claimed_ago=None if c is None else now - c[0],
                    claimed_by=None if c is None else c[1],
                )
            )
        return seen
