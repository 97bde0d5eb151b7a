"""Queries and updates of durable functions: QueryRun answered by the worker running
the body or from the values it published, UpdateRun applied at a journal point,
recorded in the journal, answered with the handler's result, exactly once."""

from __future__ import annotations

import datetime as dt
import json
import threading
from typing import Any

import grpc
import psycopg
import pytest

from pyclient import Client, Worker, Workflow, cli, step, wait_for_event
from pyclient.errors import CycloneError, FailedPrecondition, NotFound
from tests.helpers import PATIENCE, eventually
from tests.sdk.conftest import running

#: Lets the body of "looping" go on, one step per set.
GATE = threading.Event()


@step
def tick(n: int) -> int:
    return n


def _worker(address: str) -> Worker:
    worker = Worker(address, concurrency=4, lease=5.0, claim_wait=1.0, shutdown_grace=5.0)

    @worker.workflow("cart")
    def cart(ctx: Any, user: str) -> dict[str, Any]:
        items: list[str] = []

        @ctx.query("items")
        def _items() -> list[str]:
            return list(items)

        @ctx.query("has")
        def _has(item: str) -> bool:
            return item in items

        @ctx.update("add_item")
        def _add(item: str) -> int:
            if not item:
                raise ValueError("an item needs a name")
            items.append(item)
            return len(items)

        tick(0)
        wait_for_event("checkout")
        return {"user": user, "items": items}

    @worker.workflow("looping")
    def looping(ctx: Any) -> int:
        seen: list[int] = []

        @ctx.query("seen")
        def _seen() -> list[int]:
            return seen

        for i in range(1000):
            seen.append(tick(i))
            if not GATE.wait(PATIENCE):
                break
            if i >= 2:
                return len(seen)
        return -1

    @worker.workflow("quiet")
    def quiet(ctx: Any) -> int:  # a body that registers no handler
        tick(0)
        if not GATE.wait(PATIENCE):
            return -1
        return tick(1)

    @worker.action("plain")
    def plain(ctx: Any) -> str:  # not a durable function: nothing to ask
        GATE.wait(PATIENCE)
        return "done"

    return worker


def _waiting(client: Client, run_id: str, node: str) -> bool:
    """The node waits for its event, suspended (not woken to be claimed again)."""
    step = client.get_run(run_id).step(node)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    woken = step.available_at is None or step.available_at < later
    return step.status == "available" and bool(step.waiting_for) and not woken


def test_an_update_is_applied_recorded_and_answered_and_queries_see_it(cyclone_server):
    with running(_worker(cyclone_server.address)), Client(cyclone_server.address) as client:
        run_id = client.start("cart", "ann")
        eventually(lambda: _waiting(client, run_id, "cart"), "the body waits for checkout")

        first = client.update(run_id, "cart", "add_item", "apple", update_id="u-1")
        assert (first.result, first.update_id, first.created) == (1, "u-1", True)
        second = client.update(run_id, "cart", "add_item", "pear")
        assert second.result == 2 and second.created and second.update_id != "u-1"

        # A repeat with the same id sends nothing and answers the first outcome.
        again = client.update(run_id, "cart", "add_item", "apple", update_id="u-1")
        assert (again.result, again.created, again.seq) == (1, False, first.seq)

        # Once the node waits (no worker runs it): the value its body last published.
        eventually(lambda: _waiting(client, run_id, "cart"), "the body waits again")

        def published_both() -> Any:
            answer = client.query(run_id, "cart", "items")
            return answer if answer.result == ["apple", "pear"] else None

        answer = eventually(published_both, "the published items")
        assert answer.published and answer.published_at is not None

        # The journal records each application once, after the wait was reached.
        journal = client.get_run(run_id).step("cart").journal
        updates = [e for e in journal if e.function == "cyclone.update"]
        assert [e.step_id for e in updates] == ["update:u-1", f"update:{second.update_id}"]
        assert updates[0].output == {"update": "add_item", "args": ["apple"], "result": 1}

        client.send_event(run_id, "checkout")
        run = client.wait(run_id, timeout=PATIENCE)
        # The replay after the event applied the updates again from the journal.
        assert run.step("cart").output == {"user": "ann", "items": ["apple", "pear"]}
        assert client.query(run_id, "cart", "items").result == ["apple", "pear"]


