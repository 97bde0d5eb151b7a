"""Cyclone's Python SDK: submit workflows, run workers, steer runs.

    from pyclient import Client, Workflow, Worker
    from pyclient import step               # durable functions (pyclient.durable)
    from pyclient import start_child        # child runs, from a durable function
    from pyclient import sleep, wait_for_event   # waits in durable functions

The generated protobuf stubs import as ``cyclone.v1.*_pb2``. What the SDK shares with
the server (the stubs, workflow validation, JSON conversion, error codes) is the
package ``cyclone``; pyclient.dag re-exports its workflow validation.
"""

# First: refuses an environment that holds PyPI's other "cyclone" (see there).
import cyclone.distribution  # noqa: F401
from pyclient.actions import Action, InputMismatch, RateLimit
from pyclient.client import AsyncClient, Client
from pyclient.context import Context, current
from pyclient.durable import (
    BodyStopped,
    ChildFailed,
    ChildRun,
    DuplicateStepId,
    EffectUncertain,
    EventTimeout,
    ReplayMismatch,
    StepFailed,
    StepFunction,
    Suspended,
    sleep,
    sleep_until,
    start_child,
    step,
    wait_for_event,
)
from pyclient.errors import (
    CycloneError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    LeaseLost,
    NonRetryableError,
    NotFound,
    OutsideHandler,
    PermissionDenied,
    RetryAfter,
    Unauthenticated,
    Unavailable,
    WaitTimeout,
)
from pyclient.models import (
    ActionActivity,
    AuditEntry,
    EventSent,
    ExplainReason,
    Explanation,
    LogLine,
    NodeState,
    Retried,
    Run,
    RunError,
    RunPage,
    RunStatus,
    Schedule,
    SchedulePage,
    Step,
    StepCall,
    StepCallError,
    StepCallStatus,
    StepError,
    StepStatus,
    Submitted,
    UpstreamFailure,
)
from pyclient.worker import HandlerTimeout, Worker
from pyclient.workflow import Concurrency, Node, RetryPolicy, Workflow

__all__ = [
    "Action",
    "ActionActivity",
    "AsyncClient",
    "AuditEntry",
    "BodyStopped",
    "ChildFailed",
    "ChildRun",
    "Client",
    "Concurrency",
    "Context",
    "CycloneError",
    "DeadlineExceeded",
    "DuplicateStepId",
    "EffectUncertain",
    "EventSent",
    "EventTimeout",
    "ExplainReason",
    "Explanation",
    "FailedPrecondition",
    "HandlerTimeout",
    "InputMismatch",
    "InvalidArgument",
    "LeaseLost",
    "LogLine",
    "Node",
    "NodeState",
    "NonRetryableError",
    "NotFound",
    "OutsideHandler",
    "PermissionDenied",
    "RateLimit",
    "ReplayMismatch",
    "Retried",
    "RetryAfter",
    "RetryPolicy",
    "Run",
    "RunError",
    "RunPage",
    "RunStatus",
    "Schedule",
    "SchedulePage",
    "Step",
    "StepCall",
    "StepCallError",
    "StepCallStatus",
    "StepError",
    "StepFailed",
    "StepFunction",
    "StepStatus",
    "Submitted",
    "Suspended",
    "Unauthenticated",
    "Unavailable",
    "UpstreamFailure",
    "WaitTimeout",
    "Worker",
    "Workflow",
    "current",
    "sleep",
    "sleep_until",
    "start_child",
    "step",
    "wait_for_event",
]
