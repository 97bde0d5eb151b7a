"""What a node's state means to a person, shared by ``cyclone run show`` and the
console: the state shown (``waiting`` while the node waits with no worker), its tries
of the retry policy apart from resumes and lost workers, what each error type means,
and when "effect uncertain" is worth saying.

The counters, from a step's columns: ``attempt`` counts every claim; a durable body
that gives up its lease to wait adds 1 to ``resumes`` at once (so that the claim that
resumes it uses up no attempt); a lost worker adds 1 to ``recoveries``. The retry policy
compares ``attempt - resumes - recoveries`` with ``max_attempts``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyclient._runs import Step, StepError

#: Steps that no longer run (a waiting journal entry of one never resumes).
_OVER = {"completed", "discarded", "skipped", "cancelled", "uncertain"}

#: What an error type means, for the types the server and the SDKs record themselves.
ERROR_MEANINGS = {
    "WorkerLost": "its worker stopped answering (it died, froze or lost the network) "
    "before the step's time limit; a lost worker uses up no try",
    "LeaseExpired": "the step's time limit (its timeout) was reached with no outcome",
    "HandlerTimeout": "the handler ran past the step's time limit and was stopped",
    "OutputTooLarge": "the handler's output was larger than the server accepts",
    "OutputNotJson": "the handler's output could not be encoded as JSON",
    "StepResultTooLarge": "a step call's result was larger than the server accepts",
    "StepTimeout": "a step call ran past its own time limit",
    "EventTimeout": "no event came before the wait's deadline",
    "ChildCancelled": "the child run it waited for was cancelled",
    "ArgumentsNotJson": "a step call's arguments could not be recorded as JSON",
    "Reset": "an operator retried the node",
}


def suspended(step: Step) -> bool:
    """Whether the node gave up its lease to wait and has not been claimed again since:
    its journal has a waiting entry and it is not running."""
    open_wait = ("waiting", "cancelled")  # a cancelled run's wait never ended
    return str(step.status) != "running" and any(str(c.status) in open_wait for c in step.journal)


def resumed(step: Step) -> int:
    """Claims that resumed the node after a wait (``resumes`` counts a wait when it
    begins, before any resume)."""
    return max(0, step.resumes - (1 if suspended(step) else 0))


def tries(step: Step) -> int:
    """Tries of the retry policy so far: claims, less those that resumed a wait and
    those whose worker was lost (a try paused by a wait is one try)."""
    if step.attempt == 0:
        return 0
    return max(1, step.attempt - resumed(step) - step.recoveries)


def tries_left(step: Step) -> int:
    """Tries the retry policy has left after this one."""
    return max(0, step.max_attempts - tries(step))


def shown_status(step: Step) -> str:
    """The status to show: ``waiting`` while the node waits with no worker holding it
    (Step.waiting), else its stored status."""
    if step.waiting and str(step.status) in ("available", "pending"):
        return "waiting"
    return str(step.status)


def error_meaning(error: StepError) -> str:
    """What the error means in plain words ("" for a handler's own error type)."""
    if error.kind == "reset":
        return ERROR_MEANINGS["Reset"]
    return ERROR_MEANINGS.get(error.type, "")


def why_not_retried(step: Step, error: StepError) -> str:
    """Why ``error`` was not retried ("" when it was): the retry policy's tries were
    used up, the error was not retryable, or (the last error of an uncertain node) its
    effect may have happened, so the next claim blocked the run instead."""
    if error.kind == "reset":
        return ""
    counted = [e for e in step.errors if e.kind != "reset"]
    last = bool(counted) and counted[-1] is error
    if error.retryable:
        uncertain = last and str(step.status) == "uncertain"
        return "not retried: its effect is uncertain" if uncertain else ""
    if last and step.max_attempts and tries(step) >= step.max_attempts:
        return f"retries exhausted: {tries(step)} of {step.max_attempts} tries"
    return "not retryable"


def uncertain_matters(step: Step, run_status: str) -> bool:
    """Whether to say "effect uncertain": only when an earlier attempt lost its lease
    and that can matter: the action is unsafe to repeat, the journal has an unsafe step
    call, or the run is blocked."""
    if not step.effect_uncertain:
        return False
    return step.unsafe or run_status == "blocked" or any(c.unsafe_to_repeat for c in step.journal)


def journal_status(call_status: str, run_status: str) -> str:
    """A journal entry's status to show: a wait of a cancelled run never ends (GetRun
    says so itself; an older server says waiting)."""
    if call_status in ("waiting", "cancelled") and run_status == "cancelled":
        return "cancelled"
    return call_status


def counts(step: Step) -> Sequence[str]:
    """Resumes and lost workers, as words (none when there are none)."""
    said = []
    if resumed(step):
        said.append(f"{resumed(step)} resumed")
    if step.recoveries:
        budget = f" of {step.max_recoveries}" if step.max_recoveries else ""
        said.append(f"{step.recoveries}{budget} worker lost")
    return said
