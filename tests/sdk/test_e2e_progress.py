"""Heartbeat progress end to end: a handler records progress, fails, and the next
attempt of the same node resumes from it; GetRun shows the last value."""

from __future__ import annotations

import threading

from pyclient import RetryAfter, Workflow
from tests.helpers import PATIENCE, eventually
from tests.sdk.conftest import running


def test_the_next_attempt_resumes_from_the_progress_the_failed_one_recorded(client, make_worker):
    worker = make_worker()
    seen: list[tuple[int, object]] = []

    @worker.action("crawl")
    def crawl(ctx):
        seen.append((ctx.attempt, ctx.progress))
        start = (ctx.progress or {}).get("page", 0)
        if ctx.attempt == 1:
            # Record progress and fail at once: the SDK stores it before the failure.
            ctx.heartbeat({"page": start + 3})
            raise RetryAfter(0, "rate limited")
        return {"pages": start + 2}

    wf = Workflow("crawl")
    wf.node("crawl")
    with running(worker):
        run = client.wait(client.submit(wf), timeout=PATIENCE)
    assert run.status == "completed"
    assert seen == [(1, None), (2, {"page": 3})]
    step = run.step("crawl")
    assert step.output == {"pages": 5}
    assert step.progress == {"page": 3}  # GetRun shows the last value
    assert step.attempt == 2
    assert step.last_heartbeat_at is not None


def test_a_heartbeat_the_handler_asks_for_is_sent_at_once_not_a_third_of_a_lease_later(
    client, make_worker
):
    # The first scheduled heartbeat is 30 s after the claim, so each wait below (15 s at
    # most) is answered only by a heartbeat sent on request.
    worker = make_worker(lease=90.0)
    stored = [threading.Event(), threading.Event()]

    @worker.action("crawl")
    def crawl(ctx):
        for page, seen in enumerate(stored, 1):
            ctx.heartbeat({"page": page})
            assert seen.wait(PATIENCE)
        return "done"

    wf = Workflow("crawl")
    wf.node("crawl")
    with running(worker):
        run_id = client.submit(wf)
        # the first request starts the heartbeats, the second wakes them
        for page, seen in enumerate(stored, 1):
            eventually(
                lambda page=page: client.get_run(run_id).step("crawl").progress == {"page": page},
                f"progress {page} to be stored",
                timeout=15.0,
            )
            seen.set()
        run = client.wait(run_id, timeout=PATIENCE)
    assert (run.status, run.step("crawl").output) == ("completed", "done")
