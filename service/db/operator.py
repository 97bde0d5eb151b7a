"""Operator actions: cancel a run, retry or resolve steps, resolve a blocked
step call, pause and resume runs, workflows and actions, change a run's tags."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, NamedTuple

from service.db.pool import Repository
from service.db.records import Ready


class Cancelled(NamedTuple):
    """run_cancel"""

    run_cancel: Any
    #: The actions of the steps it made claimable (parents woken), comma-separated.
    ready: str | None


class CallResolved(NamedTuple):
    """step_call_resolve: the node whose step call was resolved."""

    node: str
    ready: str | None


class Retried(NamedTuple):
    """step_retry"""

    nodes: list[str]
    ready: str | None


class Paused(NamedTuple):
    """run_pause, run_resume, pause_set, pause_clear: whether it changed anything."""

    changed: bool
    ready: str | None


class Pause(NamedTuple):
    """pauses_list: a paused workflow or action."""

    kind: str
    name: str
    actor: str
    reason: str
    at: datetime


class TagsSet(NamedTuple):
    """run_tags_set: the run's tags after the change."""

    tags: dict[str, str]


class WorkflowDeadline(NamedTuple):
    """workflow_deadline_set, workflow_deadline_clear, workflow_deadlines_list: a
    workflow's default deadline, in seconds, and who set it, when and why."""

    workflow: str
    seconds: float
    set_by: str
    set_at: datetime
    reason: str


class Operator(Repository):
    """What operators do to runs: cancel, retry, resolve."""

    async def run_cancel(
        self, run_id: uuid.UUID, *, actor: str, reason: str, keep_children: bool = False
    ) -> None:
        await self._all(
            "run_cancel",
            Cancelled,
            run_id=str(run_id),
            actor=actor,
            reason=reason,
            keep_children=keep_children,
        )

    async def step_call_resolve(
        self,
        run_id: uuid.UUID,
        node: str | None,
        step_id: str,
        *,
        choice: str,
        value_json: str | None,
        actor: str,
        reason: str,
    ) -> str:
        """Resolve a run blocked on a step call; returns the node (``node`` None: the
        one the run's error names)."""
        row = await self._one(
            "step_call_resolve",
            CallResolved,
            run_id=str(run_id),
            node=node,
            step_id=step_id,
            choice=choice,
            value=value_json,
            actor=actor,
            reason=reason,
        )
        assert row is not None
        return row.node

    async def step_retry(
        self, run_id: uuid.UUID, nodes: list[str] | None, *, actor: str, reason: str
    ) -> list[str]:
        row = await self._one(
            "step_retry", Retried, run_id=str(run_id), nodes=nodes, actor=actor, reason=reason
        )
        assert row is not None
        return list(row.nodes)

    async def step_resolve(
        self,
        run_id: uuid.UUID,
        node: str,
        *,
        choice: str,
        value_json: str | None,
        actor: str,
        reason: str,
    ) -> None:
        await self._all(
            "step_resolve",
            Ready,
            run_id=str(run_id),
            node=node,
            choice=choice,
            value=value_json,
            actor=actor,
            reason=reason,
        )

    async def run_pause(self, run_id: uuid.UUID, *, actor: str, reason: str) -> bool:
        """Pause a run; False when it was paused already."""
        row = await self._one("run_pause", Paused, run_id=str(run_id), actor=actor, reason=reason)
        assert row is not None
        return row.changed

    async def run_resume(self, run_id: uuid.UUID, *, actor: str, reason: str) -> bool:
        """Resume a paused run; False when it was not paused."""
        row = await self._one("run_resume", Paused, run_id=str(run_id), actor=actor, reason=reason)
        assert row is not None
        return row.changed

    async def pause_set(self, kind: str, name: str, *, actor: str, reason: str) -> bool:
        """Pause a workflow or an action (``kind``); False when it was paused already."""
        row = await self._one(
            "pause_set", Paused, kind=kind, target=name, actor=actor, reason=reason
        )
        assert row is not None
        return row.changed

    async def pause_clear(self, kind: str, name: str, *, actor: str, reason: str) -> bool:
        """Resume a paused workflow or action; False when it was not paused."""
        row = await self._one(
            "pause_clear", Paused, kind=kind, target=name, actor=actor, reason=reason
        )
        assert row is not None
        return row.changed

    async def pauses_list(self) -> list[Pause]:
        """The workflows and actions paused now."""
        return await self._all("pauses_list", Pause)

    async def run_tags_set(
        self,
        run_id: uuid.UUID,
        *,
        set_json: str,
        remove: list[str],
        max_tags: int,
        actor: str,
        reason: str,
    ) -> dict[str, str]:
        """Sets and removes tags of one run (audited); its tags after."""
        row = await self._one(
            "run_tags_set",
            TagsSet,
            run_id=str(run_id),
            set=set_json,
            remove=remove,
            max=max_tags,
            actor=actor,
            reason=reason,
        )
        assert row is not None
        return row.tags

    async def workflow_deadline_set(
        self, workflow: str, seconds: float, *, actor: str, reason: str
    ) -> WorkflowDeadline:
        """Set (or replace) the default deadline of runs of ``workflow``."""
        row = await self._one(
            "workflow_deadline_set",
            WorkflowDeadline,
            workflow=workflow,
            seconds=seconds,
            actor=actor,
            reason=reason,
        )
        assert row is not None
        return row

    async def workflow_deadline_clear(self, workflow: str) -> WorkflowDeadline | None:
        """Clear the default deadline of ``workflow``; the one cleared, None if none."""
        return await self._one("workflow_deadline_clear", WorkflowDeadline, workflow=workflow)

    async def workflow_deadlines_list(self) -> list[WorkflowDeadline]:
        """Every workflow's default deadline, by name."""
        return await self._all("workflow_deadlines_list", WorkflowDeadline)
