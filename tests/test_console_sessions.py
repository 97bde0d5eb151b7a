"""The console's sessions without a browser: anonymous requests keep nothing, so no
number of them signs anyone out; a signed-in session can be pushed out only by sign-ins
with its own token; CSRF still guards every form, the sign-in form included. Through
plain HTTP against the real console and a server that requires tokens, and on
console.sessions.Sessions directly."""

from __future__ import annotations

import http.client
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest

from console.sessions import COOKIE, Session, Sessions
from tests.console_thread import ConsoleThread
from tests.test_auth import TOKENS, write_tokens


class Browser:
    """One browser: its own connection to the console and its own cookie."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.origin = url
        self.host, self.port = parts.hostname, parts.port
        self.cookie: str | None = None

    def request(
        self, method: str, path: str, form: dict[str, str] | None = None, **headers: str
    ) -> tuple[int, dict[str, str], str]:
        """(status, headers, body); the cookie is kept as a browser keeps it."""
        sent = dict(headers)
        if self.cookie is not None:
            sent["Cookie"] = f"{COOKIE}={self.cookie}"
        body = None
        if form is not None:
            body = urlencode(form)
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        # A connection per request: the console closes idle ones.
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=sent)
            response = conn.getresponse()
            text = response.read().decode()
        finally:
            conn.close()
        for name, value in response.getheaders():
            if name.lower() == "set-cookie" and value.startswith(f"{COOKIE}="):
                self.cookie = value.split(";", 1)[0].split("=", 1)[1]
        return response.status, {k.lower(): v for k, v in response.getheaders()}, text

    def csrf(self, path: str = "/login") -> str:
        """The CSRF token of the form on ``path``, as the page gives it."""
        status, _, page = self.request("GET", path)
        assert status == 200, page
        match = re.search(r'name="csrf" value="([^"]+)"', page)
        assert match, page
        return match.group(1)

    def sign_in(self, token: str) -> int:
        form = {"csrf": self.csrf(), "token": token, "next": "/runs"}
        status, headers, _ = self.request("POST", "/login", form, Origin=self.origin)
        assert status != 303 or headers["location"] == "/runs"
        return status

    def signed_in(self) -> bool:
        """Whether the runs page shows (rather than sending the browser to sign in)."""
        status, headers, _ = self.request("GET", "/runs")
        if status == 303:
            assert headers["location"].startswith("/login")
            return False
        assert status == 200
        return True


@pytest.fixture
def secured(server_factory: Any, tmp_path: Path) -> Any:
    return server_factory(token_file=write_tokens(tmp_path / "tokens.txt"))


@pytest.fixture
def sessions() -> Sessions:
    return Sessions(max_per_token=2)


@pytest.fixture
def console(secured: Any, sessions: Sessions) -> Iterator[ConsoleThread]:
    started = ConsoleThread(secured.address, sessions=sessions)
    yield started
    started.stop()


@pytest.fixture
def browsers(console: ConsoleThread) -> Any:
    return lambda: Browser(console.url)


def test_anonymous_requests_keep_nothing_and_sign_nobody_out(
    browsers: Any, sessions: Sessions
) -> None:
    operator = browsers()
    assert not operator.signed_in()
    assert operator.sign_in(TOKENS["admin"]) == 303
    assert operator.signed_in() and len(sessions) == 1
    # Many browsers without a cookie: each is given one, and the console keeps nothing.
    crowd = browsers()
    for path in ("/", "/login", "/runs", "/static/none", "/nowhere") * 100:
        crowd.cookie = None
        crowd.request("GET", path)
        assert crowd.cookie is not None
    assert len(sessions) == 1
    assert operator.signed_in()


def test_the_sign_in_form_still_needs_its_browsers_csrf_token(
    browsers: Any, sessions: Sessions
) -> None:
    victim, attacker = browsers(), browsers()
    forged = attacker.csrf()
    victim.csrf()  # the victim has a cookie of its own
    cases = [
        {"token": TOKENS["admin"]},  # no token
        {"token": TOKENS["admin"], "csrf": "guess"},
        {"token": TOKENS["admin"], "csrf": forged},  # another browser's
    ]
    for form in cases:
        status, _, body = victim.request("POST", "/login", form, Origin=victim.origin)
        assert status == 403 and "Refused" in body
    # A post from another site, even with the right token.
    form = {"token": TOKENS["admin"], "csrf": victim.csrf()}
    status, _, _ = victim.request("POST", "/login", form, Origin="https://evil.example")
    assert status == 403
    # Without the cookie (a cross-site post never carries it: SameSite=Strict).
    form = {"token": TOKENS["admin"], "csrf": victim.csrf()}
    victim.cookie = None
    status, _, _ = victim.request("POST", "/login", form, Origin=victim.origin)
    assert status == 403
    assert len(sessions) == 0 and not victim.signed_in()


def test_signing_in_renews_the_id_and_the_csrf_token_and_signing_out_forgets_it(
    browsers: Any, sessions: Sessions
) -> None:
    browser = browsers()
    before = browser.csrf()
    anonymous = browser.cookie
    assert browser.sign_in("not-a-token") == 401 and len(sessions) == 0
    assert browser.cookie != anonymous  # a refused sign-in leaves the old id behind too
    assert browser.sign_in(TOKENS["client"]) == 303
    signed_in = browser.cookie
    assert signed_in not in (None, anonymous) and TOKENS["client"] not in signed_in
    # The form's token from before signing in no longer passes.
    status, _, _ = browser.request("POST", "/logout", {"csrf": before}, Origin=browser.origin)
    assert status == 403 and browser.signed_in()
    status, headers, _ = browser.request(
        "POST", "/logout", {"csrf": browser.csrf("/runs")}, Origin=browser.origin
    )
    assert (status, headers["location"]) == (303, "/login")
    assert browser.cookie != signed_in and len(sessions) == 0
    assert not browser.signed_in()
    # The old id, presented again, is signed in no longer.
    browser.cookie = signed_in
    assert not browser.signed_in()


def test_sign_ins_with_one_token_push_out_only_that_tokens_sessions(
    browsers: Any, sessions: Sessions
) -> None:
    admin = browsers()
    assert admin.sign_in(TOKENS["admin"]) == 303
    clients = [browsers() for _ in range(3)]
    for client in clients:
        assert client.sign_in(TOKENS["client"]) == 303
    # max_per_token=2: the third client sign-in pushed out the first, never the admin.
    assert [c.signed_in() for c in clients] == [False, True, True]
    assert admin.signed_in() and len(sessions) == 3


def test_a_server_without_tokens_makes_sign_ins_keep_nothing(cyclone_server: Any) -> None:
    """Such a server takes any token, so none is worth keeping: a sign-in, whatever
    was typed, leaves the browser anonymous, as it was."""
    sessions = Sessions()
    console = ConsoleThread(cyclone_server.address, sessions=sessions)
    try:
        browser = Browser(console.url)
        assert browser.signed_in()  # no token needed to read runs
        for typed in ("", "anything", "x" * 500):
            assert browser.sign_in(typed) == 303
            assert browser.signed_in()
        assert len(sessions) == 0
    finally:
        console.stop()


def test_anonymous_sessions_are_made_per_request_and_kept_nowhere() -> None:
    sessions = Sessions()
    first = sessions.anonymous(None)
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", first.id) and first.token is None
    # The same cookie gives the same CSRF token; another cookie, another token.
    again = sessions.anonymous(first.id)
    assert (again.id, again.csrf) == (first.id, first.csrf)
    other = sessions.anonymous(None)
    assert other.id != first.id and not other.csrf_ok(first.csrf)
    # An id this console could not have made is replaced.
    assert sessions.anonymous("short").id != "short"
    assert sessions.anonymous("x" * 42 + "!").id != "x" * 42 + "!"
    # Another console process (a restart) derives other tokens from the same id.
    assert not Sessions().anonymous(first.id).csrf_ok(first.csrf)
    assert len(sessions) == 0 and sessions.find(first.id) is None


def test_signed_in_sessions_expire_unused_and_are_capped_per_token() -> None:
    sessions = Sessions(idle_s=3600, max_per_token=2)
    a1, a2 = sessions.sign_in("a"), sessions.sign_in("a")
    b1 = sessions.sign_in("b")
    assert sessions.find(a1.id) is a1  # a1 is now a's most recently used
    a3 = sessions.sign_in("a")
    assert sessions.find(a2.id) is None
    assert [sessions.find(s.id) for s in (a1, a3, b1)] == [a1, a3, b1]
    assert (a1.csrf, a1.id) != (a3.csrf, a3.id) and a1.csrf_ok(a1.csrf)
    # Unused past idle_s: found no more, and forgotten at the next sign-in.
    b1.last_seen -= 3601
    assert sessions.find(b1.id) is None and len(sessions) == 2
    a1.last_seen -= 3601
    sessions.sign_in("c")
    assert sessions.find(a1.id) is None and len(sessions) == 2
    # Signing out forgets a signed-in session and gives a new anonymous one.
    anonymous = sessions.sign_out(a3)
    assert sessions.find(a3.id) is None and anonymous.token is None and len(sessions) == 1
    assert isinstance(anonymous, Session) and sessions.find(anonymous.id) is None
