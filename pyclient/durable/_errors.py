"""The exceptions of durable functions: what a step call raises into the body, and
what stops the body where it stands."""

from __future__ import annotations

from typing import Any

from pyclient.errors import NonRetryableError, RetryAfter
from pyclient.models import StepCall


class StepFailed(Exception):
    """A step call raised. The body sees this exception for a step's failure, the same
    on every run: the first and each replay see it as rebuilt from the journal's record
    of the failure, so an ``except`` block takes the same path every time.

        try:
            charge(order)
        except StepFailed as e:
            if not isinstance(e.exception, CardDeclined):
                raise
            release(order, e.attributes["code"])   # a cleanup step: it runs once, durably

    ``exception`` (also ``__cause__``) is the exception the function raised, rebuilt
    from the record: its class (when the class is loaded in this process), ``args`` and
    JSON attributes, not the original object; None when it cannot be rebuilt.
    """

    def __init__(
        self,
        step_id: str,
        type_name: str,
        message: str,
        details: str = "",
        *,
        non_retryable: bool = False,
        type: str | None = None,
        attributes: dict[str, Any] | None = None,
        error_args: list[Any] | None = None,
        exception: Exception | None = None,
    ):
        super().__init__(f"{type_name}: {message}" if message else type_name)
        #: The step call that raised.
        self.step_id = step_id
        #: The qualified name of the exception's class, e.g. ``"CardDeclined"``;
        #: ``"EffectFailed"`` for a failure an operator recorded with Resolve.
        self.type_name = type_name
        #: Its importable name, module and qualified name (``"shop.errors.CardDeclined"``);
        #: ``type_name`` alone when the journal does not record the module.
        self.type = type or type_name
        self.message = message
        #: Its traceback, as recorded.
        self.details = details
        #: The exception's attributes whose values are JSON, as recorded.
        self.attributes: dict[str, Any] = dict(attributes or {})
        #: The exception's args, as recorded (its message alone when they are not JSON).
        self.error_args: list[Any] = list(error_args or [])
        #: The exception rebuilt from the record, or None.
        self.exception = exception
        self.__cause__ = exception
        #: Not worth retrying the node for if the body lets it through: the function
        #: raised NonRetryableError or returned a value that is not JSON, or the call is
        #: unsafe_to_repeat (its recorded failure is kept, so a retry would replay it).
        self.non_retryable = non_retryable

    def recorded(self) -> dict[str, Any]:
        """The fields read from the journal, to make another StepFailed of them."""
        return {
            "type": self.type,
            "attributes": self.attributes,
            "error_args": self.error_args,
            "exception": self.exception,
        }


class ReplayMismatch(NonRetryableError):
    """A replay called its steps in another order than the journal recorded them (the
    code changed under a running node, or the body depends on more than its input and
    its step results). The node fails for good."""


class DuplicateStepId(NonRetryableError):
    """Two step calls of one body have the same step id."""


class InvalidPatch(NonRetryableError, ValueError):
    """``patched()`` or ``deprecate_patch()`` was given an id that is not 1 to 190
    printable characters, or the same id twice in one attempt of the body. The node
    fails for good: every retry would find the same code."""


class BodyStopped(BaseException):
    """Stops a durable function where it stands: its node cannot go on in this attempt
    (the lease was lost, the run was cancelled, an effect is uncertain). A
    BaseException, so that ``except Exception`` in the body does not swallow it; every
    later step call raises it again, and the worker reports no outcome for the node."""


class EffectUncertain(BodyStopped):
    """An unsafe step call was started by an earlier attempt and never recorded an
    outcome: its effect may have happened. The node is uncertain and its run blocked
    until an operator resolves the call (result, error or discard)."""

    def __init__(self, call: StepCall):
        super().__init__(
            f"step call {call.step_id!r} ({call.function}) is unsafe to repeat and was "
            f"started by attempt {call.attempt} with no outcome recorded: its effect may "
            "have happened; the run is blocked until it is resolved"
        )
        self.call = call


class Suspended(BodyStopped):
    """The body waits (a durable sleep, an event, a child run) and its node has given
    up its lease: the attempt ends here, with no outcome, and the node is claimed again
    when the wait is over (its body replays up to the same wait, which then returns)."""

    def __init__(self, call: StepCall):
        super().__init__(
            f"waiting for {call.waiting_for or call.function} ({call.step_id!r}); the node "
            "resumes when the wait is over"
        )
        self.call = call


class EventTimeout(StepFailed):
    """``wait_for_event`` found no event within its timeout. Recorded in the journal, so
    every replay raises it again (a StepFailed whose ``type_name`` is ``EventTimeout``)."""


class StepTimeout(StepFailed):
    """A try of a step with ``@step(timeout=...)`` did not finish in time. Recorded in
    the journal, so every replay raises it again (a StepFailed whose ``type_name`` is
    ``StepTimeout``); retried like any failure when the step has ``retries``. For an
    ``unsafe_to_repeat`` step the body does not see it: the effect is uncertain and
    the run blocks."""


class EffectTimedOut(RetryAfter):
    """An ``unsafe_to_repeat`` step call did not finish within its ``timeout``: its
    effect may have happened. Nothing is recorded (its entry stays ``started``) and
    the attempt fails with this, whatever the body does, to be retried at once; the
    next attempt finds the call started with no outcome and blocks the run
    (EffectUncertain) until an operator resolves it."""

    def __init__(self, message: str):
        super().__init__(0, message)
