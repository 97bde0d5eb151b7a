"""Approvals by token and signed webhooks over gRPC: WorkerService.CreateApproval, and
AdminService's ListApprovals, DecideApproval, CreateWebhook, ListWebhooks and
DeleteWebhook. The HTTP side (POST /callbacks/<token>, POST /webhooks/<name>) is
service.ingress; docs/time-and-events.md and docs/webhooks.md describe both."""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import uuid
from typing import Any

from cyclone import dag
from cyclone.v1 import admin_service_pb2 as admin_pb
from cyclone.v1 import worker_service_pb2 as worker_pb
from service import errors
from service.api import convert
from service.api.ids import parse_uuid, uuid_text
from service.api.status import rpc
from service.api.validate import Context, actor_of, node_name, seconds, step_call_name, text
from service.config import Settings
from service.db import Database
from service.db.callbacks import ApprovalRow, WebhookRow
from service.engine.waits import event_wait

log = logging.getLogger("cyclone")

#: Longest title of an approval, and comment of a decision.
MAX_TITLE = 1000
#: Longest approval timeout: 366 days.
MAX_APPROVAL_TIMEOUT_S = 366 * 86400.0
#: The prefix of the event an approval call waits for.
APPROVAL_EVENT = "approval:"
#: A webhook's name: what may follow /webhooks/ in a URL.
WEBHOOK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
#: A webhook secret's length.
MIN_SECRET, MAX_SECRET = 16, 200
#: Most approvals one ListApprovals answers.
MAX_APPROVALS_LISTED = 1000


def token_sha256(token: str) -> bytes:
    """What is stored of an approval token: the SHA-256 of its UTF-8 text."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def approval_proto(row: ApprovalRow) -> admin_pb.Approval:
    approval = admin_pb.Approval(
        approval_id=str(row.approval_id),
        run_id=str(row.run_id),
        node=row.node,
        step_id=row.step_id,
        title=row.title,
        created_at=convert.timestamp(row.created_at),
        expires_at=convert.timestamp(row.expires_at),
        decided_by=row.decided_by or "",
        workflow=row.workflow,
    )
    decided_at = convert.timestamp(row.decided_at)
    if decided_at is not None:
        approval.decided_at.CopyFrom(decided_at)
    convert.set_json(approval, "decision", row.decision)
    return approval


def webhook_proto(row: WebhookRow) -> admin_pb.Webhook:
    hook = admin_pb.Webhook(
        name=row.name, created_by=row.created_by, created_at=convert.timestamp(row.created_at)
    )
    if row.action == "send_event":
        hook.send_event.CopyFrom(
            admin_pb.WebhookSendEvent(
                run_id_pointer=row.run_id_pointer or "", event=row.event or ""
            )
        )
    else:
        workflow = row.workflow.get("name", "") if isinstance(row.workflow, dict) else ""
        hook.submit_once.CopyFrom(
            admin_pb.WebhookSubmitOnce(workflow=workflow, key_pointer=row.key_pointer or "")
        )
    return hook


def json_pointer(value: str, what: str) -> str:
    """A JSON pointer (RFC 6901) from a request: "" or "/..." with valid escapes."""
    if value and (not value.startswith("/") or re.search(r"~(?![01])", value)):
        raise errors.InvalidArgument(
            f"{what} must be a JSON pointer such as /run_id (RFC 6901), got {dag.excerpt(value)}"
        )
    return text(value, what, 500)


def callback_url(base: str, token: str) -> str:
    """Where an approval's decision is POSTed."""
    return f"{base.rstrip('/')}/callbacks/{token}"


