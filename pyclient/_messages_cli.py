"""The CLI's queries and updates of durable functions (`cyclone query`, `cyclone
update`; docs/durable-functions.md, "Queries and updates")."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pyclient._deadline_cli import _duration_arg
from pyclient.client import Client
from pyclient.errors import InvalidArgument

QUERY_HELP = """\
Ask the query handler NAME of the durable function running NODE of RUN (registered
by its body with @ctx.query(NAME)); each JSON is one argument. The worker running
the body answers (read-only, nothing is journaled); when none runs it, the answer is
the value the body last published (handlers without arguments only).

  cyclone query 01a2... cart items
  cyclone query 01a2... cart has '"apple"'
"""

UPDATE_HELP = """\
Send the update NAME to the durable function running NODE of RUN and print its
handler's result (registered by its body with @ctx.update(NAME)); each JSON is one
argument. The body applies it at its next step call or wait and records it in its
journal: a replay applies it again there, never a second time. --id makes it
idempotent: the same id again sends nothing and prints the first outcome.

  cyclone update 01a2... cart add_item '"apple"' --id add-apple-1
"""


def _args(texts: list[str]) -> list[Any]:
    values = []
    for text in texts:
        try:
            values.append(json.loads(text))
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"{text!r} is not valid JSON: {exc}") from None
    return values


def _query(client: Client, args: argparse.Namespace) -> Any:
    answer = client.query(
        args.run_id, args.node, args.name, *_args(args.args), timeout=args.timeout
    )
    if args.json:
        at = answer.published_at
        return {
            "result": answer.result,
            "published": answer.published,
            "published_at": at.isoformat() if at else None,
        }
    text = json.dumps(answer.result)
    if answer.published and answer.published_at is not None:
        when = f"{answer.published_at:%Y-%m-%d %H:%M:%S} UTC"
        text += f"\n(no worker runs node {args.node}: the value its body published at {when})"
    return text


def _update(client: Client, args: argparse.Namespace) -> Any:
    done = client.update(
        args.run_id,
        args.node,
        args.name,
        *_args(args.args),
        update_id=args.id,
        timeout=args.timeout,
    )
    if args.json:
        return {
            "result": done.result,
            "update_id": done.update_id,
            "created": done.created,
            "seq": done.seq,
        }
    text = json.dumps(done.result)
    if not done.created:
        text += f"\n(update {done.update_id} was sent before: its recorded outcome)"
    return text


def message_commands(command: Any, common: argparse.ArgumentParser) -> None:
    """ "query" and "update"."""
    for name, help_, text, handler in (
        ("query", "ask a durable function's query handler", QUERY_HELP, _query),
        ("update", "send an update to a durable function", UPDATE_HELP, _update),
    ):
        p = command(name, help_, text)
        p.add_argument("run_id", metavar="RUN")
        p.add_argument("node", metavar="NODE")
        p.add_argument("name", metavar="NAME")
        p.add_argument("args", nargs="*", metavar="JSON", help="an argument, as JSON")
        p.add_argument(
            "--timeout",
            type=_duration_arg,
            default=None,
            metavar="DURATION",
            help="how long the server waits for the answer (90s, 2m; default 10s for a "
            "query, 30s for an update)",
        )
        if name == "update":
            p.add_argument("--id", default=None, help="the update's idempotency key")
        p.set_defaults(handler=handler)
