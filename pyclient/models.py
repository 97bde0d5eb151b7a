"""What the client returns: runs and steps as small frozen values.

Statuses are string enums (``run.status == "completed"`` holds), payloads are plain
Python values, times are aware datetimes in UTC. ``to_dict()`` gives the JSON form the
CLI prints with ``--json``. Runs and steps are defined in ``_runs``, the answers of
the schedule, explain, count and worker calls in ``_answers``; import them from here.
"""

from pyclient._answers import (
    ActionActivity,
    EventSent,
    ExplainReason,
    Explanation,
    NodeState,
    RunCount,
    RunStep,
    Schedule,
    SchedulePage,
    StepPage,
    Workers,
    WorkerSummary,
)
from pyclient._runs import (
    CHILD_START_FUNCTION,
    AuditEntry,
    LogLine,
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
    time_field,
    timestamp_datetime,
    trigger_rule_name,
    value_field,
)

__all__ = [
    "CHILD_START_FUNCTION",
    "ActionActivity",
    "AuditEntry",
    "EventSent",
    "ExplainReason",
    "Explanation",
    "LogLine",
    "NodeState",
    "Retried",
    "Run",
    "RunCount",
    "RunError",
    "RunPage",
    "RunStatus",
    "RunStep",
    "Schedule",
    "SchedulePage",
    "Step",
    "StepCall",
    "StepCallError",
    "StepCallStatus",
    "StepError",
    "StepPage",
    "StepStatus",
    "Submitted",
    "UpstreamFailure",
    "WorkerSummary",
    "Workers",
    "time_field",
    "timestamp_datetime",
    "trigger_rule_name",
    "value_field",
]
