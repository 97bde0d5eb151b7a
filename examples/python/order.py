"""The order workflow of the seeds: charge -> send_receipt -> audit.

Each handler shows one way to make an effect safe when it runs more than once:

- charge: the ledger row is written on ctx.completion_tx(), so it commits together
  with the step's completion: exactly once, even if the worker dies mid-way.
- send_receipt: the mail provider gets the idempotency key "run_id:node", which is
  the same on every attempt, so it drops the duplicates.
- audit: a write outside the completion transaction, deduplicated by
  ON CONFLICT (run_id, node) DO NOTHING. It runs even if the receipt failed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg

from pyclient import Worker, Workflow

log = logging.getLogger("order")

SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger (
    run_id uuid    NOT NULL,
    node   text    NOT NULL,
    amount integer NOT NULL,
    PRIMARY KEY (run_id, node)
);
CREATE TABLE IF NOT EXISTS audit_log (
    run_id uuid        NOT NULL,
    node   text        NOT NULL,
    action text        NOT NULL,
    ts     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, node)
);
"""


@dataclass
class Order:
    order_id: str
    amount: int
    email: str


def workflow() -> Workflow:
    wf = Workflow("order")
    charge = wf.node("charge", timeout=30)
    receipt = wf.node("send_receipt", depends_on=charge)
    wf.node("audit", depends_on=receipt, trigger_rule="all_done")
    return wf


class FakeMailer:
    """Stands in for SendGrid, Postmark...: one mail per idempotency key."""

    def __init__(self) -> None:
        self.sent: dict[str, str] = {}

    def send(self, to: str, body: str, idempotency_key: str) -> str:
        if idempotency_key not in self.sent:
            log.info("mail to %s: %s", to, body)
            self.sent[idempotency_key] = f"msg-{len(self.sent) + 1}"
        return self.sent[idempotency_key]


def make_worker(address: str, database_url: str, **options: object) -> Worker:
    """A worker serving the three actions; the tables are created if missing."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    worker = Worker(address, database_url=database_url, **options)  # type: ignore[arg-type]
    mailer = FakeMailer()

    @worker.action("charge", timeout=30)
    def charge(ctx, order: Order) -> dict:
        ctx.completion_tx().execute(
            "INSERT INTO ledger (run_id, node, amount) VALUES (%s, %s, %s)"
            " ON CONFLICT (run_id, node) DO NOTHING",
            (ctx.run_id, ctx.node, order.amount),
        )
        return {"order_id": order.order_id, "amount": order.amount}

    @worker.action("send_receipt")
    def send_receipt(ctx, order: Order) -> dict:
        charged = ctx.upstream["charge"]["amount"]
        body = f"Thanks for order {order.order_id}: {charged} charged."
        message_id = mailer.send(order.email, body, idempotency_key=ctx.idempotency_key)
        return {"message_id": message_id}

    @worker.action("audit")
    def audit(ctx) -> None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO audit_log (run_id, node, action) VALUES (%s, %s, %s)"
                " ON CONFLICT (run_id, node) DO NOTHING",
                (ctx.run_id, ctx.node, "order processed"),
            )

    return worker