class CallbacksWorker:
    """WorkerService.CreateApproval (mixed into WorkerServicer)."""

    db: Database
    settings: Settings
    #: The HTTP ingress's base URL (--public-url, else the listener's own), set when
    #: it starts; "" when it is off.
    callback_base: str = ""

    @rpc
    async def CreateApproval(
        self, request: worker_pb.CreateApprovalRequest, context: Context
    ) -> worker_pb.CreateApprovalResponse:
        run_id = uuid_text(request.run_id)
        node = node_name(request.node)
        lease_token = uuid_text(request.lease_token, "lease_token")
        step_id = step_call_name(request.step_id, "step_id")
        ttl = (
            seconds(request.timeout)
            if request.HasField("timeout")
            else self.settings.approval_timeout_s
        )
        if not 1 <= ttl <= MAX_APPROVAL_TIMEOUT_S:
            raise errors.InvalidArgument(
                f"an approval's timeout must be between 1s and 366 days, got {ttl:g}s"
            )
        title = text(request.title, "title", MAX_TITLE)
        token = secrets.token_urlsafe(32)
        made = await self.db.callbacks.approval_create(
            run_id=run_id,
            node=node,
            lease_token=lease_token,
            step_id=step_id,
            approval_id=uuid.uuid4(),
            token_sha256=token_sha256(token),
            ttl_s=ttl,
            title=title,
        )
        response = worker_pb.CreateApprovalResponse(
            approval_id=str(made.approval_id),
            expires_at=convert.timestamp(made.expires_at),
            event=APPROVAL_EVENT + str(made.approval_id),
            decided=made.decided,
        )
        if not made.decided:
            response.token = token
            response.url = callback_url(self.callback_base, token)
        log.info(
            "approval %s asked by %s/%s (%s), until %s",
            made.approval_id,
            run_id,
            node,
            step_id,
            made.expires_at,
            extra={"run_id": run_id, "node": node},
        )
        return response


def _webhook_fields(hook: admin_pb.Webhook) -> dict[str, Any]:
    """The stored fields of a webhook from CreateWebhook, validated."""
    if not WEBHOOK_NAME.fullmatch(hook.name):
        raise errors.InvalidArgument(
            "a webhook's name must be 1 to 100 letters, digits, '-', '_' or '.', got "
            f"{dag.excerpt(hook.name)}"
        )
    kinds = [k for k in ("send_event", "submit_once") if hook.HasField(k)]
    if len(kinds) != 1:
        raise errors.InvalidArgument("a webhook takes exactly one of send_event and submit_once")
    if kinds[0] == "send_event":
        event, _ = event_wait(hook.send_event.event, None, "send_event.event")
        return {
            "action": "send_event",
            "run_id_pointer": json_pointer(
                hook.send_event.run_id_pointer or "/run_id", "send_event.run_id_pointer"
            ),
            "event": event,
            "workflow": None,
            "key_pointer": None,
        }
    name = hook.submit_once.workflow
    try:
        dag.check_name("workflow", name)
    except dag.InvalidWorkflow as exc:
        raise errors.InvalidArgument(f"submit_once.workflow: {exc}") from None
    if not hook.submit_once.key_pointer:
        raise errors.InvalidArgument("submit_once.key_pointer is required (e.g. /id)")
    return {
        "action": "submit_once",
        "run_id_pointer": None,
        "event": None,
        # The one-node workflow client.start submits for a durable function.
        "workflow": {"name": name, "nodes": [{"name": name, "action": name}]},
        "key_pointer": json_pointer(hook.submit_once.key_pointer, "submit_once.key_pointer"),
    }


