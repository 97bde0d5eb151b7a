"""A reference model of runs and steps, and the engine's invariants, for the
model-based test (tests/test_model.py) and for any test that wants to check a database.

The model follows docs/state-machine.md, operator actions included (their
semantics: Retry / RetryAll reset every node below the retried ones that has not
completed, give a fresh attempt budget; Resolve result / error / discard). It is kept
deliberately naive: dependency counts are recomputed from the graph every time they are
needed, and pending steps are judged by a fixpoint over the whole run after every
transition, so that it cannot share a bookkeeping bug with the SQL engine.

Time is a number of seconds on the model's clock; the test keeps cyclone.clock in step.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

OPEN = frozenset({"pending", "available", "running", "uncertain"})
FINAL = frozenset({"completed", "discarded", "skipped", "cancelled"})
FAILED_UPSTREAM = frozenset({"discarded", "skipped"})
RULES = ("all_success", "all_done", "one_failed")

#: Lease granted at claim and by heartbeat, in model seconds. The test moves the clock
#: by whole multiples of TICK, so no lease or backoff ever ends exactly at "now".
LEASE = 1500
TICK = 1000
#: The recovery budget of cyclone.sweep (its default): a step that lost its worker more
#: often is discarded. The model's timeouts are years long, so every lease the sweep
#: reclaims lapsed before its deadline: its worker was lost.
MAX_RECOVERIES = 10


class Refused(Exception):
    """The model's answer for an operation the engine must refuse with a typed error."""

    def __init__(self, sqlstate: str, why: str):
        super().__init__(f"{sqlstate}: {why}")
        self.sqlstate = sqlstate
        self.why = why


@dataclass(frozen=True)
class NodeDef:
    name: str
    deps: tuple[str, ...]
    rule: str = "all_success"
    max_attempts: int = 2
    # Whether the workers of this node's action usually mark it unsafe_to_repeat.
    unsafe: bool = False


def runs_by_rule(rule: str, failed: int, has_upstream: bool = True) -> bool:
    """Whether a step whose upstream is all final runs, by its trigger rule. A root node
    always runs, whatever its rule (Submit makes it available): rules judge upstream."""
    if not has_upstream:
        return True
    if rule == "all_success":
        return failed == 0
    if rule == "all_done":
        return True
    return failed > 0


@dataclass
class Step:
    status: str
    max_attempts: int
    attempt: int = 0
    # Attempts whose worker was lost (the sweep reclaimed their lease): not counted
    # against max_attempts.
    recoveries: int = 0
    # None: either (see RunModel.retry).
    effect_uncertain: bool | None = False
    available_at: float | None = None
    # The token of the current or last lease (the lease_token column), and the one
    # whose success was recorded (only that one is told "duplicate").
    lease_token: str | None = None
    lease_expires_at: float | None = None
    completed_token: str | None = None
    # The token of the lease a cancel interrupted (its heartbeat is told "cancelled").
    cancelled_token: str | None = None
    # The claiming worker marked the action unsafe.
    unsafe: bool = False
    output: Any = None


