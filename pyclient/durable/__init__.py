"""Durable functions: node handlers whose bodies call steps, journaled and replayed.

    from pyclient import Worker, step

    @step
    def reserve(order_id): ...

    @step(unsafe_to_repeat=True)
    def charge(order_id, amount): ...

    @worker.workflow("checkout")
    def checkout(ctx, order: dict):
        reserve(order["id"])
        return charge(order["id"], order["amount"])

Each attempt of the node runs the body from the top; a step call whose outcome is in
the node's journal returns it (or raises :class:`StepFailed` again) without running.
See docs/python-sdk.md and docs/durable-functions.md. The pieces:

- ``_step``: the :func:`step` decorator and :class:`StepFunction`;
- ``_replay``: the replay engine (:class:`Replay`), one for the worker and for
  pyclient.testing;
- ``_calls``: how a step call is named to the journal, and the journal backend
  protocol; ``_errors``: the exceptions a body sees;
- ``_patch``: patch markers (:func:`patched`, :func:`deprecate_patch`);
- ``_memory``: the in-memory journal pyclient.testing runs bodies on. The worker's
  backend (Begin and End over gRPC) is pyclient.worker._journal.
"""

from pyclient.durable._child import ChildFailed, ChildRun, start_child
from pyclient.durable._digest import ArgumentsNotJson
from pyclient.durable._errors import (
    BodyStopped,
    DuplicateStepId,
    EffectTimedOut,
    EffectUncertain,
    EventTimeout,
    InvalidPatch,
    ReplayMismatch,
    StepFailed,
    StepTimeout,
    Suspended,
)
from pyclient.durable._patch import deprecate_patch, patched
from pyclient.durable._step import StepFunction, step
from pyclient.durable._wait import Approval, sleep, sleep_until, wait_for_approval, wait_for_event

__all__ = [
    "Approval",
    "ArgumentsNotJson",
    "BodyStopped",
    "ChildFailed",
    "ChildRun",
    "DuplicateStepId",
    "EffectTimedOut",
    "EffectUncertain",
    "EventTimeout",
    "InvalidPatch",
    "ReplayMismatch",
    "StepFailed",
    "StepFunction",
    "StepTimeout",
    "Suspended",
    "deprecate_patch",
    "patched",
    "sleep",
    "sleep_until",
    "start_child",
    "step",
    "wait_for_approval",
    "wait_for_event",
]
