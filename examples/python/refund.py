"""A durable function: refund an order item by item, through a flaky payment provider.

.venv/bin/python examples/python/refund.py worker [--address HOST:PORT]
.venv/bin/python examples/python/refund.py start [--address HOST:PORT] [ORDER_ID]

The body is plain Python: it asks which items the order has, loops over them, and
refunds each one. Every call of a @step function is recorded in the node's journal, so
when the worker dies and the node runs again, the calls that finished return their
recorded results instead of refunding twice; the retries of a flaky call and the
durable sleep are journaled too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from pyclient import Client, Worker, sleep, step
from pyclient.cli import render_run
from pyclient.client import default_address

log = logging.getLogger("refund")

#: The items of each order, as a shop's database would keep them.
ORDERS = {
    "o-1001": [{"sku": "mug", "amount": 1200}, {"sku": "tea", "amount": 800}],
    "o-1002": [{"sku": "kettle", "amount": 4900}],
}

#: Refunds the fake provider was asked for, per (order, sku): it drops the first.
_asked: dict[tuple[str, str], int] = {}


@step
def list_items(order_id: str) -> list[dict[str, Any]]:
    """Recorded: a replay loops over the same items even if the order changed since."""
    return ORDERS.get(order_id, [])


# A refund is keyed by (order, sku) at the provider, so a second call is harmless;
# the first call of each fails, as a flaky network would, and is retried after a
# durable backoff (journaled as refund_item~2:backoff, then refund_item~2).
@step(retries=3, backoff=0.2, retry_on=ConnectionError)
def refund_item(order_id: str, sku: str, amount: int) -> str:
    asked = _asked[order_id, sku] = _asked.get((order_id, sku), 0) + 1
    if asked == 1:
        raise ConnectionError("provider: connection reset")
    log.info("refunded %s of %s: %d", sku, order_id, amount)
    return f"rf-{order_id}-{sku}"


@step
def notify(order_id: str, refunds: list[str], total: int) -> None:
    log.info("mail: order %s refunded %d in %d refund(s)", order_id, total, len(refunds))


def refund(ctx: Any, order: dict[str, Any]) -> dict[str, Any]:
    """The durable function: the node's handler."""
    items = list_items(order["order_id"])
    refunds = [refund_item(order["order_id"], i["sku"], i["amount"]) for i in items]
    sleep(1)  # let the provider settle: the node gives up its worker meanwhile
    total = sum(i["amount"] for i in items)
    notify(order["order_id"], refunds, total)
    return {"refunds": refunds, "total": total}


def make_worker(address: str) -> Worker:
    worker = Worker(address, concurrency=2)
    worker.workflow("refund")(refund)
    return worker


def start(address: str, order_id: str) -> str:
    """Start the refund of ``order_id`` (at most once), wait for it, print the run with
    its journal; the run's status."""
    with Client(address, actor="examples/refund.py") as client:
        run_id = client.start("refund", {"order_id": order_id}, key=f"refund-{order_id}")
        print(f"started {run_id}")
        client.wait(run_id, timeout=60)
        run = client.get_run(run_id, logs=True)
        print(render_run(run))
        return run.status


def main(argv: list[str] | None = None) -> str | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["worker", "start"])
    parser.add_argument("order_id", nargs="?", default="o-1001")
    parser.add_argument("--address", default=default_address())
    args = parser.parse_args(argv)
    if args.command == "start":
        return start(args.address, args.order_id)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    make_worker(args.address).run()  # until Ctrl-C or SIGTERM
    return None


if __name__ == "__main__":
    sys.exit(0 if main() in (None, "completed") else 1)
