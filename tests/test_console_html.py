"""The console's pages as HTML, without a browser: a real server, the console serving
in a thread, and plain HTTP requests with a cookie jar. tests/test_console.py drives the
same console in Chromium (make test-all); these run in `make test`."""

from __future__ import annotations

import datetime as dt
import html
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any

import pytest

from cyclone.v1 import schedule_service_pb2 as schedule_pb
from cyclone.v1 import workflow_service_pb2
from tests.console_thread import ConsoleThread
from tests.helpers import claim, get_run, node, run_status, submit, workflow
from tests.test_auth import write_tokens

HOSTILE = "<script>window.pwned = 1</script>"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class Page:
    status: int
    text: str
    headers: dict[str, str]


@dataclass
class Browserless:
    """One visitor of the console: its cookies, no script, no redirects followed."""

    base: str
    jar: CookieJar = field(default_factory=CookieJar)

    def __post_init__(self) -> None:
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), _NoRedirects()
        )

    def _open(self, request: urllib.request.Request) -> Page:
        try:
            with self._opener.open(request, timeout=30) as response:
                return Page(response.status, response.read().decode(), dict(response.headers))
        except urllib.error.HTTPError as refused:
            return Page(refused.code, refused.read().decode(), dict(refused.headers))

    def get(self, path: str) -> Page:
        return self._open(urllib.request.Request(self.base + path))

    def post(self, path: str, form: dict[str, str]) -> Page:
        body = urllib.parse.urlencode(form).encode()
        return self._open(urllib.request.Request(self.base + path, data=body, method="POST"))


def csrf_of(page: Page) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert match, page.text
    return match.group(1)


def signed_in(base: str, token: str) -> Browserless:
    """A visitor of the console at ``base`` signed in with ``token``."""
    client = Browserless(base)
    login = client.get("/login")
    signed = client.post("/login", {"token": token, "next": "/runs", "csrf": csrf_of(login)})
    assert signed.status == 303
    return client


@pytest.fixture
def visitor(cyclone_server: Any) -> Iterator[Browserless]:
    console = ConsoleThread(cyclone_server.address)
    yield Browserless(console.url)
    console.stop()


def test_the_runs_page_lists_a_run_and_its_page_names_the_nodes_with_input_escaped(
    cyclone_server: Any, visitor: Browserless
) -> None:
    run_id = submit(
        cyclone_server,
        workflow("report", node("fetch"), node("build", deps=["fetch"])),
        input={"html": HOSTILE},
    )
    runs = visitor.get("/runs")
    assert runs.status == 200
    row = re.search(rf'<tr data-run="{run_id}">(.*?)</tr>', runs.text, re.S)
    assert row, runs.text
    assert "report" in row.group(1) and "running" in row.group(1)

    page = visitor.get(f"/runs/{run_id}")
    assert page.status == 200
    assert "fetch" in page.text and "build" in page.text
    assert HOSTILE not in page.text
    assert html.escape(HOSTILE, quote=False) in page.text


def test_a_run_page_shows_the_runs_deadline(cyclone_server: Any, visitor: Browserless) -> None:
    request = workflow_service_pb2.SubmitRequest(workflow=workflow("report", node("fetch")))
    request.deadline.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    with_deadline = cyclone_server.workflows.Submit(request).run_id
    without = submit(cyclone_server, workflow("report", node("fetch")))
    page = visitor.get(f"/runs/{with_deadline}")
    assert page.status == 200 and "<dt>Deadline</dt>" in page.text
    assert "<dt>Deadline</dt>" not in visitor.get(f"/runs/{without}").text


def test_the_schedules_page_shows_the_tags_of_a_schedules_runs(
    cyclone_server: Any, visitor: Browserless
) -> None:
    s = schedule_pb.Schedule(name="tagged", workflow=workflow("report", node("fetch")))
    s.interval.FromSeconds(3600)
    s.tags.update({"team": "billing", "x": HOSTILE})
    cyclone_server.schedules.CreateSchedule(schedule_pb.CreateScheduleRequest(schedule=s))
    page = visitor.get("/schedules")
    row = re.search(r'<tr data-schedule="tagged">(.*?)</tr>', page.text, re.S)
    assert page.status == 200 and row, page.text
    assert '<code class="tag">team=billing</code>' in row.group(1)
    assert HOSTILE not in page.text


def test_a_cancel_posted_with_the_pages_csrf_token_cancels_and_a_forged_one_is_refused(
    cyclone_server: Any, visitor: Browserless
) -> None:
    run_id = submit(cyclone_server, workflow("order", node("charge")))
    confirm = visitor.get(f"/runs/{run_id}/act/cancel")
    assert confirm.status == 200

    forged = visitor.post(f"/runs/{run_id}/act/cancel", {"reason": "x", "csrf": "guess"})
    assert forged.status == 403
    assert run_status(get_run(cyclone_server, run_id)) == "running"

    done = visitor.post(
        f"/runs/{run_id}/act/cancel", {"reason": "customer left", "csrf": csrf_of(confirm)}
    )
    assert done.status == 303
    assert done.headers["location"].startswith(f"/runs/{run_id}?")
    run = get_run(cyclone_server, run_id)
    assert run_status(run) == "cancelled"
    assert [(a.action, a.actor, a.reason) for a in run.audit] == [
        ("cancel", "console-test", "customer left")
    ]


def test_a_claimed_step_shows_on_the_workers_page(
    cyclone_server: Any, visitor: Browserless
) -> None:
    submit(cyclone_server, workflow("order", node("charge", action="charge-card")))
    claim(cyclone_server, "charge-card", worker="worker-7")
    page = visitor.get("/workers")
    assert page.status == 200
    row = re.search(r'<tr data-worker="worker-7">(.*?)</tr>', page.text, re.S)
    assert row, page.text
    cells = re.findall(r"<td>(.*?)</td>", row.group(1))
    assert cells[:2] == ["worker-7", "1: charge-card"]
    assert '<td class="serves">charge-card</td>' in row.group(1)


def test_a_server_that_requires_tokens_sends_the_console_to_sign_in(
    server_factory: Any, tmp_path: Path
) -> None:
    server = server_factory(token_file=write_tokens(tmp_path / "tokens.txt"))
    console = ConsoleThread(server.address)
    try:
        page = Browserless(console.url).get("/runs?status=running")
        assert page.status == 303
        assert page.headers["location"] == "/login?next=" + urllib.parse.quote(
            "/runs?status=running", safe=""
        )
    finally:
        console.stop()
