"""What a replay says when the journal and the body disagree (ReplayMismatch), and the
names patch markers are recorded under."""

from __future__ import annotations

from pyclient.durable._calls import Call
from pyclient.durable._errors import ReplayMismatch
from pyclient.models import StepCall

#: The function a patch marker is recorded under, and the prefix of its step id.
PATCH_FUNCTION = "cyclone.patch"
PATCH_PREFIX = "patch:"
#: Longest patch id (the marker's step id, "patch:" and the id, fits MAX_ID).
MAX_PATCH_ID = 190


#: Where a ReplayMismatch points for the ways to change a body under runs in flight.
CHANGING_CODE = "docs/durable-functions.md#changing-code-safely"


def named(entry: StepCall) -> str:
    """A recorded entry as a ReplayMismatch names it."""
    if entry.function == PATCH_FUNCTION and entry.step_id.startswith(PATCH_PREFIX):
        return f"patch {entry.step_id.removeprefix(PATCH_PREFIX)!r} (a patched() marker)"
    return f"step {entry.step_id!r} of {entry.function}"


def now_making(call: Call) -> str:
    return f"this replay makes step {call.step_id!r} of {call.function}"


def mismatch(problem: str, recorded: StepCall | None) -> ReplayMismatch:
    """The ReplayMismatch for ``problem`` (which names the recorded call and the call
    made now), with the ways to change code under runs in flight."""
    hint = (
        "Guard the changed calls with patched(ID) so that runs recorded before the change "
        "keep their path (then deprecate_patch(ID) once none of them is in flight), or pin "
        "the runs in flight to the build that started them"
    )
    if recorded is not None and recorded.function == PATCH_FUNCTION:
        patch_id = recorded.step_id.removeprefix(PATCH_PREFIX)
        hint = (
            f"The run recorded patched({patch_id!r}) here: keep patched({patch_id!r}) or "
            f"deprecate_patch({patch_id!r}) at this point until no run in flight recorded it"
        )
    return ReplayMismatch(
        f"the durable function does not replay its journal: {problem}. The code changed "
        "under a run in flight, or the body depends on more than its input and its step "
        f"results. {hint}; a renamed step keeps its name with @step(name=...). See "
        f"'Changing code safely' in {CHANGING_CODE}"
    )


def arguments_changed(call: Call, entry: StepCall) -> str:
    """What differs when a recorded call's arguments digest is not today's."""
    return (
        f"step {call.step_id!r} of {entry.function} (call #{call.seq}) was recorded "
        "with other arguments than this replay calls it with"
    )


def args_mismatch(what: str) -> ReplayMismatch:
    """The ReplayMismatch of a call whose arguments changed (``what``)."""
    return ReplayMismatch(
        f"the durable function does not replay its journal: {what}, so its recorded "
        "outcome may not be what these arguments would give. The code or the input "
        "changed under a run in flight. Keep the arguments of the calls of runs in flight, "
        "branch new code with patched(), or accept the recorded outcome with "
        f"@step(on_args_change='allow'): see 'Changing code safely' ({CHANGING_CODE})"
    )
