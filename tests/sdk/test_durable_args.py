"""The digest of a step call's arguments: its exact algorithm, what a replay does when
a recorded call is made with other arguments, the ways to opt out, and the digest on
a real server (stored, in GetRun's journal, refused when malformed)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Any

import grpc
import psycopg
import pytest

from cyclone.v1 import worker_service_pb2 as pb
from pyclient import ArgumentsNotJson, ReplayMismatch, RetryPolicy, step, testing
from pyclient.durable._digest import args_digest
from tests.helpers import PATIENCE, claim, get_run, node, rpc_error, submit, workflow
from tests.sdk.conftest import running

#: What the bodies below pass to their steps; a test changes it between two attempts,
#: as a deploy (or a body reading more than its input) would.
argument: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    argument.clear()
    argument["amount"] = 42


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclasses.dataclass
class Order:
    id: str
    lines: tuple[int, ...]


def test_the_digest_is_the_sha256_of_the_canonical_json_of_args_and_kwargs():
    def f(*args: Any, **kwargs: Any) -> None: ...

    assert args_digest("f", f, ("é", 1, 2.5, None, True), {}) == sha('[["é",1,2.5,null,true],{}]')
    assert args_digest("f", f, (), {"b": [1, (2, 3)], "a": {"y": 1, "x": 2}}) == sha(
        '[[],{"a":{"x":2,"y":1},"b":[1,[2,3]]}]'
    )
    # A dataclass is the object of its fields.
    assert args_digest("f", f, (Order("o-1", (1, 2)),), {}) == sha(
        '[[{"id":"o-1","lines":[1,2]}],{}]'
    )


def test_an_argument_that_is_not_json_is_refused_naming_the_step_and_the_argument():
    class Connection: ...

    @step
    def save(conn: Any, order_id: str) -> None:
        argument["saved"] = True

    def body(ctx):
        save(Connection(), "o-1")

    attempt = testing.DurableNode(body).run()
    assert attempt.status == "failed" and not attempt.retryable
    assert isinstance(attempt.error, ArgumentsNotJson) and isinstance(attempt.error, TypeError)
    message = str(attempt.error)
    assert "step 'save'" in message and "argument 'conn' (Connection)" in message
    assert "@step(check_args=False)" in message and "@step(digest=" in message
    assert "saved" not in argument  # the call was not made


def charge_body(ctx) -> Any:
    return charge(argument["amount"])


@step
def charge(amount: int) -> dict:
    return {"charged": amount}


def test_a_changed_argument_fails_the_replay_naming_the_step():
    node = testing.DurableNode(charge_body)
    assert node.run(crash=testing.END).status == "crashed"
    assert node.journal[0].args_digest == sha("[[42],{}]")
    argument["amount"] = 43
    attempt = node.run()
    assert attempt.status == "failed" and not attempt.retryable
    assert isinstance(attempt.error, ReplayMismatch)
    message = str(attempt.error)
    assert "step 'charge' of charge (call #1)" in message
    assert "with other arguments" in message
    assert "patched()" in message and "durable-functions.md#changing-code-safely" in message


def test_the_same_arguments_replay_as_before():
    node = testing.DurableNode(charge_body)
    node.run(crash=testing.END)
    attempt = node.run()
    assert attempt.output == {"charged": 42} and attempt.replayed == ("charge",)


@step(on_args_change="allow")
def lenient_charge(amount: int) -> dict:
    return {"charged": amount}


def test_a_step_that_allows_a_change_replays_its_record_and_logs_a_warning(caplog):
    def body(ctx):
        return lenient_charge(argument["amount"])

    node = testing.DurableNode(body)
    node.run(crash=testing.END)
    argument["amount"] = 43
    with caplog.at_level(logging.WARNING, logger="pyclient.durable"):
        attempt = node.run()
    assert attempt.output == {"charged": 42}  # the recorded outcome
    [record] = [r for r in caplog.records if r.name == "pyclient.durable"]
    assert record.levelno == logging.WARNING
    assert "step 'lenient_charge'" in record.getMessage()
    assert "on_args_change='allow'" in record.getMessage()


def test_a_step_without_argument_checks_records_no_digest_and_checks_none():
    @step(check_args=False)
    def save(conn: Any, amount: int) -> int:
        return amount

    def body(ctx):
        return save(object(), argument["amount"])

    node = testing.DurableNode(body)
    node.run(crash=testing.END)
    assert node.journal[0].args_digest == ""
    argument["amount"] = 43
    assert node.run().output == 42


def test_a_digest_function_names_what_stands_for_the_arguments():
    @step(digest=lambda conn, order_id: order_id)
    def save(conn: Any, order_id: str) -> str:
        return order_id

    def body(ctx):
        return save(object(), argument["order_id"])

    argument["order_id"] = "o-1"
    node = testing.DurableNode(body)
    node.run(crash=testing.END)
    assert node.journal[0].args_digest == sha('"o-1"')
    argument["order_id"] = "o-2"
    assert isinstance(node.run().error, ReplayMismatch)


def test_an_entry_recorded_without_a_digest_is_not_checked():
    node = testing.DurableNode(charge_body)
    node.run(crash=testing.END)
    # As an older worker (or another language's without digests) would have recorded it.
    entries = node._journal._entries
    entries["charge"] = dataclasses.replace(entries["charge"], args_digest="")
    argument["amount"] = 43
    assert node.run().output == {"charged": 42}


def test_the_instance_of_a_step_method_is_not_part_of_the_digest():
    class Shop:
        @step
        def charge(self, amount: int) -> int:
            return amount

    shop = Shop()
    node = testing.DurableNode(lambda ctx: shop.charge(argument["amount"]))
    assert node.run(crash=testing.END).status == "crashed"
    assert node.journal[0].args_digest == sha("[[42],{}]")


@pytest.mark.parametrize(
    ("options", "error", "words"),
    [
        ({"digest": "order_id"}, TypeError, "digest= must be a function"),
        ({"on_args_change": "maybe"}, ValueError, "on_args_change must be 'fail' or 'allow'"),
    ],
)
def test_bad_argument_options_are_refused_when_the_step_is_declared(options, error, words):
    with pytest.raises(error, match=words):

        @step(**options)
        def anything() -> None: ...


# -- on a real server


AT_ONCE = RetryPolicy(max_attempts=3, initial_backoff=0, max_backoff=0)


@pytest.mark.usefixtures("cyclone_server")
def test_the_digest_is_stored_and_in_get_runs_journal_and_a_changed_argument_fails_the_node(
    client, make_worker
):
    @step
    def pay(order: dict) -> str:
        return f"paid {order['amount']}"

    @step(unsafe_to_repeat=True)
    def ship(order_id: str) -> str:
        return f"shipped {order_id}"

    @step
    def confirm() -> str:
        if argument.get("fail_confirm", True):
            argument["fail_confirm"] = False
            argument["amount"] = 43  # changed before the retry replays pay
            raise ConnectionError("crash after the payment")
        return "confirmed"

    worker = make_worker()

    @worker.workflow("pay")
    def body(ctx):
        return [pay({"id": "o-1", "amount": argument["amount"]}), ship("o-1"), confirm()]

    with running(worker):
        run = client.wait(client.start("pay", retry=AT_ONCE), timeout=PATIENCE)
    assert run.status == "failed"
    node = run.step("pay")
    assert [(c.step_id, c.args_digest) for c in node.journal] == [
        ("pay", sha('[[{"amount":42,"id":"o-1"}],{}]')),
        ("ship", sha('[["o-1"],{}]')),
    ]
    error = node.last_error
    assert error is not None and error.type == "ReplayMismatch" and not error.retryable
    assert "step 'pay' of " in error.message
    assert "(call #1) was recorded with other arguments" in error.message


BAD_DIGESTS = ["abc", "A" * 64, "g" * 64, "0" * 63, "0" * 65, " " + "0" * 63]


def held_step(server: Any) -> Any:
    """A claimed step of a fresh one-node run, on the raw API."""
    run_id = submit(server, workflow("digests", node("n", action="digests")))
    [claimed] = claim(server, "digests")
    assert claimed.run_id == run_id
    return claimed


def journal_rows(server: Any, run_id: str) -> list[tuple[str, str | None]]:
    return server.sql(
        "SELECT step_id, args_digest FROM cyclone.step_calls WHERE run_id = %s::uuid ORDER BY seq",
        run_id,
    )


@pytest.mark.parametrize("digest", BAD_DIGESTS)
def test_a_malformed_digest_on_the_wire_is_refused_and_nothing_is_written(cyclone_server, digest):
    held = held_step(cyclone_server)
    key = {"run_id": held.run_id, "node": held.node, "lease_token": held.lease_token}
    call = {"step_id": "s", "seq": 1, "function": "f", "args_digest": digest}
    begin = pb.BeginStepCallRequest(**key, **call, unsafe_to_repeat=True)
    end = pb.EndStepCallRequest(**key, **call)
    end.output.string_value = "x"
    many = pb.CompleteManyRequest(step_call_ends=[end])
    for method, request in (
        (cyclone_server.workers.BeginStepCall, begin),
        (cyclone_server.workers.EndStepCall, end),
        (cyclone_server.workers.CompleteMany, many),
    ):
        error = rpc_error(method, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
        assert "args_digest must be 64 lowercase hexadecimal characters" in error.details()
    assert journal_rows(cyclone_server, held.run_id) == []


def test_the_digest_goes_through_begin_end_and_the_workers_own_transaction(cyclone_server):
    held = held_step(cyclone_server)
    key = {"run_id": held.run_id, "node": held.node, "lease_token": held.lease_token}
    good = sha("[[1],{}]")
    workers = cyclone_server.workers
    workers.BeginStepCall(
        pb.BeginStepCallRequest(
            **key, step_id="a", seq=1, function="f", unsafe_to_repeat=True, args_digest=good
        )
    )
    # An End without a digest keeps the one its Begin recorded.
    end = pb.EndStepCallRequest(**key, step_id="a", seq=1, function="f", unsafe_to_repeat=True)
    end.output.number_value = 1
    assert workers.EndStepCall(end).call.args_digest == good
    record = "SELECT cyclone.step_call_record(%s::uuid, %s, %s::uuid, %s, %s, %s, %s::jsonb, %s)"
    with psycopg.connect(cyclone_server.database_url) as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(record, (*key.values(), "b", 2, "f", "2", "NOT-HEX"))
        assert refused.value.sqlstate == "CY004"
    with psycopg.connect(cyclone_server.database_url) as conn:
        conn.execute(record, (*key.values(), "b", 2, "f", "2", good))
        # The signature without a digest, as older workers call it, still records.
        conn.execute(record.replace(", %s)", ")"), (*key.values(), "c", 3, "f", "3"))
    assert journal_rows(cyclone_server, held.run_id) == [("a", good), ("b", good), ("c", None)]
    journal = get_run(cyclone_server, held.run_id).steps[0].journal
    assert [c.args_digest for c in journal] == [good, good, ""]
