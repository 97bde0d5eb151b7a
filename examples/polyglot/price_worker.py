"""The Python side of the checkout workflow: serves checkout.price until Ctrl-C or SIGTERM.

.venv/bin/python examples/polyglot/price_worker.py [--address HOST:PORT]

price totals the order's items (the run input that examples/ts submits) for the Go
worker's checkout.charge, which depends on it. It has no effect outside its output,
so running it twice is harmless and it needs no database.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass

from pyclient import NonRetryableError, Worker
from pyclient.client import default_address


@dataclass
class Order:
    customer: str
    items: list[dict]


def make_worker(address: str, **options: object) -> Worker:
    worker = Worker(address, **options)  # type: ignore[arg-type]

    @worker.action("checkout.price")
    def price(ctx, order: Order) -> dict:
        if not order.items:
            raise NonRetryableError(f"order of {order.customer} has no items")
        amount = sum(int(item["qty"]) * int(item["unit_price"]) for item in order.items)
        return {"amount": amount, "currency": "EUR", "items": len(order.items)}

    return worker


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=default_address())
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    make_worker(args.address).run()


if __name__ == "__main__":
    main()
