"""The worker's one retry policy for calls to a server that is unavailable: claims
and CompleteMany back off the same way while the channel reconnects. Claims retry
until the worker stops; a CompleteMany for up to one lease (its steps' leases have
lapsed by then, so the outcomes would be refused), then its outcomes are logged as
not delivered.

Change retry here. (A handler's own failures are retried by the server, under the
node's RetryPolicy; heartbeats are not retried, the next one is due a third of a
lease later: see :mod:`._watch`.)
"""

from __future__ import annotations

import math
import random

#: First delay after a failed call, in seconds; each further failure doubles it.
FIRST_DELAY = 0.1


class Backoff:
    """Exponential backoff from FIRST_DELAY, doubling up to ``max_delay``.

    ``jitter`` spreads the waits of many workers (claims) over half the delay;
    ``window`` is how long, in seconds from the first try, a call is retried.
    """

    __slots__ = ("delay", "jitter", "max_delay", "window")

    def __init__(self, max_delay: float, *, jitter: bool = False, window: float = math.inf):
        self.max_delay = max_delay
        self.jitter = jitter
        self.window = window
        #: The last delay handed out; 0 while the calls succeed.
        self.delay = 0.0

    @property
    def retrying(self) -> bool:
        """A call failed since the last :meth:`reset`."""
        return self.delay > 0.0

    def next(self) -> float:
        """The delay to the next try, after one more failure."""
        self.delay = min(max(self.delay * 2, FIRST_DELAY), self.max_delay)
        return self.delay * random.uniform(0.5, 1.0) if self.jitter else self.delay

    def reset(self) -> None:
        self.delay = 0.0
