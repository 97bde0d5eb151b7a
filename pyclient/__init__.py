"""Cyclone's Python SDK: submit workflows, run workers, steer runs.

    from pyclient import Client, Workflow, Worker
    from pyclient import step               # durable functions (pyclient.durable)

The generated protobuf stubs import as ``cyclone.v1.*_pb2``. What the SDK shares with
the server (the stubs, workflow validation, JSON conversion, error codes) is the
package ``cyclone``; pyclient.dag re-exports its workflow validation.
"""

from pyclient.actions import Action, InputMismatch, RateLimit
from pyclient.client import AsyncClient, Client
from pyclient.context import Context, current
from pyclient.durable import (
    BodyStopped,
    DuplicateStepId,
    EffectUncertain,
    ReplayMismatch,
    StepFailed,
    StepFunction,
    step,
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
    ExplainReason,
    Explanation,
    NodeState,
    Retried,
    Run,
    RunError,
    RunPage,
    RunStatus,
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
    "Client",
    "Concurrency",
    "Context",
    "CycloneError",
    "DeadlineExceeded",
    "DuplicateStepId",
    "EffectUncertain",
    "ExplainReason",
    "Explanation",
    "FailedPrecondition",
    "HandlerTimeout",
    "InputMismatch",
    "InvalidArgument",
    "LeaseLost",
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
    "Step",
    "StepCall",
    "StepCallError",
    "StepCallStatus",
    "StepError",
    "StepFailed",
    "StepFunction",
    "StepStatus",
    "Submitted",
    "Unauthenticated",
    "Unavailable",
    "UpstreamFailure",
    "WaitTimeout",
    "Worker",
    "Workflow",
    "current",
    "step",
]
