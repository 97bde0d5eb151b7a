"""The CLI's webhooks and approvals: `cyclone webhook create|list|delete` and
`cyclone approval list|approve|reject` (docs/webhooks.md, docs/time-and-events.md)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from pyclient._callbacks import ApprovalState, Webhook
from pyclient.client import Client

WEBHOOK_HELP = """\
A webhook endpoint: POST /webhooks/NAME on the server's HTTP listener (--http-listen),
signed with HMAC-SHA256 (Cyclone-Signature: t=<unix>,v1=<hex HMAC of "t.body">), sends
an event to a run or submits a run once per key (docs/webhooks.md).

  cyclone webhook create carrier --event delivered --run-id-pointer /meta/run_id
  cyclone webhook create orders --submit-once order --key-pointer /order/id
  cyclone webhook list
  cyclone webhook delete orders
"""

APPROVAL_HELP = """\
Approvals durable functions asked for (wait_for_approval): list the pending ones,
approve or reject one (recorded in the run's audit trail with your --actor).

  cyclone approval list
  cyclone approval approve 5f0c7a1e-8a43-4bb5-a3a4-2c1b8f2e9d10 --comment "ok"
  cyclone approval reject 5f0c7a1e-8a43-4bb5-a3a4-2c1b8f2e9d10
"""


def _plain(item: Webhook | ApprovalState) -> dict[str, Any]:
    data = dataclasses.asdict(item)
    return {k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in data.items()}


def _hook_line(h: Webhook) -> str:
    if h.action == "send_event":
        does = f"send_event {h.event} to the run at {h.run_id_pointer}"
    else:
        does = f"submit_once {h.workflow}, key at {h.key_pointer}"
    return f"{h.name}  {does}  (by {h.created_by})"


def _create(client: Client, args: argparse.Namespace) -> Any:
    if (args.event is None) == (args.submit_once is None):
        raise SystemExit("cyclone: give exactly one of --event and --submit-once")
    if args.submit_once is not None and not args.key_pointer:
        raise SystemExit("cyclone: --submit-once needs --key-pointer (e.g. /order/id)")
    hook = client.create_webhook(
        args.name,
        secret=args.secret or "",
        event=args.event,
        run_id_pointer=args.run_id_pointer,
        workflow=args.submit_once,
        key_pointer=args.key_pointer,
    )
    if args.json:
        return _plain(hook)
    made = f"webhook {_hook_line(hook)}"
    if hook.secret:
        made += f"\nsecret (shown once): {hook.secret}"
    return made


def _list(client: Client, args: argparse.Namespace) -> Any:
    hooks = client.list_webhooks()
    if args.json:
        return {"webhooks": [_plain(h) for h in hooks]}
    return "\n".join(_hook_line(h) for h in hooks) or "no webhooks"


def _delete(client: Client, args: argparse.Namespace) -> Any:
    hook = client.delete_webhook(args.name)
    return _plain(hook) if args.json else f"webhook {hook.name} deleted"


def _approval_line(a: ApprovalState) -> str:
    state = (
        f"decided by {a.decided_by}: {a.decision}"
        if a.decided_at
        else f"pending until {a.expires_at:%Y-%m-%d %H:%M:%S} UTC"
        if a.expires_at
        else "pending"
    )
    return f"{a.approval_id}  run {a.run_id} ({a.workflow}/{a.node})  {a.title!r}  {state}"


def _approvals(client: Client, args: argparse.Namespace) -> Any:
    found = client.list_approvals(args.run, all=args.all)
    if args.json:
        return {"approvals": [_plain(a) for a in found]}
    return "\n".join(_approval_line(a) for a in found) or "no pending approvals"


def _decide(approved: bool) -> Any:
    def decide(client: Client, args: argparse.Namespace) -> Any:
        got = client.decide_approval(args.approval_id, approved, args.comment)
        if args.json:
            return _plain(got)
        return f"approval {got.approval_id} {'approved' if approved else 'rejected'}"

    return decide


def callback_commands(command: Any, common: argparse.ArgumentParser) -> None:
    """ "webhook create|list|delete" and "approval list|approve|reject"."""
    p = command("webhook", "signed HTTP webhooks that send events or submit runs", WEBHOOK_HELP)
    sub = p.add_subparsers(dest="webhook_command", required=True, metavar="SUBCOMMAND")

    def webhook_command(name: str, help: str) -> Any:
        return sub.add_parser(name, help=help, description=help, parents=[common])

    create = webhook_command("create", "define a webhook endpoint")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--event", help="send this event to a run (SendEvent)")
    create.add_argument(
        "--run-id-pointer",
        default="/run_id",
        metavar="POINTER",
        help="JSON pointer to the run id in the body (default /run_id)",
    )
    create.add_argument(
        "--submit-once", metavar="WORKFLOW", help="submit a run of this workflow (SubmitOnce)"
    )
    create.add_argument("--key-pointer", metavar="POINTER", help="JSON pointer to the key")
    create.add_argument(
        "--secret", help="the HMAC secret (16-200 characters); default: made by the server"
    )
    create.set_defaults(handler=_create)
    webhook_command("list", "every webhook endpoint (no secrets)").set_defaults(handler=_list)
    delete = webhook_command("delete", "delete a webhook endpoint")
    delete.add_argument("name", metavar="NAME")
    delete.set_defaults(handler=_delete)

    p = command("approval", "approvals durable functions wait for", APPROVAL_HELP)
    sub = p.add_subparsers(dest="approval_command", required=True, metavar="SUBCOMMAND")
    listing = sub.add_parser(
        "list",
        help="the pending approvals",
        description="the pending approvals",
        parents=[common],
    )
    listing.add_argument("--run", metavar="RUN", help="those of one run")
    listing.add_argument("--all", action="store_true", help="decided and expired ones too")
    listing.set_defaults(handler=_approvals)
    for name, approved in (("approve", True), ("reject", False)):
        decide = sub.add_parser(
            name,
            help=f"{name} a pending approval",
            description=f"{name} a pending approval",
            parents=[common],
        )
        decide.add_argument("approval_id", metavar="APPROVAL")
        decide.add_argument("--comment", default="", help="a comment the body gets")
        decide.set_defaults(handler=_decide(approved))
