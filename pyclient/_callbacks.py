"""The client's approvals and webhooks (AdminService ListApprovals, DecideApproval,
CreateWebhook, ListWebhooks, DeleteWebhook): docs/time-and-events.md, "Approvals",
and docs/webhooks.md."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, TypeVar

from cyclone.jsonvalue import from_value
from cyclone.v1 import admin_service_pb2 as admin_pb
from pyclient._requests import Call

T = TypeVar("T")


def _when(message: Any, field: str) -> dt.datetime | None:
    if not message.HasField(field):
        return None
    stamp: dt.datetime = getattr(message, field).ToDatetime(tzinfo=dt.UTC)
    return stamp


@dataclass(frozen=True, slots=True)
class ApprovalState:
    """An approval a durable function asked for (wait_for_approval): pending until
    ``decided_at``; ``decision`` is what its body got."""

    approval_id: str
    run_id: str
    workflow: str
    node: str
    step_id: str
    title: str
    created_at: dt.datetime | None
    expires_at: dt.datetime | None
    decided_at: dt.datetime | None
    decided_by: str
    decision: Any

    @classmethod
    def from_proto(cls, a: admin_pb.Approval) -> ApprovalState:
        return cls(
            approval_id=a.approval_id,
            run_id=a.run_id,
            workflow=a.workflow,
            node=a.node,
            step_id=a.step_id,
            title=a.title,
            created_at=_when(a, "created_at"),
            expires_at=_when(a, "expires_at"),
            decided_at=_when(a, "decided_at"),
            decided_by=a.decided_by,
            decision=from_value(a.decision) if a.HasField("decision") else None,
        )


@dataclass(frozen=True, slots=True)
class Webhook:
    """A webhook endpoint, POST /webhooks/<name>: ``action`` is ``send_event`` (the
    event ``event`` to the run at ``run_id_pointer``) or ``submit_once`` (a run of
    ``workflow``, one per key at ``key_pointer``). ``secret`` only as CreateWebhook
    answers it, when the server made it."""

    name: str
    action: str
    run_id_pointer: str
    event: str
    workflow: str
    key_pointer: str
    created_by: str
    created_at: dt.datetime | None
    secret: str = ""

    @classmethod
    def from_proto(cls, w: admin_pb.Webhook, secret: str = "") -> Webhook:
        kind = "send_event" if w.HasField("send_event") else "submit_once"
        return cls(
            name=w.name,
            action=kind,
            run_id_pointer=w.send_event.run_id_pointer,
            event=w.send_event.event,
            workflow=w.submit_once.workflow,
            key_pointer=w.submit_once.key_pointer,
            created_by=w.created_by,
            created_at=_when(w, "created_at"),
            secret=secret,
        )


class callback_calls:
    """The requests of approvals and webhooks."""

    @staticmethod
    def list_approvals(run_id: str | None, all: bool, limit: int) -> Call[list[ApprovalState]]:
        req = admin_pb.ListApprovalsRequest(run_id=run_id or "", all=all, limit=limit)
        return Call(
            "admin",
            "ListApprovals",
            req,
            lambda r: [ApprovalState.from_proto(a) for a in r.approvals],
        )

    @staticmethod
    def decide_approval(approval_id: str, approved: bool, comment: str) -> Call[ApprovalState]:
        req = admin_pb.DecideApprovalRequest(
            approval_id=approval_id, approved=approved, comment=comment
        )
        return Call("admin", "DecideApproval", req, lambda r: ApprovalState.from_proto(r.approval))

    @staticmethod
    def create_webhook(
        name: str,
        *,
        secret: str,
        event: str | None,
        run_id_pointer: str,
        workflow: str | None,
        key_pointer: str | None,
    ) -> Call[Webhook]:
        hook = admin_pb.Webhook(name=name)
        if event is not None:
            hook.send_event.CopyFrom(
                admin_pb.WebhookSendEvent(event=event, run_id_pointer=run_id_pointer)
            )
        if workflow is not None:
            hook.submit_once.CopyFrom(
                admin_pb.WebhookSubmitOnce(workflow=workflow, key_pointer=key_pointer or "")
            )
        req = admin_pb.CreateWebhookRequest(webhook=hook, secret=secret)
        return Call(
            "admin", "CreateWebhook", req, lambda r: Webhook.from_proto(r.webhook, r.secret)
        )

    @staticmethod
    def list_webhooks() -> Call[list[Webhook]]:
        return Call(
            "admin",
            "ListWebhooks",
            admin_pb.ListWebhooksRequest(),
            lambda r: [Webhook.from_proto(w) for w in r.webhooks],
        )

    @staticmethod
    def delete_webhook(name: str) -> Call[Webhook]:
        req = admin_pb.DeleteWebhookRequest(name=name)
        return Call("admin", "DeleteWebhook", req, lambda r: Webhook.from_proto(r.webhook))


class CallbackMethods:
    """Client's methods for approvals and webhooks (mixed into Client)."""

    def _invoke(self, call: Call[T]) -> T:
        raise NotImplementedError

    def list_approvals(
        self, run_id: str | None = None, *, all: bool = False, limit: int = 100
    ) -> list[ApprovalState]:
        """The pending approvals (with ``all``, decided and expired ones too), newest
        first; with ``run_id``, those of one run."""
        return self._invoke(callback_calls.list_approvals(run_id, all, limit))

    def decide_approval(self, approval_id: str, approved: bool, comment: str = "") -> ApprovalState:
        """Approve or reject a pending approval, as its URL would (audited, with the
        actor): the body gets {"approved", "comment", "decided_by"}."""
        return self._invoke(callback_calls.decide_approval(approval_id, approved, comment))

    def create_webhook(
        self,
        name: str,
        *,
        secret: str = "",
        event: str | None = None,
        run_id_pointer: str = "/run_id",
        workflow: str | None = None,
        key_pointer: str | None = None,
    ) -> Webhook:
        """Define POST /webhooks/<name>: with ``event``, it sends that event to the run
        at ``run_id_pointer`` in the body; with ``workflow``, it submits a run of it
        once per key at ``key_pointer``. Without ``secret`` the server makes one,
        answered once in ``Webhook.secret``."""
        return self._invoke(
            callback_calls.create_webhook(
                name,
                secret=secret,
                event=event,
                run_id_pointer=run_id_pointer,
                workflow=workflow,
                key_pointer=key_pointer,
            )
        )

    def list_webhooks(self) -> list[Webhook]:
        """Every webhook endpoint, by name (without secrets)."""
        return self._invoke(callback_calls.list_webhooks())

    def delete_webhook(self, name: str) -> Webhook:
        """Delete a webhook endpoint (NotFound when there is none)."""
        return self._invoke(callback_calls.delete_webhook(name))