class CallbacksAdmin:
    """AdminService's approvals and webhooks (mixed into AdminServicer)."""

    db: Database

    async def _approval(self, approval_id: uuid.UUID) -> admin_pb.Approval:
        row = await self.db.callbacks.approval_get(approval_id)
        if row is None:
            raise errors.NotFound(f"approval {approval_id} not found")
        return approval_proto(row)

    @rpc
    async def ListApprovals(
        self, request: admin_pb.ListApprovalsRequest, context: Context
    ) -> admin_pb.ListApprovalsResponse:
        run_id = parse_uuid(request.run_id) if request.run_id else None
        if not 0 <= request.limit <= MAX_APPROVALS_LISTED:
            raise errors.InvalidArgument(
                f"limit must be from 0 to {MAX_APPROVALS_LISTED}, got {request.limit}"
            )
        rows = await self.db.callbacks.approvals_list(
            run_id=run_id, all=request.all, limit=request.limit or 100
        )
        return admin_pb.ListApprovalsResponse(approvals=[approval_proto(r) for r in rows])

    @rpc
    async def DecideApproval(
        self, request: admin_pb.DecideApprovalRequest, context: Context
    ) -> admin_pb.DecideApprovalResponse:
        approval_id = parse_uuid(request.approval_id, "approval_id")
        comment = text(request.comment, "comment", MAX_TITLE)
        actor = actor_of(context)
        payload = {"approved": request.approved, "comment": comment, "decided_by": actor}
        row = await self.db.callbacks.approval_decide(
            token_sha256=None, approval_id=approval_id, payload=payload, actor=actor
        )
        if row.outcome == "unknown":
            raise errors.NotFound(f"approval {approval_id} not found")
        if row.outcome == "already_decided":
            raise errors.FailedPrecondition(
                f"approval {approval_id} was decided already, by {row.decided_by} at "
                f"{row.decided_at}"
            )
        if row.outcome == "expired":
            raise errors.FailedPrecondition(f"approval {approval_id} has expired")
        if row.outcome == "finished":
            raise errors.FailedPrecondition(
                f"approval {approval_id}: its run {row.run_id} has finished"
            )
        log.info(
            "approval %s %s by %s",
            approval_id,
            "approved" if request.approved else "rejected",
            actor,
            extra={"run_id": str(row.run_id)},
        )
        return admin_pb.DecideApprovalResponse(approval=await self._approval(approval_id))

    @rpc
    async def CreateWebhook(
        self, request: admin_pb.CreateWebhookRequest, context: Context
    ) -> admin_pb.CreateWebhookResponse:
        fields = _webhook_fields(request.webhook)
        made_secret = not request.secret
        secret = secrets.token_urlsafe(32) if made_secret else request.secret
        if not MIN_SECRET <= len(secret) <= MAX_SECRET or not secret.isprintable():
            raise errors.InvalidArgument(
                f"a webhook secret must be {MIN_SECRET} to {MAX_SECRET} printable characters"
            )
        actor = actor_of(context)
        row = await self.db.callbacks.webhook_create(
            name=request.webhook.name, secret=secret, actor=actor, **fields
        )
        if row is None:
            raise errors.AlreadyExists(f"webhook {request.webhook.name} exists already")
        log.info("webhook %s created by %s (%s)", row.name, actor, row.action)
        return admin_pb.CreateWebhookResponse(
            webhook=webhook_proto(row), secret=secret if made_secret else ""
        )

    @rpc
    async def ListWebhooks(
        self, request: admin_pb.ListWebhooksRequest, context: Context
    ) -> admin_pb.ListWebhooksResponse:
        rows = await self.db.callbacks.webhooks_list()
        return admin_pb.ListWebhooksResponse(webhooks=[webhook_proto(r) for r in rows])

    @rpc
    async def DeleteWebhook(
        self, request: admin_pb.DeleteWebhookRequest, context: Context
    ) -> admin_pb.DeleteWebhookResponse:
        if not WEBHOOK_NAME.fullmatch(request.name):
            raise errors.InvalidArgument(
                f"a webhook's name is 1 to 100 letters, digits, '-', '_' or '.', got "
                f"{dag.excerpt(request.name)}"
            )
        row = await self.db.callbacks.webhook_delete(request.name)
        if row is None:
            raise errors.NotFound(f"webhook {dag.excerpt(request.name)} not found")
        log.info("webhook %s deleted by %s", row.name, actor_of(context))
        return admin_pb.DeleteWebhookResponse(webhook=webhook_proto(row))