@dataclass
class RunModel:
    nodes: dict[str, NodeDef]
    now: float
    status: str = "running"
    steps: dict[str, Step] = field(default_factory=dict)
    # (node, attempt, kind) of every recorded error, in any order.
    errors: list[tuple[str, int, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.dependents: dict[str, list[str]] = {n: [] for n in self.nodes}
        for n in self.nodes.values():
            for d in n.deps:
                self.dependents[d].append(n.name)
        for n in self.nodes.values():
            root = not n.deps
            self.steps[n.name] = Step(
                status="available" if root else "pending",
                max_attempts=n.max_attempts,
                available_at=self.now if root else None,
            )

    # Derived -------------------------------------------------------------------

    def deps(self, node: str) -> tuple[int, int]:
        """(deps_open, deps_failed) of a node, from the graph."""
        ups = [self.steps[u].status for u in self.nodes[node].deps]
        return sum(s in OPEN for s in ups), sum(s in FAILED_UPSTREAM for s in ups)

    def open_count(self) -> int:
        return sum(s.status in OPEN for s in self.steps.values())

    def claimable(self, node: str) -> bool:
        s = self.steps[node]
        return s.status == "available" and s.available_at is not None and s.available_at <= self.now

    def _settle(self) -> None:
        """Judge every pending step whose upstream is all final, until nothing changes
        (skips propagate); then finish the run if nothing is open."""
        changed = True
        while changed:
            changed = False
            for name, node in self.nodes.items():
                s = self.steps[name]
                if s.status != "pending":
                    continue
                open_, failed = self.deps(name)
                if open_:
                    continue
                if not runs_by_rule(node.rule, failed, bool(node.deps)):
                    s.status = "skipped"
                    changed = True
                elif self.status == "running":
                    s.status = "available"
                    s.available_at = self.now
                # else: held pending while the run is blocked
        if self.status == "running" and self.open_count() == 0:
            discarded = any(s.status == "discarded" for s in self.steps.values())
            self.status = "failed" if discarded else "completed"

    # Worker transitions --------------------------------------------------------

    def claim(self, node: str, marks_unsafe: bool, engine_blocked: bool = False) -> str:
        """'claimed', 'blocked' or 'nothing'. The caller then sets the lease token.

        Where the model does not know whether the step's effect is uncertain (see
        retry), it takes the engine's word (engine_blocked: the engine blocked the run).
        """
        s = self.steps[node]
        if s.status != "available":
            return "nothing"
        if s.effect_uncertain is None:
            s.effect_uncertain = engine_blocked
        if s.effect_uncertain and marks_unsafe:
            if self.status != "running":
                return "nothing"
            s.status = "uncertain"
            s.available_at = None
            for other in self.steps.values():
                if other.status == "available":
                    other.status = "pending"
                    other.available_at = None
            self.status = "blocked"
            return "blocked"
        if not self.claimable(node):
            return "nothing"
        s.status = "running"
        s.attempt += 1
        s.available_at = None
        s.lease_expires_at = self.now + LEASE
        s.unsafe = marks_unsafe
        s.effect_uncertain = False
        s.lease_token = None  # set by the caller from the engine's answer
        return "claimed"

    def _holds(self, s: Step, token: str) -> bool:
        return (
            s.status == "running"
            and s.lease_token == token
            and s.lease_expires_at is not None
            and s.lease_expires_at > self.now
        )

    def heartbeat(self, node: str, token: str) -> set[str]:
        """The answers the engine may give: 'ok', 'cancelled', or 'CY001'."""
        s = self.steps[node]
        if self._holds(s, token):
            s.lease_expires_at = self.now + LEASE
            return {"ok"}
        if s.status == "cancelled" and token == s.cancelled_token:
            return {"cancelled"}
        if s.status == "cancelled" and token == s.lease_token:
            # A lease that had already ended before the cancel: the spec does not say
            # whether its holder is told "cancelled" or "lease lost"; both are honest.
            return {"cancelled", "CY001"}
        return {"CY001"}

    def complete(self, node: str, token: str, output: Any) -> tuple[str, str, bool]:
        """(step_status, run_status, duplicate), or raises Refused."""
        s = self.steps[node]
        if self._holds(s, token):
            s.status = "completed"
            s.output = output
            s.completed_token = token
            s.lease_expires_at = None
            self._settle()
            return "completed", self.status, False
        if s.status == "completed" and s.completed_token == token:
            return "completed", self.status, True
        raise Refused("CY001", f"{node} is {s.status}: this lease does not hold it")

    def fail(self, node: str, token: str, retryable: bool, retry_after: float) -> tuple[str, str]:
        """(step_status, run_status), or raises Refused."""
        s = self.steps[node]
        if not self._holds(s, token):
            raise Refused("CY001", f"{node} is {s.status}: this lease does not hold it")
        self.errors.append((node, s.attempt, "handler"))
        s.lease_expires_at = None
        if retryable and s.attempt - s.recoveries < s.max_attempts:
            if self.status == "blocked":
                s.status = "pending"
                s.available_at = None
            else:
                s.status = "available"
                s.available_at = self.now + retry_after
        else:
            s.status = "discarded"
        self._settle()
        return s.status, self.status

    def expired(self) -> list[str]:
        """Running steps the sweep reclaims now (their run must be running)."""
        if self.status != "running":
            return []
        return [
            n
            for n, s in self.steps.items()
            if s.status == "running"
            and s.lease_expires_at is not None
            and s.lease_expires_at <= self.now
        ]

    def sweep(self) -> int:
        reclaimed = self.expired()
        for name in reclaimed:
            s = self.steps[name]
            self.errors.append((name, s.attempt, "lease_expired"))
            s.effect_uncertain = True
            s.lease_expires_at = None
            s.recoveries += 1
            out_of_budget = (
                s.recoveries > MAX_RECOVERIES or s.attempt - s.recoveries >= s.max_attempts
            )
            if out_of_budget and not s.unsafe:
                s.status = "discarded"
            else:
                s.status = "available"
                s.available_at = self.now
        self._settle()
        return len(reclaimed)

    # Operator transitions ------------------------------------------------------

    def cancel(self) -> None:
        if self.status in ("completed", "cancelled"):
            raise Refused("CY003", f"run is already {self.status}")
        for s in self.steps.values():
            if s.status in OPEN:
                if s.status == "running":
                    s.cancelled_token = s.lease_token
                s.status = "cancelled"
                s.available_at = None
                s.lease_expires_at = None
        self.status = "cancelled"

    def reset_set(self, retried: list[str]) -> list[str]:
        """The retried nodes and everything reachable from them through dependents,
        without entering a completed node."""
        seen: list[str] = []
        todo = list(retried)
        while todo:
            n = todo.pop()
            if n in seen or self.steps[n].status == "completed":
                continue
            seen.append(n)
            todo.extend(self.dependents[n])
        return seen

    def retry(self, nodes: list[str] | None) -> list[str]:
        """Retry (nodes) or RetryAll (None): the retried nodes, or raises Refused."""
        if self.status in ("blocked", "cancelled"):
            raise Refused("CY003", f"run is {self.status}")
        if nodes is None:
            retried = sorted(n for n, s in self.steps.items() if s.status == "discarded")
            if not retried:
                raise Refused("CY003", "no discarded node")
        else:
            for n in nodes:
                if n not in self.steps:
                    raise Refused("CY002", f"no node {n}")
                if self.steps[n].status != "discarded":
                    raise Refused("CY003", f"{n} is {self.steps[n].status}")
            retried = list(nodes)
        for name in self.reset_set(retried):
            s = self.steps[name]
            if s.status == "running":
                # Its holder loses the lease; its effect may have happened.
                self.errors.append((name, s.attempt, "reset"))
                s.effect_uncertain = True
            elif s.status in ("discarded", "skipped"):
                # The spec does not say whether a reopened node keeps the mark left by
                # a lease it lost before it was discarded or skipped: either is allowed
                # (None: the model learns which at the next claim).
                s.effect_uncertain = None if s.effect_uncertain is not False else False
            # available and pending keep their effect_uncertain mark
            s.status = "pending"
            s.available_at = None
            s.lease_expires_at = None
            s.max_attempts = s.attempt - s.recoveries + self.nodes[name].max_attempts
        self.status = "running"
        self._settle()
        return retried

    def resolve(self, node: str, choice: str, value: Any = None) -> None:
        if self.status != "blocked":
            raise Refused("CY003", f"run is {self.status}, not blocked")
        if node not in self.steps:
            raise Refused("CY002", f"no node {node}")
        s = self.steps[node]
        if s.status != "uncertain":
            raise Refused("CY003", f"{node} is {s.status}, not uncertain")
        if choice not in ("result", "error", "discard"):
            raise Refused("CY004", f"unknown resolution {choice}")
        self.status = "running"
        s.effect_uncertain = False
        if choice == "result":
            s.status = "completed"
            s.output = value
            s.completed_token = None  # the lost lease's token is not the recorded one
        elif choice == "error":
            s.status = "discarded"
            self.errors.append((node, s.attempt, "resolved"))
        else:
            s.status = "available"
            s.available_at = self.now
            s.max_attempts = s.attempt - s.recoveries + self.nodes[node].max_attempts
        self._settle()


# Invariants of a database, model or no model -------------------------------------


@dataclass
class Snapshot:
    """What the checks read of a database, in three statements."""

    #: (run_id, node) -> the step's columns (see Snapshot.take), by name.
    steps: dict[tuple[str, str], dict[str, Any]]
    #: run_id -> (status, steps_open)
    runs: dict[str, tuple[str, int]]
    #: (run_id, node, attempt, kind) of every step_errors row
    errors: list[tuple[str, str, int, str]]

    @classmethod
    def take(cls, conn: Any) -> Snapshot:
        cur = conn.execute(
            "SELECT run_id::text, node, status, trigger_rule, depends_on, deps_open,"
            "       deps_failed, attempt, max_attempts, effect_uncertain,"
            "       status = 'available' AND available_at <= cyclone.now() AS claimable,"
            "       status = 'running' AND lease_expires_at > cyclone.now() AS leased"
            "  FROM cyclone.steps ORDER BY run_id, position"
        )
        names = [c.name for c in cur.description]
        steps = {(r[0], r[1]): dict(zip(names, r, strict=True)) for r in cur.fetchall()}
        runs = {
            r[0]: (r[1], r[2])
            for r in conn.execute("SELECT run_id::text, status, steps_open FROM cyclone.runs")
        }
        errors = conn.execute(
            "SELECT run_id::text, node, attempt, kind FROM cyclone.step_errors"
        ).fetchall()
        return cls(steps, runs, [tuple(e) for e in errors])


def violations(snap: Snapshot) -> list[str]:
    """Every broken invariant of the engine's state, as sentences (empty: all hold).

    Checks every run: dependency counters of open steps equal their recomputation from
    the graph; no step is available or running while an upstream node is open or its
    trigger rule forbids it; a running run has no pending step whose upstream is all
    final (it would never be judged); a blocked run has exactly one uncertain step and
    no available one; steps_open counts the open steps; each attempt has at most one
    recorded outcome (a handler error, a resolution, or the success itself).
    """
    problems: list[str] = []
    by_run: dict[str, dict[str, dict[str, Any]]] = {}
    for (run_id, node), row in snap.steps.items():
        by_run.setdefault(run_id, {})[node] = row
    for run_id, nodes in by_run.items():
        run_status, steps_open = snap.runs[run_id]
        open_now = sum(r["status"] in OPEN for r in nodes.values())
        if run_status in ("running", "blocked") and steps_open != open_now:
            problems.append(f"run {run_id}: steps_open {steps_open}, but {open_now} open steps")
        if run_status in ("running", "blocked") and open_now == 0:
            problems.append(f"run {run_id} is {run_status} with no open step")
        if run_status not in ("running", "blocked") and open_now:
            problems.append(f"run {run_id} is {run_status} with {open_now} open steps")
        uncertain = [n for n, r in nodes.items() if r["status"] == "uncertain"]
        if run_status == "blocked" and len(uncertain) != 1:
            problems.append(f"run {run_id} is blocked with uncertain steps {uncertain}")
        if run_status != "blocked" and uncertain:
            problems.append(f"run {run_id} is {run_status} with uncertain steps {uncertain}")
        for name, r in nodes.items():
            status, depends_on = r["status"], r["depends_on"]
            ups = {u: nodes[u]["status"] for u in depends_on}
            want_open = sum(u in OPEN for u in ups.values())
            want_failed = sum(u in FAILED_UPSTREAM for u in ups.values())
            counted = (r["deps_open"], r["deps_failed"])
            if status in OPEN and counted != (want_open, want_failed):
                problems.append(
                    f"run {run_id} node {name} ({status}): deps_open/deps_failed "
                    f"{counted[0]}/{counted[1]}, but the graph says {want_open}/{want_failed} "
                    f"(upstream {ups})"
                )
            if status in ("available", "running"):
                if want_open:
                    problems.append(
                        f"run {run_id} node {name} is {status} while upstream "
                        f"{[u for u, us in ups.items() if us in OPEN]} is open"
                    )
                elif not runs_by_rule(r["trigger_rule"], want_failed, bool(depends_on)):
                    problems.append(
                        f"run {run_id} node {name} is {status} but its rule "
                        f"{r['trigger_rule']} is not met (upstream {ups})"
                    )
            if status == "available" and run_status == "blocked":
                problems.append(f"run {run_id} node {name} is available in a blocked run")
            if status == "pending" and run_status == "running" and want_open == 0:
                problems.append(
                    f"run {run_id} node {name} is pending in a running run with no open upstream"
                )
    outcomes = [e for e in snap.errors if e[3] in ("handler", "resolved")] + [
        (run_id, node, r["attempt"], "success")
        for (run_id, node), r in snap.steps.items()
        if r["status"] == "completed"
    ]
    for (run_id, node, attempt), n in Counter(o[:3] for o in outcomes).items():
        if n > 1:
            kinds = sorted(o[3] for o in outcomes if o[:3] == (run_id, node, attempt))
            problems.append(f"run {run_id} node {node} attempt {attempt} has {n} outcomes {kinds}")
    return problems


def database_violations(conn: Any) -> list[str]:
    """violations() of the database behind a psycopg connection."""
    return violations(Snapshot.take(conn))


def assert_database_invariants(conn: Any) -> None:
    """Fail with every broken invariant (see database_violations)."""
    problems = database_violations(conn)
    assert not problems, "engine invariants broken:\n" + "\n".join(problems)
