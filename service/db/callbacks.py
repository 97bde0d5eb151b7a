"""Approvals by token and signed webhooks: the HTTP ingress's queries
(service/schema/77_approvals.sql, 78_webhooks.sql)."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any, NamedTuple

from service.db.pool import Repository


class ApprovalMade(NamedTuple):
    """approval_create: the approval's id, expiry, and whether it is decided."""

    approval_id: uuid.UUID
    expires_at: datetime
    decided: bool


class Decided(NamedTuple):
    """approval_decide: decided, already_decided, expired, finished or unknown."""

    outcome: str
    approval_id: uuid.UUID | None
    run_id: uuid.UUID | None
    decided_at: datetime | None
    decided_by: str | None
    ready: str | None


class ApprovalRow(NamedTuple):
    """approvals_list, approval_get: one approval and its run's workflow."""

    approval_id: uuid.UUID
    run_id: uuid.UUID
    node: str
    step_id: str
    title: str
    created_at: datetime
    expires_at: datetime
    decided_at: datetime | None
    decided_by: str | None
    decision: Any
    workflow: str


class ApprovalPage(NamedTuple):
    """approval_by_token: what an approval's page shows, and whether it expired (by
    the database's clock, as approval_decide decides)."""

    run_id: uuid.UUID
    node: str
    title: str
    expires_at: datetime
    decided_at: datetime | None
    workflow: str
    expired: bool


class WebhookRow(NamedTuple):
    """A webhook endpoint as stored (its secret included: for the HTTP ingress only)."""

    name: str
    secret: str
    action: str
    run_id_pointer: str | None
    event: str | None
    workflow: Any
    key_pointer: str | None
    created_by: str
    created_at: datetime


class Delivered(NamedTuple):
    """webhook_deliver: unknown, replayed, event_sent or submitted."""

    outcome: str
    run_id: uuid.UUID | None
    created: bool | None
    event_id: int | None
    ready: str | None


class Callbacks(Repository):
    """Approvals and webhooks."""

    async def approval_create(
        self,
        *,
        run_id: str,
        node: str,
        lease_token: str,
        step_id: str,
        approval_id: uuid.UUID,
        token_sha256: bytes,
        ttl_s: float,
        title: str,
    ) -> ApprovalMade:
        row = await self._one(
            "approval_create",
            ApprovalMade,
            run_id=run_id,
            node=node,
            lease_token=lease_token,
            step_id=step_id,
            approval_id=str(approval_id),
            token_sha256=token_sha256,
            ttl_s=ttl_s,
            title=title,
        )
        assert row is not None
        return row

    async def approval_decide(
        self,
        *,
        token_sha256: bytes | None,
        approval_id: uuid.UUID | None,
        payload: Any,
        actor: str,
    ) -> Decided:
        row = await self._one(
            "approval_decide",
            Decided,
            token_sha256=token_sha256,
            approval_id=None if approval_id is None else str(approval_id),
            payload=json.dumps(payload, separators=(",", ":")),
            actor=actor,
        )
        assert row is not None
        return row

    async def approvals_list(
        self, *, run_id: uuid.UUID | None, all: bool, limit: int
    ) -> list[ApprovalRow]:
        return await self._all(
            "approvals_list",
            ApprovalRow,
            run_id=None if run_id is None else str(run_id),
            all=all,
            limit=limit,
        )

    async def approval_get(self, approval_id: uuid.UUID) -> ApprovalRow | None:
        return await self._one("approval_get", ApprovalRow, approval_id=str(approval_id))

    async def approval_by_token(self, token_sha256: bytes) -> ApprovalPage | None:
        return await self._one("approval_by_token", ApprovalPage, token_sha256=token_sha256)

    async def webhook_create(
        self,
        *,
        name: str,
        secret: str,
        action: str,
        run_id_pointer: str | None,
        event: str | None,
        workflow: Any,
        key_pointer: str | None,
        actor: str,
    ) -> WebhookRow | None:
        """The endpoint made; None when the name is taken."""
        return await self._one(
            "webhook_create",
            WebhookRow,
            hook=name,
            secret=secret,
            action=action,
            run_id_pointer=run_id_pointer,
            event=event,
            workflow=None if workflow is None else json.dumps(workflow),
            key_pointer=key_pointer,
            actor=actor,
        )

    async def webhooks_list(self) -> list[WebhookRow]:
        return await self._all("webhooks_list", WebhookRow)

    async def webhook_get(self, name: str) -> WebhookRow | None:
        return await self._one("webhook_get", WebhookRow, hook=name)

    async def webhook_delete(self, name: str) -> WebhookRow | None:
        return await self._one("webhook_delete", WebhookRow, hook=name)

    async def webhook_deliver(
        self,
        *,
        name: str,
        delivery_id: str,
        payload_json: str,
        run_id: uuid.UUID | None,
        key: str | None,
        keep_s: float,
    ) -> Delivered:
        row = await self._one(
            "webhook_deliver",
            Delivered,
            hook=name,
            delivery_id=delivery_id,
            payload=payload_json,
            run_id=None if run_id is None else str(run_id),
            key=key,
            keep_s=keep_s,
        )
        assert row is not None
        return row