def test_refusals_name_what_happened(cyclone_server):
    with running(_worker(cyclone_server.address)), Client(cyclone_server.address) as client:
        run_id = client.start("cart", "bob")
        eventually(lambda: _waiting(client, run_id, "cart"), "the body waits for checkout")

        with pytest.raises(NotFound, match="no update handler 'remove_item'"):
            client.update(run_id, "cart", "remove_item", "apple")
        with pytest.raises(FailedPrecondition, match="raised ValueError: an item needs a name"):
            client.update(run_id, "cart", "add_item", "")
        with pytest.raises(CycloneError) as exists:
            client.update(run_id, "cart", "add_item", "kiwi", update_id="u-2")
            client.update(run_id, "cart", "add_item", "plum", update_id="u-2")
        assert exists.value.code == grpc.StatusCode.ALREADY_EXISTS
        eventually(lambda: _waiting(client, run_id, "cart"), "the body waits again")
        with pytest.raises(FailedPrecondition, match="published no value for query 'nothing'"):
            client.query(run_id, "cart", "nothing")
        with pytest.raises(FailedPrecondition, match="a query with arguments needs one"):
            client.query(run_id, "cart", "has", "kiwi")
        with pytest.raises(NotFound, match="has no node nowhere"):
            client.query(run_id, "nowhere", "items")

        client.send_event(run_id, "checkout")
        assert client.wait(run_id, timeout=PATIENCE).status == "completed"
        with pytest.raises(FailedPrecondition, match="is completed: it takes no more updates"):
            client.update(run_id, "cart", "add_item", "fig")
        # A finished run still answers from what its body published last.
        assert client.query(run_id, "cart", "items").result == ["kiwi"]


def test_a_query_is_answered_by_the_worker_running_the_body(cyclone_server):
    GATE.clear()
    with running(_worker(cyclone_server.address)), Client(cyclone_server.address) as client:
        run_id = client.start("looping")
        eventually(
            lambda: client.get_run(run_id).step("looping").status == "running", "the body runs"
        )
        answer = client.query(run_id, "looping", "seen")
        assert answer.result == [0] and not answer.published
        with pytest.raises(NotFound, match="no query handler 'other'"):
            client.query(run_id, "looping", "other")
        GATE.set()
        assert client.wait(run_id, timeout=PATIENCE).step("looping").output == 3


def test_work_that_takes_no_queries_refuses_them_rather_than_time_out(cyclone_server):
    GATE.clear()
    with running(_worker(cyclone_server.address)), Client(cyclone_server.address) as client:
        body = client.start("quiet")
        wf = Workflow("plain-one")
        wf.node("work", action="plain")
        plain = client.submit(wf)
        for run_id, node in ((body, "quiet"), (plain, "work")):
            eventually(
                lambda r=run_id, n=node: client.get_run(r).step(n).status == "running",
                f"{node} runs",
            )
        # The worker running the body answers for it, though it has no handlers.
        with pytest.raises(NotFound, match="no query handler 'state' \\(it has: none\\)"):
            client.query(body, "quiet", "state", timeout=30)
        # A plain handler's worker takes no queries: the server says so once none took it.
        with pytest.raises(FailedPrecondition, match="no worker took query 'state'") as refused:
            client.query(plain, "work", "state", timeout=30)
        assert "plain handler" in str(refused.value)
        with pytest.raises(FailedPrecondition, match="a query with arguments needs one"):
            client.query(plain, "work", "state", 1, timeout=30)
        # An update reaches the body and is refused at its next journal point.
        with pytest.raises(CycloneError, match="recorded but was not applied") as pending:
            client.update(body, "quiet", "reset", update_id="r-1", timeout=0.5)
        assert pending.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        GATE.set()
        with pytest.raises(NotFound, match="no update handler 'reset' \\(it has: none\\)"):
            client.update(body, "quiet", "reset", update_id="r-1", timeout=60)
        assert client.wait(body, timeout=PATIENCE).step("quiet").output == 1
        assert client.wait(plain, timeout=PATIENCE).status == "completed"


