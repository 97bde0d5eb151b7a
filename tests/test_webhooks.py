"""Signed webhooks: POST /webhooks/<name> on the server's HTTP listener, checked by
HMAC-SHA256 over "<t>.<body>", a timestamp tolerance and delivery ids, then SendEvent
or SubmitOnce in one transaction; refused deliveries record nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from cyclone.v1 import admin_service_pb2 as admin_pb
from pyclient import Client, Worker, wait_for_event
from tests.helpers import PATIENCE, table_counts

SECRET = "whsec-0123456789abcdef"


def signed(body: bytes, *, secret: str = SECRET, at: float | None = None) -> str:
    t = int(time.time() if at is None else at)
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def deliver(
    server: Any,
    name: str,
    payload: Any,
    *,
    signature: str | None = None,
    delivery: str | None = None,
    raw: bytes | None = None,
) -> tuple[int, dict[str, Any]]:
    body = raw if raw is not None else json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    headers["Cyclone-Signature"] = signed(body) if signature is None else signature
    if delivery is not None:
        headers["Cyclone-Delivery"] = delivery
    request = urllib.request.Request(
        f"{server.server.http_url}/webhooks/{name}", data=body, method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, json.loads(refused.read())


@pytest.fixture
def ingress(server_factory: Any) -> Any:
    return server_factory(http_listen="127.0.0.1:0", webhook_tolerance_s=300)


def create(server: Any, secret: str = SECRET, **action: Any) -> admin_pb.CreateWebhookResponse:
    name = action.pop("name")
    hook = admin_pb.Webhook(name=name, **action)
    return server.admin.CreateWebhook(
        admin_pb.CreateWebhookRequest(webhook=hook, secret=secret),
        metadata=[("cyclone-actor", "ops@example")],
    )


def orders_hook(server: Any) -> None:
    create(
        server,
        name="orders",
        submit_once=admin_pb.WebhookSubmitOnce(workflow="order", key_pointer="/order/id"),
    )


def counts(server: Any) -> dict[str, int]:
    return {
        "runs": server.sql("SELECT count(*) FROM cyclone.runs")[0][0],
        "events": server.sql("SELECT count(*) FROM cyclone.events")[0][0],
        "deliveries": server.sql("SELECT count(*) FROM cyclone.webhook_deliveries")[0][0],
    }


def test_a_good_delivery_submits_a_run_once_by_key(ingress):
    orders_hook(ingress)
    payload = {"order": {"id": "o-17", "amount": 30}}
    status, answer = deliver(ingress, "orders", payload, delivery="d-1")
    assert status == 200 and answer["status"] == "submitted" and answer["created"] is True
    run_id = answer["run_id"]
    [(workflow, input_, key)] = ingress.sql(
        "SELECT r.workflow, r.input, r.submit_key FROM cyclone.runs r WHERE run_id = %s", run_id
    )
    assert (workflow, input_, key) == ("order", payload, "o-17")
    # Another delivery of the same order (a sender's retry with a new id): the same run.
    status, again = deliver(ingress, "orders", payload, delivery="d-2")
    assert status == 200 and again == {"status": "submitted", "run_id": run_id, "created": False}
    assert counts(ingress)["runs"] == 1


def test_bad_signature_old_timestamp_and_replays_are_refused_and_record_nothing(ingress):
    orders_hook(ingress)
    payload = {"order": {"id": "o-18"}}
    body = json.dumps(payload).encode()
    before = table_counts(ingress)

    wrong_secret = signed(body, secret="another-secret-0123456789")
    status, answer = deliver(ingress, "orders", payload, signature=wrong_secret)
    assert (status, answer["error"]) == (401, "bad_signature")
    tampered = signed(body)
    status, answer = deliver(
        ingress, "orders", None, raw=body.replace(b"o-18", b"o-19"), signature=tampered
    )
    assert (status, answer["error"]) == (401, "bad_signature")
    status, answer = deliver(ingress, "orders", payload, signature="")
    assert status == 401
    status, answer = deliver(ingress, "orders", payload, signature="t=1,v1=zz")
    assert (status, answer["error"]) == (401, "bad_signature")
    old = signed(body, at=time.time() - 301)
    status, answer = deliver(ingress, "orders", payload, signature=old)
    assert (status, answer["error"]) == (401, "timestamp_outside_tolerance")
    future = signed(body, at=time.time() + 301)
    status, answer = deliver(ingress, "orders", payload, signature=future)
    assert (status, answer["error"]) == (401, "timestamp_outside_tolerance")
    assert table_counts(ingress) == before
    assert counts(ingress) == {"runs": 0, "events": 0, "deliveries": 0}

    # A replay: the same signed delivery, by its delivery id or (without one) by its
    # signature, is taken once.
    signature = signed(body)
    assert deliver(ingress, "orders", payload, signature=signature, delivery="x-1")[0] == 200
    after_first = counts(ingress)
    status, answer = deliver(ingress, "orders", payload, signature=signature, delivery="x-1")
    assert (status, answer["error"]) == (409, "replayed")
    other = json.dumps({"order": {"id": "o-20"}}).encode()
    status, answer = deliver(ingress, "orders", None, raw=other, signature=signed(other))
    assert status == 200
    assert counts(ingress)["runs"] == after_first["runs"] + 1


def test_a_replayed_signature_without_delivery_id_is_refused(ingress):
    orders_hook(ingress)
    body = json.dumps({"order": {"id": "o-30"}}).encode()
    signature = signed(body)
    assert deliver(ingress, "orders", None, raw=body, signature=signature)[0] == 200
    runs = counts(ingress)["runs"]
    status, answer = deliver(ingress, "orders", None, raw=body, signature=signature)
    assert (status, answer["error"]) == (409, "replayed")
    assert counts(ingress)["runs"] == runs


def test_an_unknown_webhook_and_a_bad_body_are_refused(ingress):
    orders_hook(ingress)
    status, answer = deliver(ingress, "nope", {"order": {"id": "1"}})
    assert (status, answer["error"]) == (404, "not_found")
    status, answer = deliver(ingress, "orders", {"order": {}})
    assert (status, answer["error"]) == (400, "missing_field")
    status, answer = deliver(ingress, "orders", None, raw=b"{not json")
    assert (status, answer["error"]) == (400, "bad_json")
    assert counts(ingress) == {"runs": 0, "events": 0, "deliveries": 0}


@pytest.fixture
def waiting_worker(ingress: Any) -> Iterator[Worker]:
    w = Worker(ingress.address)

    @w.workflow("shipment")
    def shipment(ctx: Any, order: dict[str, Any]) -> Any:
        return wait_for_event("delivered")

    thread = threading.Thread(target=w.run, kwargs={"handle_signals": False}, daemon=True)
    thread.start()
    yield w
    w.stop()
    thread.join(30)


def test_send_event_resumes_a_waiting_body(ingress, waiting_worker):
    create(
        ingress,
        name="carrier",
        send_event=admin_pb.WebhookSendEvent(run_id_pointer="/meta/run", event="delivered"),
    )
    with Client(ingress.address) as client:
        run_id = client.start("shipment", {"id": 1})
        payload = {"meta": {"run": run_id}, "where": "front door"}
        status, answer = deliver(ingress, "carrier", payload, delivery="evt-1")
        assert status == 200 and answer["status"] == "event_sent", answer
        run = client.wait(run_id, timeout=PATIENCE)
        assert run.step("shipment").output == payload
        [(actor,)] = ingress.sql(
            "SELECT actor FROM cyclone.audit WHERE run_id = %s AND action = 'send_event'", run_id
        )
        assert actor == "webhook:carrier"
        # The run is completed: an event for it is refused, and the delivery not kept.
        deliveries = counts(ingress)["deliveries"]
        status, answer = deliver(ingress, "carrier", payload, delivery="evt-2")
        assert (status, answer["error"]) == (409, "run_finished")
        assert counts(ingress)["deliveries"] == deliveries
        missing = {"meta": {"run": "0190d0c4-0000-7000-8000-000000000000"}}
        status, answer = deliver(ingress, "carrier", missing)
        assert (status, answer["error"]) == (404, "run_not_found")


def test_webhooks_are_listed_without_secrets_and_deleted(ingress):
    made = create(
        ingress,
        secret="",
        name="made",
        send_event=admin_pb.WebhookSendEvent(run_id_pointer="/run_id", event="go"),
    )
    assert len(made.secret) >= 32
    orders_hook(ingress)
    with pytest.raises(grpc.RpcError) as taken:
        orders_hook(ingress)
    assert taken.value.code() == grpc.StatusCode.ALREADY_EXISTS
    listed = ingress.admin.ListWebhooks(admin_pb.ListWebhooksRequest())
    assert [h.name for h in listed.webhooks] == ["made", "orders"]
    assert made.secret not in str(listed)
    assert listed.webhooks[1].submit_once.key_pointer == "/order/id"
    ingress.admin.DeleteWebhook(admin_pb.DeleteWebhookRequest(name="orders"))
    status, _ = deliver(ingress, "orders", {"order": {"id": "1"}})
    assert status == 404
    with pytest.raises(grpc.RpcError) as gone:
        ingress.admin.DeleteWebhook(admin_pb.DeleteWebhookRequest(name="orders"))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    for bad in (
        {"name": "bad name", "send_event": admin_pb.WebhookSendEvent(event="go")},
        {"name": "x"},
        {"name": "y", "submit_once": admin_pb.WebhookSubmitOnce(workflow="w")},
        {"name": "z", "send_event": admin_pb.WebhookSendEvent(event="go", run_id_pointer="r")},
    ):
        with pytest.raises(grpc.RpcError) as refused:
            create(ingress, **bad)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
    with pytest.raises(grpc.RpcError) as short:
        create(ingress, secret="short", name="s", send_event=admin_pb.WebhookSendEvent(event="go"))
    assert short.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_cli_creates_lists_and_deletes_webhooks(ingress, capsys):
    from pyclient import cli

    address = ["--address", ingress.address, "--actor", "ops@example"]
    assert (
        cli.main(
            [
                "webhook",
                "create",
                "orders",
                "--submit-once",
                "order",
                "--key-pointer",
                "/order/id",
                *address,
            ]
        )
        == 0
    )
    made = capsys.readouterr().out
    assert "orders  submit_once order, key at /order/id" in made
    secret = made.split("secret (shown once): ")[1].strip()
    body = json.dumps({"order": {"id": "c-1"}}).encode()
    status, answer = deliver(
        ingress, "orders", None, raw=body, signature=signed(body, secret=secret)
    )
    assert status == 200 and answer["created"] is True
    assert (
        cli.main(
            ["webhook", "create", "carrier", "--event", "delivered", "--secret", SECRET, *address]
        )
        == 0
    )
    assert "secret" not in capsys.readouterr().out
    assert cli.main(["webhook", "list", "--json", *address]) == 0
    listed = json.loads(capsys.readouterr().out)["webhooks"]
    assert [(h["name"], h["created_by"]) for h in listed] == [
        ("carrier", "ops@example"),
        ("orders", "ops@example"),
    ]
    assert secret not in json.dumps(listed) and SECRET not in json.dumps(listed)
    assert cli.main(["webhook", "delete", "orders", *address]) == 0
    assert capsys.readouterr().out.strip() == "webhook orders deleted"
    assert [
        h.name for h in ingress.admin.ListWebhooks(admin_pb.ListWebhooksRequest()).webhooks
    ] == ["carrier"]


def test_http_requests_are_counted_by_endpoint_and_outcome(ingress):
    orders_hook(ingress)
    body = json.dumps({"order": {"id": "m-1"}}).encode()
    assert deliver(ingress, "orders", None, raw=body, signature=signed(body, secret="x" * 20))[
        0
    ] == (401)
    assert deliver(ingress, "orders", None, raw=body)[0] == 200
    registry = ingress.server.metrics.registry

    def count(endpoint: str, outcome: str) -> float | None:
        labels = {"endpoint": endpoint, "outcome": outcome}
        return registry.get_sample_value("cyclone_http_requests_total", labels)

    assert count("webhooks", "bad_signature") == 1
    assert count("webhooks", "submitted") == 1
    assert count("callbacks", "decided") is None
