"""Per-step policies: ``@step(retries=N, backoff=..., timeout=..., retry_on=...)``.

Retries happen inside the body, each try a call of the journal: the tries of the call
``charge`` are ``charge``, ``charge~2``, ``charge~3``, ... and the wait before try
``k`` is a durable sleep ``charge~k:backoff``. A replay therefore meets the same
failed tries and the same sleeps, recorded, and goes on from where the last attempt
stopped: a crash during a backoff resumes the wait, and the count of tries goes on.

Whether a failure is retried is decided from its record (the StepFailed a replay
raises again), so the first run and every replay decide alike.

``timeout=`` seconds: a sync function runs on a helper thread, which is abandoned
when the time is up (it may go on running: Python cannot stop a thread); an async one
is cancelled. The try fails with :class:`StepTimeout`. For an ``unsafe_to_repeat``
step the effect is then uncertain: the replay engine stops the body and the run
blocks, as for any unsafe call that started with no outcome.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import datetime as dt
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pyclient.context import Context, active
from pyclient.durable._calls import MAX_ID, Call, StepSpec, Until, WaitFn
from pyclient.durable._errors import StepFailed, StepTimeout
from pyclient.durable._replay import Replay
from pyclient.errors import InvalidArgument, NonRetryableError
from pyclient.models import StepCall

#: The wait before a retry, journaled as a sleep.
_BACKOFF = WaitFn("backoff", "cyclone.sleep")
#: The most retries a step may ask for.
MAX_RETRIES = 100
#: The longest backoff between two tries, and the longest timeout (one day).
MAX_SECONDS = 86400.0
#: Failures the SDK itself marks as not worth another try.
_NOT_RETRIED = frozenset({"StepResultTooLarge", "ArgumentsNotJson"})

Backoff = float | Callable[[int], float]


@dataclass(frozen=True, slots=True)
class StepPolicy:
    """What a step does when it fails or takes too long. ``retries`` more tries after
    the first; ``backoff`` the seconds to wait before try ``k + 1`` (a number: that many
    before the second try, doubling each time, at most a day; a function of ``k``, the
    number of the try that failed); ``timeout`` the seconds a try may take (None: no
    limit); ``retry_on`` the exception classes retried."""

    retries: int = 0
    backoff: Backoff = 1.0
    timeout: float | None = None
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    @classmethod
    def of(
        cls,
        retries: int,
        backoff: Backoff,
        timeout: float | None,
        retry_on: type[BaseException] | tuple[type[BaseException], ...],
    ) -> StepPolicy:
        """A checked policy (InvalidArgument or TypeError naming what is wrong)."""
        if isinstance(retries, bool) or not isinstance(retries, int):
            raise TypeError(f"retries must be an int, got {retries!r}")
        if not 0 <= retries <= MAX_RETRIES:
            raise InvalidArgument(f"retries must be 0 to {MAX_RETRIES}, got {retries}")
        if not callable(backoff):
            _seconds(backoff, "backoff", allow_zero=True)
        if timeout is not None:
            _seconds(timeout, "timeout", allow_zero=False)
        classes = retry_on if isinstance(retry_on, tuple) else (retry_on,)
        if not classes or not all(
            isinstance(c, type) and issubclass(c, BaseException) for c in classes
        ):
            raise TypeError(f"retry_on must be an exception class or a tuple of them: {retry_on!r}")
        return cls(retries, backoff, timeout, classes)

    @property
    def active(self) -> bool:
        return self.retries > 0 or self.timeout is not None

    def delay(self, failed_try: int) -> float:
        """Seconds to wait after try ``failed_try`` (1 for the first) failed."""
        if callable(self.backoff):
            return _seconds(self.backoff(failed_try), "backoff()", allow_zero=True)
        return min(float(self.backoff) * 2.0 ** (failed_try - 1), MAX_SECONDS)

    def retries_on(self, failed: StepFailed) -> bool:
        """Whether the recorded failure ``failed`` is worth another try."""
        if failed.type_name in _NOT_RETRIED:
            return False
        exc = failed.exception
        if exc is None:  # its class is not loaded here: by name, or any by default
            if self.retry_on == (Exception,):
                return True
            return failed.type_name in {c.__qualname__ for c in self.retry_on}
        return isinstance(exc, self.retry_on) and not isinstance(exc, NonRetryableError)


def _seconds(value: Any, what: str, *, allow_zero: bool) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero) or value > MAX_SECONDS:
        least = "0" if allow_zero else "more than 0"
        raise InvalidArgument(f"{what} must be {least} to {MAX_SECONDS:.0f} seconds, got {value!r}")
    return float(value)


def try_id(base: str, k: int) -> str:
    """The step id of try ``k`` of the call ``base``."""
    return base if k == 1 else f"{base}~{k}"


def backoff_id(base: str, k: int) -> str:
    """The step id of the durable sleep before try ``k`` of the call ``base``."""
    return f"{base}~{k}:backoff"


def check_room(base: str, policy: StepPolicy) -> None:
    """InvalidArgument when the ids of the tries of ``base`` would be too long."""
    if len(backoff_id(base, policy.retries + 1)) > MAX_ID:
        raise InvalidArgument(
            f"step id {base[:40]!r}... is too long for {policy.retries} retries: the ids of "
            f"its tries and backoffs ({backoff_id('', policy.retries + 1)!r} appended) must "
            f"be at most {MAX_ID} characters"
        )


def backoff_until(seconds: float) -> Until:
    return Until(wake_at=dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds))


# -- timeouts


def timed(fn: Callable[..., Any], timeout: float) -> Callable[..., Any]:
    """``fn`` run on a helper thread (with the caller's context), given up on after
    ``timeout`` seconds with StepTimeout; the thread is left to finish on its own."""

    def run(*args: Any, **kwargs: Any) -> Any:
        context = contextvars.copy_context()
        outcome: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def target() -> None:
            try:
                outcome.set_result(context.run(fn, *args, **kwargs))
            except BaseException as exc:  # handed to the caller
                outcome.set_exception(exc)

        name = f"step {_step_id()}"
        threading.Thread(target=target, name=name, daemon=True).start()
        try:
            return outcome.result(timeout)
        except concurrent.futures.TimeoutError:
            raise _timeout(timeout) from None

    return run


def timed_async(fn: Callable[..., Any], timeout: float) -> Callable[..., Any]:
    """``fn`` (a coroutine function) cancelled after ``timeout`` seconds, StepTimeout."""

    async def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.wait_for(fn(*args, **kwargs), timeout)
        except TimeoutError:
            raise _timeout(timeout) from None

    return run


def _step_id() -> str:
    ctx = active()
    return (ctx.step_id if ctx is not None else None) or "?"


def _timeout(seconds: float) -> StepTimeout:
    """The StepTimeout a try raises; its text is the message alone, as recorded."""
    step_id = _step_id()
    message = f"step {step_id!r} did not finish within {seconds:g}s"
    timeout = StepTimeout(step_id, "StepTimeout", message)
    timeout.args = (message,)
    return timeout


# -- the tries of one call


class PolicyStep(StepSpec, Protocol):
    """A step function with its policy."""

    @property
    def policy(self) -> StepPolicy: ...


def call_with_policy(
    replay: Replay,
    ctx: Context,
    step: PolicyStep,
    step_id: str | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    digest: str,
) -> Any:
    """A sync step call under its policy: its tries and the durable sleeps between
    them, each journaled."""
    policy = step.policy
    base = step_id or replay.name_call(step)
    check_room(base, policy)
    for k in range(1, policy.retries + 2):
        try:
            return replay.call(ctx, step, try_id(base, k), args, kwargs, digest=digest)
        except StepFailed as failed:
            if k > policy.retries or not policy.retries_on(failed):
                raise
        delay = policy.delay(k)
        if delay > 0:
            call, entry = replay.open(_BACKOFF, backoff_id(base, k + 1))
            replay.wait(call, entry, backoff_until(delay))
    raise AssertionError("unreachable")  # pragma: no cover


async def call_with_policy_async(
    replay: Replay,
    ctx: Context,
    step: PolicyStep,
    first: tuple[Call, StepCall | None],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    digest: str,
) -> Any:
    """An async step call under its policy. Its first try was numbered when the call
    was made; the later ones (and the sleeps) are numbered as they come."""
    policy = step.policy
    call, entry = first
    base = call.step_id
    for k in range(1, policy.retries + 2):
        if k > 1:
            call, entry = replay.open(step, try_id(base, k), digest)
        try:
            return await replay.call_async(ctx, step, call, entry, args, kwargs)
        except StepFailed as failed:
            if k > policy.retries or not policy.retries_on(failed):
                raise
        delay = policy.delay(k)
        if delay > 0:
            wait, recorded = replay.open(_BACKOFF, backoff_id(base, k + 1))
            await replay.wait_async(wait, recorded, backoff_until(delay))
    raise AssertionError("unreachable")  # pragma: no cover
