"""Approvals by token: a durable function asks for a decision with wait_for_approval,
hands its URL out, and waits without a worker; POST /callbacks/<token> on the server's
HTTP listener (or AdminService.DecideApproval) decides it once."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from cyclone.v1 import admin_service_pb2
from pyclient import Client, EventTimeout, Worker, step, wait_for_approval
from tests.helpers import PATIENCE, eventually

#: The URLs each run's body handed out, by run id (what a mail would carry).
SENT: dict[str, list[str]] = {}
#: How many times each run's follow-up step ran.
AFTER: dict[str, int] = {}
LOCK = threading.Lock()


@step
def mail(run_id: str, url: str) -> None:
    with LOCK:
        SENT.setdefault(run_id, []).append(url)


@step
def book(run_id: str, decision: Any) -> str:
    with LOCK:
        AFTER[run_id] = AFTER.get(run_id, 0) + 1
    return "booked" if decision.get("approved") else "refused"


def post(url: str, body: Any) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, json.loads(refused.read())


@pytest.fixture
def ingress(server_factory: Any) -> Any:
    return server_factory(http_listen="127.0.0.1:0")


@pytest.fixture
def worker(ingress: Any) -> Iterator[Worker]:
    w = Worker(ingress.address)

    @w.workflow("trip")
    def trip(ctx: Any, plan: dict[str, Any]) -> str:
        decision = wait_for_approval(
            lambda approval: mail(ctx.run_id, approval.url),
            timeout=plan.get("timeout"),
            title=f"trip to {plan['to']}",
        )
        return book(ctx.run_id, decision)

    @w.workflow("expiring")
    def expiring(ctx: Any, plan: dict[str, Any]) -> str:
        try:
            wait_for_approval(lambda a: mail(ctx.run_id, a.url), timeout=1)
        except EventTimeout:
            return "expired"
        return "decided"

    @w.workflow("trip_async")
    async def trip_async(ctx: Any, plan: dict[str, Any]) -> str:
        async def send(approval: Any) -> None:
            mail(ctx.run_id, approval.url)

        decision = await wait_for_approval(send, title=f"trip to {plan['to']}")
        return book(ctx.run_id, decision)

    thread = threading.Thread(target=w.run, kwargs={"handle_signals": False}, daemon=True)
    thread.start()
    yield w
    w.stop()
    thread.join(30)


def url_of(run_id: str) -> str:
    eventually(lambda: SENT.get(run_id), "the body sent the approval's URL")
    [url] = SENT[run_id]
    return url


def waiting(server: Any, run_id: str) -> bool:
    rows = server.sql(
        "SELECT status FROM cyclone.step_calls WHERE run_id = %s AND step_id = 'approval.wait'",
        run_id,
    )
    return rows == [("waiting",)]


def test_the_body_waits_for_the_approval_and_goes_on_with_its_payload(ingress, worker):
    with Client(ingress.address) as client:
        run_id = client.start("trip", {"to": "Lyon"})
        url = url_of(run_id)
        assert url.startswith(f"http://127.0.0.1:{ingress.server.http.port}/callbacks/")
        eventually(lambda: waiting(ingress, run_id), "the body waits for the decision")
        # The token is stored only as its hash.
        token = url.rsplit("/", 1)[1]
        [(stored,)] = ingress.sql("SELECT token_sha256 FROM cyclone.approvals")
        assert bytes(stored) == hashlib.sha256(token.encode()).digest()
        assert token not in json.dumps(ingress.sql("SELECT * FROM cyclone.step_calls"), default=str)

        status, answer = post(url, {"approved": True, "comment": "have fun"})
        assert status == 200 and answer["status"] == "decided"
        assert answer["run_id"] == run_id
        run = client.wait(run_id, timeout=PATIENCE)
        assert run.step("trip").output == "booked"
        assert SENT[run_id] == [url]  # the replay did not send it again
        assert AFTER[run_id] == 1
        [(actor, details)] = ingress.sql(
            "SELECT actor, details FROM cyclone.audit WHERE run_id = %s "
            "AND action = 'decide_approval'",
            run_id,
        )
        assert actor == "callback" and details["approved"] is True

        # Replayed: already done, and nothing changes.
        status, answer = post(url, {"approved": False})
        assert status == 409 and answer["error"] == "already_decided"
        assert ingress.sql("SELECT decision FROM cyclone.approvals") == [
            ({"approved": True, "comment": "have fun"},)
        ]


def test_an_async_body_waits_for_its_approval_too(ingress, worker):
    with Client(ingress.address) as client:
        run_id = client.start("trip_async", {"to": "Riga"})
        url = url_of(run_id)
        eventually(lambda: waiting(ingress, run_id), "the body waits for the decision")
        status, answer = post(url, {"approved": True})
        assert status == 200, answer
        run = client.wait(run_id, timeout=PATIENCE)
        assert run.step("trip_async").output == "booked"
        assert SENT[run_id] == [url] and AFTER[run_id] == 1
        journal = ingress.sql(
            "SELECT step_id, function, status FROM cyclone.step_calls WHERE run_id = %s "
            "ORDER BY seq",
            run_id,
        )
        assert [(step_id, status) for step_id, _, status in journal] == [
            ("approval", "succeeded"),
            ("approval.wait", "succeeded"),
            ("book", "succeeded"),
        ]
        assert [function for _, function, _ in journal][:2] == [
            "cyclone.approval",
            "cyclone.event",
        ]


def test_concurrent_posts_decide_once(ingress, worker):
    with Client(ingress.address) as client:
        run_id = client.start("trip", {"to": "Oslo"})
        url = url_of(run_id)
        eventually(lambda: waiting(ingress, run_id), "the body waits for the decision")
        bodies = [{"approved": i % 2 == 0, "n": i} for i in range(8)]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda b: post(url, b), bodies))
        codes = sorted(status for status, _ in answers)
        assert codes == [200] + [409] * 7, answers
        [winner] = [
            body for body, (status, _) in zip(bodies, answers, strict=True) if status == 200
        ]
        run = client.wait(run_id, timeout=PATIENCE)
        assert run.step("trip").output == ("booked" if winner["approved"] else "refused")
        events = ingress.sql("SELECT payload FROM cyclone.events WHERE run_id = %s", run_id)
        assert events == [(winner,)]
        assert AFTER[run_id] == 1


def test_forged_and_unknown_tokens_are_refused(ingress, worker):
    with Client(ingress.address) as client:
        run_id = client.start("trip", {"to": "Rome"})
        url = url_of(run_id)
        eventually(lambda: waiting(ingress, run_id), "the body waits for the decision")
        base = url.rsplit("/", 1)[0]
        token = url.rsplit("/", 1)[1]
        forged = token[:-1] + ("A" if token[-1] != "A" else "B")
        for bad in (forged, "x" * 43, "short", "..%2F..%2Fetc"):
            status, answer = post(f"{base}/{bad}", {"approved": True})
            assert status == 404 and answer["error"] == "not_found", (bad, answer)
        assert ingress.sql("SELECT count(*) FROM cyclone.events") == [(0,)]
        assert ingress.sql("SELECT decided_at FROM cyclone.approvals") == [(None,)]
        # Not JSON: refused, nothing decided.
        request = urllib.request.Request(url, data=b"{nope", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        with refused.value:
            assert refused.value.code == 400
        assert ingress.sql("SELECT decided_at FROM cyclone.approvals") == [(None,)]


def test_an_expired_token_is_refused_and_the_body_gets_event_timeout(ingress, worker):
    with Client(ingress.address) as client:
        run_id = client.start("expiring", {})
        url = url_of(run_id)
        run = client.wait(run_id, timeout=PATIENCE)
        assert run.step("expiring").output == "expired"
        status, answer = post(url, {"approved": True})
        assert status == 410 and answer["error"] in ("expired", "run_finished")
        assert ingress.sql("SELECT count(*) FROM cyclone.events") == [(0,)]


def test_a_token_past_its_expiry_is_refused(ingress, worker):
    with Client(ingress.address) as client:
        run_id = client.start("trip", {"to": "Bern", "timeout": 3600})
        url = url_of(run_id)
        eventually(lambda: waiting(ingress, run_id), "the body waits for the decision")
        ingress.advance_clock(3601)
        with pytest.raises(urllib.error.HTTPError) as page:
            urllib.request.urlopen(url, timeout=30)
        with page.value:
            assert page.value.code == 410 and "expired" in page.value.read().decode()
        status, answer = post(url, {"approved": True})
        assert status == 410 and answer["error"] == "expired", answer
        assert ingress.sql("SELECT decided_at FROM cyclone.approvals") == [(None,)]


def test_decide_approval_over_grpc_is_audited_with_the_actor(ingress, worker):
    with Client(ingress.address) as client:
        run_id = client.start("trip", {"to": "Porto"})
        url_of(run_id)
        eventually(lambda: waiting(ingress, run_id), "the body waits for the decision")
        listed = ingress.admin.ListApprovals(admin_service_pb2.ListApprovalsRequest())
        [approval] = listed.approvals
        assert (approval.run_id, approval.title, approval.workflow) == (
            run_id,
            "trip to Porto",
            "trip",
        )
        decided = ingress.admin.DecideApproval(
            admin_service_pb2.DecideApprovalRequest(
                approval_id=approval.approval_id, approved=False, comment="too far"
            ),
            metadata=[("cyclone-actor", "ops@example")],
        )
        assert decided.approval.decided_by == "ops@example"
        run = client.wait(run_id, timeout=PATIENCE)
        assert run.step("trip").output == "refused"
        with pytest.raises(grpc.RpcError) as again:
            ingress.admin.DecideApproval(
                admin_service_pb2.DecideApprovalRequest(
                    approval_id=approval.approval_id, approved=True
                )
            )
        assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert ingress.admin.ListApprovals(admin_service_pb2.ListApprovalsRequest()).approvals == []
        [(actor, reason)] = ingress.sql(
            "SELECT actor, reason FROM cyclone.audit WHERE action = 'decide_approval'"
        )
        assert (actor, reason) == ("ops@example", "too far")


def test_the_console_lists_pending_approvals_and_approve_is_audited(ingress, worker):
    from tests.console_thread import ConsoleThread
    from tests.test_console_html import Browserless, csrf_of

    console = ConsoleThread(ingress.address)
    try:
        visitor = Browserless(console.url)
        with Client(ingress.address) as client:
            run_id = client.start("trip", {"to": "<b>Graz</b>"})
            url_of(run_id)
            eventually(lambda: waiting(ingress, run_id), "the body waits for the decision")
            run_page = visitor.get(f"/runs/{run_id}?node=trip")
            assert f'href="/approvals?run={run_id}">Approve or reject</a>' in run_page.text
            page = visitor.get(f"/approvals?run={run_id}")
            assert page.status == 200
            assert "trip to &lt;b&gt;Graz&lt;/b&gt;" in page.text and "<b>Graz" not in page.text
            [approval_id] = re.findall(r'data-approval="([^"]+)"', page.text)
            path = f"/approvals/{approval_id}"
            form = {"decision": "approve", "comment": "enjoy"}
            assert visitor.post(path, form).status == 403  # no CSRF token
            assert visitor.post(path, {**form, "csrf": "guess"}).status == 403
            assert ingress.sql("SELECT decided_at FROM cyclone.approvals") == [(None,)]

            done = visitor.post(path, {**form, "csrf": csrf_of(page)})
            assert done.status == 303
            run = client.wait(run_id, timeout=PATIENCE)
            assert run.step("trip").output == "booked"
            audit = [(a.action, a.actor, a.reason) for a in run.audit]
            assert ("decide_approval", "console-test", "enjoy") in audit
            after = visitor.get("/approvals")
            assert "No approval is pending" in after.text
            # Decided already: the console shows the server's refusal.
            again = visitor.post(path, {**form, "csrf": csrf_of(page)})
            assert again.status == 409 and "decided already" in again.text
    finally:
        console.stop()


def test_a_client_token_cannot_decide_an_approval_in_the_console(server_factory, tmp_path):
    from cyclone.v1 import worker_service_pb2, workflow_service_pb2
    from tests.console_thread import ConsoleThread
    from tests.helpers import node, workflow
    from tests.test_auth import TOKENS, bearer, write_tokens
    from tests.test_console_html import csrf_of, signed_in

    server = server_factory(
        token_file=write_tokens(tmp_path / "tokens.txt"), http_listen="127.0.0.1:0"
    )
    admin = bearer(TOKENS["admin"])
    run_id = server.workflows.Submit(
        workflow_service_pb2.SubmitRequest(workflow=workflow("refund", node("ask", action="ask"))),
        metadata=admin,
    ).run_id
    [held] = server.workers.Claim(
        worker_service_pb2.ClaimRequest(
            worker_id="w", actions=[worker_service_pb2.ActionSpec(name="ask")], max_steps=1
        ),
        metadata=admin,
    ).steps
    made = server.workers.CreateApproval(
        worker_service_pb2.CreateApprovalRequest(
            run_id=run_id,
            node="ask",
            lease_token=held.lease_token,
            step_id="approval",
            title="refund 30 EUR",
        ),
        metadata=bearer(TOKENS["worker"]),
    )
    assert made.url.endswith("/callbacks/" + made.token) and made.event == (
        "approval:" + made.approval_id
    )
    console = ConsoleThread(server.address)
    try:
        carl = signed_in(console.url, TOKENS["client"])
        page = carl.get("/approvals")
        assert "refund 30 EUR" in page.text
        refused = carl.post(
            f"/approvals/{made.approval_id}",
            {"decision": "approve", "csrf": csrf_of(page)},
        )
        assert refused.status == 403 and "PERMISSION_DENIED" in refused.text
        assert server.sql("SELECT decided_at FROM cyclone.approvals") == [(None,)]
        assert server.sql("SELECT count(*) FROM cyclone.audit") == [(0,)]
        alice = signed_in(console.url, TOKENS["admin"])
        page = alice.get("/approvals")
        done = alice.post(
            f"/approvals/{made.approval_id}", {"decision": "reject", "csrf": csrf_of(page)}
        )
        assert done.status == 303
        [(actor, decision)] = server.sql("SELECT decided_by, decision FROM cyclone.approvals")
        assert actor == "alice"
        assert decision == {"approved": False, "comment": "", "decided_by": "alice"}
    finally:
        console.stop()


def test_a_person_opens_the_url_and_decides_with_the_form(ingress, worker):
    with Client(ingress.address) as client:
        run_id = client.start("trip", {"to": "<script>x</script>"})
        url = url_of(run_id)
        eventually(lambda: waiting(ingress, run_id), "the body waits for the decision")
        for _ in range(2):  # opening the link (or a scanner following it) decides nothing
            with urllib.request.urlopen(url, timeout=30) as page:
                text = page.read().decode()
                assert page.status == 200
                assert page.headers["Referrer-Policy"] == "no-referrer"
        assert "trip to &lt;script&gt;" in text and "<script>x" not in text
        assert 'value="true">Approve</button>' in text
        assert ingress.sql("SELECT decided_at FROM cyclone.approvals") == [(None,)]

        form = urllib.parse.urlencode({"approved": "false", "comment": "not now"}).encode()
        request = urllib.request.Request(url, data=form, method="POST")
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200 and "Your decision is recorded" in answer.read().decode()
        run = client.wait(run_id, timeout=PATIENCE)
        assert run.step("trip").output == "refused"
        [(decision,)] = ingress.sql("SELECT decision FROM cyclone.approvals")
        assert decision == {"approved": False, "comment": "not now"}
        with pytest.raises(urllib.error.HTTPError) as decided:
            urllib.request.urlopen(url, timeout=30)
        with decided.value:
            assert decided.value.code == 409
            assert "decided already" in decided.value.read().decode()
        with pytest.raises(urllib.error.HTTPError) as forged:
            urllib.request.urlopen(url[:-3] + "abc", timeout=30)
        with forged.value:
            assert forged.value.code == 404


def test_create_approval_again_replaces_the_token_and_keeps_a_decision(ingress):
    from cyclone.v1 import worker_service_pb2
    from tests.helpers import claim, node, submit, workflow

    run_id = submit(ingress, workflow("refund", node("ask", action="ask")))
    [held] = claim(ingress, "ask")

    def create(lease_token: str) -> worker_service_pb2.CreateApprovalResponse:
        return ingress.workers.CreateApproval(
            worker_service_pb2.CreateApprovalRequest(
                run_id=run_id, node="ask", lease_token=lease_token, step_id="approval"
            )
        )

    first = create(held.lease_token)
    # The attempt is lost before the call's outcome is recorded: its retry asks again.
    second = create(held.lease_token)
    assert second.approval_id == first.approval_id and second.token != first.token
    assert post(first.url, {"approved": True})[0] == 404  # replaced: no longer a token
    assert ingress.sql("SELECT count(*) FROM cyclone.approvals") == [(1,)]
    # A stale lease token is refused, and nothing changes.
    with pytest.raises(grpc.RpcError) as stale:
        create("00000000-0000-4000-8000-000000000000")
    assert stale.value.code() == grpc.StatusCode.ABORTED
    [(stored,)] = ingress.sql("SELECT token_sha256 FROM cyclone.approvals")
    assert bytes(stored) == hashlib.sha256(second.token.encode()).digest()
    # The default expiry is the server's --approval-timeout (7 days).
    [(days,)] = ingress.sql(
        "SELECT extract(day FROM expires_at - created_at) FROM cyclone.approvals"
    )
    assert days == 7

    assert post(second.url, {"approved": True})[0] == 200
    third = create(held.lease_token)
    assert third.decided and third.token == "" and third.url == ""
    assert third.approval_id == first.approval_id
    for bad in (0.5, 366 * 86400 + 1):
        request = worker_service_pb2.CreateApprovalRequest(
            run_id=run_id, node="ask", lease_token=held.lease_token, step_id="other"
        )
        request.timeout.FromMilliseconds(round(bad * 1000))
        with pytest.raises(grpc.RpcError) as refused:
            ingress.workers.CreateApproval(request)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