def test_an_update_sent_while_its_node_is_claimed_counts_for_the_new_attempt(
    cyclone_server, database_url
):
    """update_send waits for a claim of the node under way and records the update after
    the attempt's start: step_wait then knows the attempt has not applied it."""
    with Client(cyclone_server.address) as client:
        run_id = client.start("quiet")  # no worker: the claim below is made by hand
        with psycopg.connect(database_url) as claim:
            claim.execute(
                "UPDATE cyclone.steps SET status = 'running', attempt = attempt + 1, "
                "lease_token = gen_random_uuid(), lease_expires_at = cyclone.now() + "
                "interval '1 hour', started_at = cyclone.now() + interval '1 minute', "
                "last_heartbeat_at = cyclone.now(), "
                "deadline_at = cyclone.now() + interval '1 hour' "
                "WHERE run_id = %s AND node = 'quiet'",
                (run_id,),
            )
            sent: list[BaseException] = []

            def send() -> None:
                try:
                    client.update(run_id, "quiet", "reset", update_id="u-claimed", timeout=0.2)
                except CycloneError as exc:
                    sent.append(exc)

            sender = threading.Thread(target=send)
            sender.start()
            with psycopg.connect(database_url, autocommit=True) as look:
                eventually(
                    lambda: look.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND query LIKE '%update_send%'"
                    ).fetchone(),
                    "UpdateRun waits for the claim's commit",
                )
            claim.commit()
            sender.join(PATIENCE)
        assert len(sent) == 1 and "not applied within" in str(sent[0])
        with psycopg.connect(database_url) as conn:
            created, started = conn.execute(
                "SELECT u.created_at, s.started_at FROM cyclone.run_updates u "
                "JOIN cyclone.steps s USING (run_id, node) WHERE u.update_id = 'u-claimed'"
            ).fetchone()
        assert created > started


def test_the_cli_queries_and_updates(cyclone_server, capsys):
    address = ["--address", cyclone_server.address]
    with running(_worker(cyclone_server.address)), Client(cyclone_server.address) as client:
        run_id = client.start("cart", "cy")
        eventually(lambda: _waiting(client, run_id, "cart"), "the body waits for checkout")
        capsys.readouterr()

        assert cli.main(["update", run_id, "cart", "add_item", '"fig"', "--id", "f", *address]) == 0
        assert capsys.readouterr().out == "1\n"
        assert cli.main(["update", run_id, "cart", "add_item", '"fig"', "--id", "f", *address]) == 0
        assert "was sent before" in capsys.readouterr().out
        eventually(lambda: _waiting(client, run_id, "cart"), "the body waits again")

        def published() -> Any:
            if cli.main(["query", run_id, "cart", "items", "--json", *address]) != 0:
                return None
            answer = json.loads(capsys.readouterr().out)
            return answer if answer["result"] == ["fig"] else None

        assert eventually(published, "the published items")["published"] is True
        assert cli.main(["query", run_id, "cart", "has", '"fig"', *address]) == 1
        assert "a query with arguments needs one" in capsys.readouterr().err
        assert cli.main(["update", run_id, "cart", "add_item", "{bad", *address]) == 1
        assert "is not valid JSON" in capsys.readouterr().err
        client.send_event(run_id, "checkout")
        client.wait(run_id, timeout=PATIENCE)
