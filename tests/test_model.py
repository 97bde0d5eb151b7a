"""Model-based test of the SQL engine: Hypothesis drives random sequences of
submit, claim (with unsafe marks), complete, fail, heartbeat, clock moves, sweep,
cancel, Retry, RetryAll and Resolve against the real cyclone.* functions, on small random
DAGs with every trigger rule, and after every step compares the database with the
reference model of tests/model.py and checks the engine's invariants
(tests.model.database_violations).

Each example runs on a fresh database cloned from the migrated template; time moves
through cyclone.clock, never by sleeping. The default profile is bounded for `make test`;
CYCLONE_MODEL_PROFILE=long (used by `make chaos`) explores much further.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.conftest import TEMPLATE, _with_database
from tests.model import (
    LEASE,
    RULES,
    TICK,
    NodeDef,
    Refused,
    RunModel,
    Snapshot,
    violations,
)

PROFILES = {
    # Bounded for `make test`: about half a minute on a quiet machine.
    "ci": settings(
        max_examples=40,
        stateful_step_count=30,
        derandomize=True,
    ),
    # For `make chaos`: random seeds, many more and longer sequences.
    "long": settings(
        max_examples=int(os.environ.get("CYCLONE_MODEL_EXAMPLES", "1500")),
        stateful_step_count=60,
        derandomize=False,
    ),
}
PROFILE_NAME = os.environ.get("CYCLONE_MODEL_PROFILE", "ci")
PROFILE = settings(
    PROFILES[PROFILE_NAME],
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

#: Which comparisons run (a comma-separated list, default all). An unexpected SQL error
#: always fails. Setting some aside is for diagnosis only: e.g. to see where a known
#: disagreement leads, CYCLONE_MODEL_CHECKS=invariants,statuses (or "none": SQL errors only).
CHECK_GROUPS = ("outcomes", "invariants", "statuses", "attempts", "budget", "readiness", "errors")
_checks = os.environ.get("CYCLONE_MODEL_CHECKS", "all")
CHECKS = set(CHECK_GROUPS) if _checks == "all" else set(_checks.split(",")) - {"none"}
assert not CHECKS - set(CHECK_GROUPS), f"CYCLONE_MODEL_CHECKS: unknown {CHECKS - set(CHECK_GROUPS)}"

#: The SQLSTATEs of the engine's typed refusals; any other error is a bug.
TYPED = {"CY001", "CY002", "CY003", "CY004"}
MAX_RUNS = 2
NAMES = ("a", "b", "c", "d", "e")


@st.composite
def dags(draw: st.DrawFn) -> tuple[NodeDef, ...]:
    """2 to 5 nodes in topological order; each after the first depends on one or two
    earlier ones, or (one time in four) is another root."""
    size = draw(st.integers(2, 5))
    nodes = []
    for i in range(size):
        earlier = NAMES[:i]
        deps: list[str] = []
        if i:
            least = draw(st.sampled_from([1, 1, 1, 0]))
            deps = draw(st.lists(st.sampled_from(earlier), unique=True, min_size=least, max_size=2))
        nodes.append(
            NodeDef(
                name=NAMES[i],
                deps=tuple(sorted(deps)),
                rule=draw(st.sampled_from(RULES)),
                max_attempts=draw(st.integers(1, 2)),
                unsafe=draw(st.booleans()),
            )
        )
    return tuple(nodes)


def when_some(*statuses: str) -> Any:
    """Run the rule only when some modelled step is in one of these statuses."""
    return precondition(lambda self: bool(self.steps_in(*statuses)))


@dataclass(frozen=True)
class Lease:
    run: str
    node: str
    token: str
    attempt: int


def none(_: Any) -> None:
    """An operation that answers nothing (its rows are discarded)."""
    return None


class EngineRefused(Exception):
    def __init__(self, sqlstate: str, message: str):
        super().__init__(f"{sqlstate}: {message}")
        self.sqlstate = sqlstate


def same_outcome(what: str, want: Any, got: Any) -> None:
    """The engine did what the model did: same value, or the same typed refusal."""
    if "outcomes" not in CHECKS:
        return
    if isinstance(want, Refused) or isinstance(got, EngineRefused):
        want_state = want.sqlstate if isinstance(want, Refused) else None
        got_state = got.sqlstate if isinstance(got, EngineRefused) else None
        assert want_state == got_state, (
            f"{what}: the model says {want!r}, the engine answered {got!r}"
        )
        return
    assert want == got, f"{what}: the model says {want!r}, the engine answered {got!r}"


class EngineMachine(RuleBasedStateMachine):
    postgres_url: ClassVar[str]
    runs = Bundle("runs")
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.dbname = f"cyclone_model_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.postgres_url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.dbname}" TEMPLATE "{TEMPLATE}"')
        self.conn = psycopg.connect(_with_database(self.postgres_url, self.dbname), autocommit=True)
        self.now = 0
        self.models: dict[str, RunModel] = {}
        self.actions: dict[str, str] = {}  # run_id -> action prefix
        self.attempts: dict[tuple[str, str], int] = {}

    def teardown(self) -> None:
        self.conn.close()
        with psycopg.connect(self.postgres_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')

    # Talking to the engine ---------------------------------------------------------

    def sql(self, query: str, *params: Any) -> list[tuple]:
        try:
            cur = self.conn.execute(query, params)
            return cur.fetchall() if cur.description else []
        except psycopg.Error as exc:
            state = exc.sqlstate or "?"
            if state in TYPED:
                raise EngineRefused(state, str(exc).splitlines()[0]) from None
            raise AssertionError(
                f"the engine raised SQLSTATE {state}, not a typed refusal: {exc}"
            ) from exc

    def both(self, what: str, model_call: Any, engine_call: Any) -> Any:
        """Apply an operation to the model and to the engine; their outcomes must agree."""
        try:
            want = model_call()
        except Refused as refused:
            want = refused
        try:
            got = engine_call()
        except EngineRefused as refused:
            got = refused
        same_outcome(what, want, got)
        return got

    def action(self, run: str, node: str) -> str:
        return f"{self.actions[run]}_{node}"

    # Rules -------------------------------------------------------------------------

    def submit_run(self, dag: tuple[NodeDef, ...]) -> str:
        run_id = str(uuid.uuid4())
        prefix = f"r{len(self.models)}"
        dependents = {n.name: [m.name for m in dag if n.name in m.deps] for n in dag}
        payload = [
            {
                "name": n.name,
                "position": i,
                "action": f"{prefix}_{n.name}",
                "depends_on": list(n.deps),
                "dependents": dependents[n.name],
                "trigger_rule": n.rule,
                "max_attempts": n.max_attempts,
                "initial_backoff_s": 1.0,
                "max_backoff_s": 1.0,
                "backoff_multiplier": 2.0,
                "timeout_s": 10.0 * 365 * 86400,
                "input": None,
            }
            for i, n in enumerate(dag)
        ]
        self.sql(
            "SELECT * FROM cyclone.run_submit(%s::uuid, 'model', NULL, NULL, %s::jsonb)",
            run_id,
            json.dumps(payload),
        )
        self.models[run_id] = RunModel({n.name: n for n in dag}, now=self.now)
        self.actions[run_id] = prefix
        return run_id

    @initialize(target=runs, dag=dags())
    def submit_first(self, dag: tuple[NodeDef, ...]) -> str:
        return self.submit_run(dag)

    @precondition(lambda self: len(self.models) < MAX_RUNS)
    @rule(target=runs, dag=dags())
    def submit(self, dag: tuple[NodeDef, ...]) -> str:
        return self.submit_run(dag)

    def steps_in(self, *statuses: str) -> list[tuple[str, str]]:
        """(run, node) of every modelled step in one of these statuses."""
        return [
            (run, node)
            for run, model in self.models.items()
            for node, s in model.steps.items()
            if s.status in statuses
        ]

    @when_some("available")
    @rule(target=leases, pick=st.integers(0, 9), honours_mark=st.booleans())
    def claim(self, pick: int, honours_mark: bool) -> Any:
        """A worker serving one ready node's action claims; it marks the action unsafe
        when the node's action is unsafe, unless (honours_mark False) its code no longer
        does. A step whose backoff has not passed is not handed out."""
        ready = self.steps_in("available")
        run, node = ready[pick % len(ready)]
        lease = self.do_claim(run, node, self.models[run].nodes[node].unsafe and honours_mark)
        return multiple() if lease is None else lease

    @precondition(
        lambda self: any(self.models[r].nodes[n].unsafe for r, n in self.steps_in("available"))
    )
    @rule(target=leases, pick=st.integers(0, 9))
    def unsafe_worker_vanishes(self, pick: int) -> Any:
        """A worker that marks the action unsafe claims a ready unsafe node and vanishes;
        the lease runs out, the sweep reclaims it, and the next such worker's claim
        blocks the run (a shortcut for claim, leases_run_out, claim). The lost lease
        may come back later (use_an_old_lease)."""
        ready = [(r, n) for r, n in self.steps_in("available") if self.models[r].nodes[n].unsafe]
        run, node = ready[pick % len(ready)]
        lost = self.do_claim(run, node, True)
        if lost is None:
            return multiple()
        self.leases_run_out()
        self.do_claim(run, node, True)
        return lost

    def do_claim(self, run: str, node: str, marks: bool) -> Lease | None:
        model = self.models[run]
        action = self.action(run, node)
        # A Claim shows its worker is alive: the server clears the mark a lost lease left.
        self.sql("DELETE FROM cyclone.worker_health WHERE worker_id = 'model-worker'")
        rows = self.sql(
            "SELECT node, attempt, lease_token::text, blocked FROM cyclone.step_claim("
            "'model-worker', %s::text[], %s::text[], 1, make_interval(secs => %s))",
            [action],
            [action] if marks else [],
            LEASE,
        )
        got = "nothing"
        if rows and rows[0][3]:
            got = "blocked"
        elif rows:
            got = "claimed"
        assert len(rows) <= 1, rows
        want = model.claim(node, marks, engine_blocked=got == "blocked")
        same_outcome(f"claim {node} (unsafe mark {marks})", want, got)
        if got != "claimed" or want != "claimed":
            return None
        _, attempt, token, _ = rows[0]
        same_outcome(f"claim {node}: attempt", model.steps[node].attempt, attempt)
        model.steps[node].lease_token = token
        return Lease(run, node, token, attempt)

    def held(self, pick: int) -> Lease:
        """The current lease of a running step (its lease may have expired)."""
        running = self.steps_in("running")
        run, node = running[pick % len(running)]
        s = self.models[run].steps[node]
        # No token only when the engine did not hand out a lease the model did, with
        # CYCLONE_MODEL_CHECKS leaving outcomes unchecked: any token will do.
        return Lease(run, node, s.lease_token or str(uuid.uuid4()), s.attempt)

    @when_some("running")
    @rule(pick=st.integers(0, 9))
    def complete(self, pick: int) -> None:
        self.do_complete(self.held(pick))

    @when_some("running")
    @rule(
        pick=st.integers(0, 9), retryable=st.booleans(), retry_after=st.sampled_from([0, TICK // 2])
    )
    def fail(self, pick: int, retryable: bool, retry_after: int) -> None:
        self.do_fail(self.held(pick), retryable, retry_after)

    @when_some("running")
    @rule(pick=st.integers(0, 9))
    def heartbeat(self, pick: int) -> None:
        self.do_heartbeat(self.held(pick))

    @rule(lease=leases, what=st.sampled_from(["complete", "fail", "heartbeat"]))
    def use_an_old_lease(self, lease: Lease, what: str) -> None:
        """A worker answers with a lease it was given earlier: still held, lost, or
        already answered (only its own recorded success is a duplicate)."""
        if what == "complete":
            self.do_complete(lease)
        elif what == "fail":
            self.do_fail(lease, True, 0)
        else:
            self.do_heartbeat(lease)

    def do_complete(self, lease: Lease) -> None:
        model = self.models[lease.run]
        output = {"node": lease.node, "attempt": lease.attempt}
        self.both(
            f"complete {lease.node} attempt {lease.attempt}",
            lambda: model.complete(lease.node, lease.token, output),
            lambda: self.sql(
                # The server's path: a repeat answers duplicate (the worker's own
                # cyclone.step_complete raises CY005 instead; test_exactly_once).
                "SELECT step_status, run_status, duplicate FROM cyclone._step_complete("
                "%s::uuid, %s, %s::uuid, %s::jsonb)",
                lease.run,
                lease.node,
                lease.token,
                json.dumps(output),
            )[0],
        )

    def do_fail(self, lease: Lease, retryable: bool, retry_after: int) -> None:
        model = self.models[lease.run]
        self.both(
            f"fail {lease.node} attempt {lease.attempt} (retryable {retryable})",
            lambda: model.fail(lease.node, lease.token, retryable, retry_after),
            lambda: self.sql(
                "SELECT step_status, run_status FROM cyclone.step_fail(%s::uuid, %s, %s::uuid,"
                " 'E', 'boom', '', %s, make_interval(secs => %s))",
                lease.run,
                lease.node,
                lease.token,
                retryable,
                retry_after,
            )[0],
        )

    def do_heartbeat(self, lease: Lease) -> None:
        model = self.models[lease.run]
        allowed = model.heartbeat(lease.node, lease.token)
        try:
            [(_, cancelled)] = self.sql(
                "SELECT lease_expires_at, cancelled FROM cyclone.step_heartbeat(%s::uuid, %s,"
                " %s::uuid, make_interval(secs => %s), NULL)",
                lease.run,
                lease.node,
                lease.token,
                LEASE,
            )
            got = "cancelled" if cancelled else "ok"
        except EngineRefused as refused:
            got = refused.sqlstate
        assert got in allowed or "outcomes" not in CHECKS, (
            f"heartbeat {lease.node} attempt {lease.attempt}: the model allows {allowed}, "
            f"the engine answered {got}"
        )

    @rule(ticks=st.integers(1, 2))
    def advance_clock(self, ticks: int) -> None:
        self.now += ticks * TICK
        for model in self.models.values():
            model.now = self.now
        self.sql("UPDATE cyclone.clock SET offset_by = make_interval(secs => %s)", self.now)

    @when_some("running")
    @rule()
    def sweep(self) -> None:
        want = sum(len(m.expired()) for m in self.models.values())
        for model in self.models.values():
            model.sweep()
        [(got,)] = self.sql("SELECT cyclone.sweep(1000)")
        assert got == want or "outcomes" not in CHECKS, (
            f"sweep: the model reclaims {want} leases, the engine {got}"
        )

    @when_some("running")
    @rule()
    def leases_run_out(self) -> None:
        """Every worker holding a step vanishes: the clock passes every lease, and the
        sweep reclaims them (a shortcut for advance_clock then sweep)."""
        self.advance_clock(LEASE // TICK + 1)
        self.sweep()

    def do_retry(self, run: str, nodes: list[str] | None) -> None:
        model = self.models[run]
        self.both(
            f"retry {nodes}" if nodes else "retry all",
            lambda: model.retry(nodes),
            lambda: sorted(
                self.sql(
                    "SELECT cyclone.step_retry(%s::uuid, %s::text[], 'model', '')", run, nodes
                )[0][0]
            ),
        )

    def do_resolve(self, run: str, node: str, choice: str) -> None:
        model = self.models[run]
        value = {"result": {"resolved": node}, "error": "declined", "discard": None}[choice]
        self.both(
            f"resolve {node} {choice}",
            lambda: model.resolve(node, choice, value),
            lambda: none(
                self.sql(
                    "SELECT cyclone.step_resolve(%s::uuid, %s, %s, %s::jsonb, 'model', '')",
                    run,
                    node,
                    choice,
                    json.dumps(value),
                )
            ),
        )

    def do_cancel(self, run: str) -> None:
        model = self.models[run]
        self.both(
            "cancel",
            lambda: model.cancel(),
            lambda: none(self.sql("SELECT cyclone.run_cancel(%s::uuid, 'model', '')", run)),
        )

    @when_some("discarded")
    @rule(pick=st.integers(0, 9))
    def retry(self, pick: int) -> None:
        discarded = self.steps_in("discarded")
        run, node = discarded[pick % len(discarded)]
        self.do_retry(run, [node])

    @when_some("discarded")
    @rule(pick=st.integers(0, 9))
    def retry_all(self, pick: int) -> None:
        discarded = self.steps_in("discarded")
        run, _ = discarded[pick % len(discarded)]
        self.do_retry(run, None)

    @when_some("uncertain")
    @rule(pick=st.integers(0, 9), choice=st.sampled_from(["result", "error", "discard"]))
    def resolve(self, pick: int, choice: str) -> None:
        uncertain = self.steps_in("uncertain")
        run, node = uncertain[pick % len(uncertain)]
        self.do_resolve(run, node, choice)

    @rule(
        run=runs,
        node=st.sampled_from(NAMES),
        what=st.sampled_from(["retry", "retry_all", "result", "error", "discard", "cancel"]),
    )
    def operator_acts_on_anything(self, run: str, node: str, what: str) -> None:
        """An operator action on any node of any run: often refused (a node that is not
        discarded or not uncertain, a run in the wrong state, a node that does not
        exist), sometimes not; and cancel."""
        if what == "retry":
            self.do_retry(run, [node])
        elif what == "retry_all":
            self.do_retry(run, None)
        elif what == "cancel":
            self.do_cancel(run)
        else:
            self.do_resolve(run, node, what)

    # Checks after every step -------------------------------------------------------

    @invariant()
    def engine_agrees_with_the_model(self) -> None:
        """One snapshot of the database, then each comparison (each its own assertion,
        so that Hypothesis tells distinct disagreements apart)."""
        snap = Snapshot.take(self.conn)
        if "invariants" in CHECKS:
            self.compare_invariants(snap)
        if "statuses" in CHECKS:
            self.compare_statuses(snap)
        self.compare_attempts(snap)
        if "readiness" in CHECKS:
            self.compare_readiness(snap)
        if "errors" in CHECKS:
            self.compare_errors(snap)

    def compare_invariants(self, snap: Snapshot) -> None:
        problems = violations(snap)
        assert not problems, "engine invariants broken:\n" + "\n".join(problems)

    def compare_statuses(self, snap: Snapshot) -> None:
        want = {
            run: (m.status, {n: s.status for n, s in m.steps.items()})
            for run, m in self.models.items()
        }
        got = {
            run: (
                snap.runs[run][0],
                {node: r["status"] for (r_id, node), r in snap.steps.items() if r_id == run},
            )
            for run in self.models
        }
        assert got == want, f"(run status, step statuses): model {want}, engine {got}"

    def compare_attempts(self, snap: Snapshot) -> None:
        for (run, node), r in snap.steps.items():
            seen = self.attempts.get((run, node), 0)
            assert r["attempt"] >= seen, f"{node}: attempt went from {seen} to {r['attempt']}"
            self.attempts[run, node] = r["attempt"]
            s = self.models[run].steps[node]
            if "attempts" in CHECKS:
                assert r["attempt"] == s.attempt, (
                    f"{node} ({s.status}): attempt: model {s.attempt}, engine {r['attempt']}"
                )
            if "budget" in CHECKS:
                assert r["max_attempts"] == s.max_attempts, (
                    f"{node} ({s.status}) at attempt {s.attempt}: max_attempts: model "
                    f"{s.max_attempts}, engine {r['max_attempts']}"
                )

    def compare_readiness(self, snap: Snapshot) -> None:
        for (run, node), r in snap.steps.items():
            model = self.models[run]
            s = model.steps[node]
            known = s.status in ("pending", "available") and s.effect_uncertain is not None
            want = (
                model.claimable(node),
                s.status == "running" and (s.lease_expires_at or 0) > model.now,
                s.effect_uncertain if known else None,
            )
            got = (r["claimable"], r["leased"], r["effect_uncertain"] if known else None)
            assert got == want, (
                f"{node} ({s.status}): (claimable, lease valid, effect_uncertain) "
                f"model {want}, engine {got}"
            )

    def compare_errors(self, snap: Snapshot) -> None:
        got = Counter(snap.errors)
        want = Counter((run, *e) for run, m in self.models.items() for e in m.errors)
        assert got == want, f"step_errors (run, node, attempt, kind): model {want}, engine {got}"


# Passing takes well under a minute; a failure is shrunk for up to a few minutes more.
@pytest.mark.timeout(0 if PROFILE_NAME == "long" else 900)
def test_engine_agrees_with_the_model(postgres_url: str, template_url: str) -> None:
    EngineMachine.postgres_url = postgres_url
    run_state_machine_as_test(EngineMachine, settings=PROFILE)


# Fixed operator sequences (a Retry, RetryAll or Resolve around a discarded, blocked
# or lost step), replayed through the same machine, so that they are checked
# whatever the random search happens to try.


def lose_lease_and_block(m: EngineMachine, run: str, node: str) -> Lease:
    lost = m.do_claim(run, node, True)
    assert lost is not None
    m.leases_run_out()
    m.engine_agrees_with_the_model()
    assert m.do_claim(run, node, True) is None  # blocks the run
    return lost


def discard(m: EngineMachine, run: str, node: str) -> None:
    lease = m.do_claim(run, node, False)
    assert lease is not None
    m.do_fail(lease, False, 0)


def case_1_retry_all(m: EngineMachine) -> None:
    """a -> c, c all_done, both discarded; RetryAll must not leave c ready under a."""
    run = m.submit_run((NodeDef("a", (), max_attempts=1), NodeDef("c", ("a",), "all_done", 1)))
    discard(m, run, "a")
    m.engine_agrees_with_the_model()
    discard(m, run, "c")
    m.engine_agrees_with_the_model()
    m.do_retry(run, None)
    m.engine_agrees_with_the_model()
    assert m.do_claim(run, "c", False) is None


def case_1_retry_then_retry(m: EngineMachine) -> None:
    """The same, with Retry(a) then Retry(c)."""
    run = m.submit_run((NodeDef("a", (), max_attempts=1), NodeDef("c", ("a",), "all_done", 1)))
    discard(m, run, "a")
    discard(m, run, "c")
    m.do_retry(run, ["a"])
    m.engine_agrees_with_the_model()
    m.do_retry(run, ["c"])
    m.engine_agrees_with_the_model()


def case_2(m: EngineMachine, last: str) -> None:
    """u -> c, u unsafe, c one_failed: block, Resolve error, Retry(u), block again,
    then Resolve `last`."""
    run = m.submit_run(
        (NodeDef("u", (), unsafe=True, max_attempts=1), NodeDef("c", ("u",), "one_failed", 1))
    )
    lose_lease_and_block(m, run, "u")
    m.engine_agrees_with_the_model()
    m.do_resolve(run, "u", "error")
    m.engine_agrees_with_the_model()
    m.do_retry(run, ["u"])
    m.engine_agrees_with_the_model()
    lose_lease_and_block(m, run, "u")
    m.engine_agrees_with_the_model()
    m.do_resolve(run, "u", last)
    m.engine_agrees_with_the_model()


def case_3(m: EngineMachine) -> None:
    """Resolve result after a lost lease; a late Complete with the lost token is refused
    (ABORTED), not told duplicate."""
    run = m.submit_run((NodeDef("u", (), unsafe=True, max_attempts=1),))
    lost = lose_lease_and_block(m, run, "u")
    m.do_resolve(run, "u", "result")
    m.engine_agrees_with_the_model()
    m.do_complete(lost)


CASES = {
    "1-retry-all": case_1_retry_all,
    "1-retry-then-retry": case_1_retry_then_retry,
    "2-resolve-result": lambda m: case_2(m, "result"),
    "2-resolve-discard": lambda m: case_2(m, "discard"),
    "3-late-complete": case_3,
}


@pytest.mark.parametrize("case", list(CASES))
def test_known_operator_sequences_agree_with_the_model(
    postgres_url: str, template_url: str, case: str
) -> None:
    EngineMachine.postgres_url = postgres_url
    machine = EngineMachine()
    try:
        CASES[case](machine)
        machine.engine_agrees_with_the_model()
    finally:
        machine.teardown()
