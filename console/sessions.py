"""Browser sessions, kept in the console's memory.

The cookie holds only a random session id (256 bits). The token a person signs in with
stays here, never in a cookie or a URL; so does the session's CSRF token, which every
form posts back. A restart of the console signs everybody out.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field

COOKIE = "cyclone_console"
#: A session unused this long is forgotten.
IDLE_S = 12 * 3600.0
#: Most sessions kept; the least recently used goes first.
MAX_SESSIONS = 10_000


@dataclass
class Session:
    id: str
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    #: The bearer token given at sign-in; None when the server needs none.
    token: str | None = None
    last_seen: float = field(default_factory=time.monotonic)

    def csrf_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented, self.csrf)


class Sessions:
    def __init__(self, idle_s: float = IDLE_S, max_sessions: int = MAX_SESSIONS):
        self._by_id: OrderedDict[str, Session] = OrderedDict()
        self.idle_s = idle_s
        self.max_sessions = max_sessions

    def find(self, session_id: str | None) -> Session | None:
        """The live session with this id, marked as used now."""
        if not session_id:
            return None
        found = self._by_id.get(session_id)
        now = time.monotonic()
        if found is None or now - found.last_seen > self.idle_s:
            self._by_id.pop(session_id, None)
            return None
        found.last_seen = now
        self._by_id.move_to_end(session_id)
        return found

    def create(self) -> Session:
        while len(self._by_id) >= self.max_sessions:
            self._by_id.popitem(last=False)
        made = Session(secrets.token_urlsafe(32))
        self._by_id[made.id] = made
        return made

    def renew(self, old: Session) -> Session:
        """A new id for a session whose privileges change (sign-in, sign-out)."""
        self._by_id.pop(old.id, None)
        return self.create()