class AsyncCallbackMethods:
    """AsyncClient's methods for approvals and webhooks (as CallbackMethods')."""

    async def _invoke(self, call: Call[T]) -> T:
        raise NotImplementedError

    async def list_approvals(
        self, run_id: str | None = None, *, all: bool = False, limit: int = 100
    ) -> list[ApprovalState]:
        return await self._invoke(callback_calls.list_approvals(run_id, all, limit))

    async def decide_approval(
        self, approval_id: str, approved: bool, comment: str = ""
    ) -> ApprovalState:
        return await self._invoke(callback_calls.decide_approval(approval_id, approved, comment))

    async def create_webhook(
        self,
        name: str,
        *,
        secret: str = "",
        event: str | None = None,
        run_id_pointer: str = "/run_id",
        workflow: str | None = None,
        key_pointer: str | None = None,
    ) -> Webhook:
        return await self._invoke(
            callback_calls.create_webhook(
                name,
                secret=secret,
                event=event,
                run_id_pointer=run_id_pointer,
                workflow=workflow,
                key_pointer=key_pointer,
            )
        )

    async def list_webhooks(self) -> list[Webhook]:
        return await self._invoke(callback_calls.list_webhooks())

    async def delete_webhook(self, name: str) -> Webhook:
        return await self._invoke(callback_calls.delete_webhook(name))
