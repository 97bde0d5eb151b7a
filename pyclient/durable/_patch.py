"""Patch markers: :func:`patched` and :func:`deprecate_patch`, to change a durable
function's step calls while runs recorded by the old code are still in flight.

A marker is a journal entry like a safe step call's: step id ``patch:<id>``, function
``cyclone.patch``, output ``true``. Where the body checks a patch, the replay looks at
the journal's next position (seq):

- the marker is there: the run went through this point on the new code (True, and
  the marker's seq is consumed);
- another entry is there, or there is none but a later one exists: the run went past
  this point on the old code (False; no seq is consumed, so the old calls after it
  keep their positions);
- the journal has nothing from there on: the run is new here; the marker is recorded
  and the body takes the new branch (True).

The later-entry rule covers a run whose old calls at this position were started
together (``asyncio.gather``) and whose later one was recorded first: that run went
through this point on the old code, so it keeps the old branch.
"""

from __future__ import annotations

from pyclient.context import active
from pyclient.durable._replay import Replay, replay_of
from pyclient.errors import OutsideHandler


def _replay(what: str) -> Replay:
    replay = replay_of(active())
    if replay is None:
        raise OutsideHandler(f"{what}() is called in the body of a durable function only")
    return replay


def patched(patch_id: str) -> bool:
    """Whether this run takes the new code of the patch ``patch_id`` at this point of
    the body: True for a run that reaches it on code with the patch (the first time,
    the patch's marker is recorded in the journal), False for a run that went past it
    on older code. The same answer on every replay of a run.

        @worker.workflow("order")
        def order(ctx, order):
            reserve(order["id"])
            if patched("fraud-check"):       # added while orders were in flight
                check_fraud(order["id"])
            return charge(order["id"], order["amount"])

    A patch id is 1 to 190 printable characters, checked once per attempt of the body
    (InvalidPatch otherwise; the node fails for good). A bool in sync and async bodies
    alike. Once no run in flight went past the point on the old code, delete the old
    branch and call :func:`deprecate_patch` there instead; once no run in flight
    recorded the marker, delete that call too (docs/durable-functions.md, "Patches")."""
    return _replay("patched").patch(patch_id)


def deprecate_patch(patch_id: str) -> None:
    """The place of a patch whose old branch is deleted: a run that recorded the
    marker of ``patch_id`` here replays it (its seq is consumed); any other run
    records nothing. So runs from before and after the deprecation replay alike;
    delete the call once no run in flight recorded the marker."""
    _replay("deprecate_patch").patch(patch_id, deprecated=True)
