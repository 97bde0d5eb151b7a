"""Browser sessions of the console.

The cookie holds only a random id (256 bits). Until a person signs in, the console
keeps nothing for their browser: the CSRF token of its forms is derived from the
cookie's id with a key made when the console starts (HMAC-SHA256), so a form posted
without that cookie, or with another's token, is refused, and any number of anonymous
requests costs no memory and pushes nobody out.

Signing in with a token the server accepts makes a session kept here, under a new id,
holding the token (never in a cookie or a URL) and a random CSRF token. It is forgotten
when its person signs out, after 12 hours without use, when the console restarts, or
when more than ``max_per_token`` browsers are signed in with the same token: then the
least recently used of that token's sessions goes. A token's holder can so push out
only sessions of the same token, and the sessions kept are bounded by the tokens the
server accepts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

COOKIE = "cyclone_console"
#: A signed-in session unused this long is forgotten.
IDLE_S = 12 * 3600.0
#: Most signed-in sessions of one token; the least recently used goes first.
MAX_PER_TOKEN = 1000
#: An id as _new_id makes it: 32 random bytes, URL-safe base64 without padding.
_ID = re.compile(r"[A-Za-z0-9_-]{43}")


def _new_id() -> str:
    return secrets.token_urlsafe(32)


@dataclass
class Session:
    id: str
    csrf: str = field(default_factory=_new_id)
    #: The bearer token given at sign-in; None when the browser has not signed in.
    token: str | None = None
    last_seen: float = field(default_factory=time.monotonic)

    def csrf_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented, self.csrf)


class Sessions:
    """The signed-in sessions, and the anonymous ones' CSRF tokens (kept nowhere)."""

    def __init__(self, idle_s: float = IDLE_S, max_per_token: int = MAX_PER_TOKEN):
        self.idle_s = idle_s
        self.max_per_token = max_per_token
        self._key = secrets.token_bytes(32)
        # Least recently used first, over all tokens (for the idle limit) ...
        self._by_id: OrderedDict[str, Session] = OrderedDict()
        # ... and per token (for max_per_token).
        self._by_token: dict[str, OrderedDict[str, None]] = {}

    def __len__(self) -> int:
        """How many signed-in sessions are kept."""
        return len(self._by_id)

    def find(self, session_id: str | None) -> Session | None:
        """The signed-in session with this id, marked as used now; None for any other
        id (an anonymous one, an expired one, one never made here)."""
        if not session_id:
            return None
        found = self._by_id.get(session_id)
        if found is None:
            return None
        now = time.monotonic()
        if now - found.last_seen > self.idle_s:
            self._forget(found)
            return None
        found.last_seen = now
        self._by_id.move_to_end(session_id)
        assert found.token is not None
        self._by_token[found.token].move_to_end(session_id)
        return found

    def anonymous(self, session_id: str | None = None) -> Session:
        """The session of a browser that has not signed in, made afresh for each request:
        the id its cookie holds when it is one this console could have made, else a new
        one; its CSRF token derived from the id."""
        if session_id is None or _ID.fullmatch(session_id) is None:
            session_id = _new_id()
        digest = hmac.new(self._key, b"csrf:" + session_id.encode(), hashlib.sha256).digest()
        return Session(session_id, csrf=base64.urlsafe_b64encode(digest).decode().rstrip("="))

    def sign_in(self, token: str) -> Session:
        """A new signed-in session for a token the server accepted."""
        self._expire()
        same = self._by_token.setdefault(token, OrderedDict())
        while len(same) >= self.max_per_token:
            oldest = next(iter(same))
            self._forget(self._by_id[oldest])
        made = Session(_new_id(), token=token)
        self._by_id[made.id] = made
        same[made.id] = None
        return made

    def sign_out(self, session: Session) -> Session:
        """Forget ``session`` (when it is a signed-in one); a new anonymous one, under a
        new id, for the browser."""
        if self._by_id.get(session.id) is session:
            self._forget(session)
        return self.anonymous()

    def _forget(self, session: Session) -> None:
        del self._by_id[session.id]
        assert session.token is not None
        same = self._by_token[session.token]
        del same[session.id]
        if not same:
            del self._by_token[session.token]

    def _expire(self) -> None:
        """Forget the sessions unused for longer than idle_s (the oldest come first)."""
        now = time.monotonic()
        while self._by_id:
            oldest = next(iter(self._by_id.values()))
            if now - oldest.last_seen <= self.idle_s:
                return
            self._forget(oldest)
