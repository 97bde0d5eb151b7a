"""Heartbeat progress end to end: a handler records progress, fails, and the next
attempt of the same node resumes from it; GetRun shows the last value."""

from __future__ import annotations

from pyclient import RetryAfter, Workflow
from tests.sdk.conftest import PATIENCE, running


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
