"""Submit one order (at most once per order id), wait for it, show the run.

.venv/bin/python examples/python/submit.py [--address HOST:PORT] [ORDER_ID]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from order import workflow

from pyclient import Client
from pyclient.cli import render_run
from pyclient.client import default_address


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=default_address())
    parser.add_argument("order_id", nargs="?", default="o-1001")
    parser.add_argument("--amount", type=int, default=4200)
    parser.add_argument("--email", default="ada@example.com")
    args = parser.parse_args(argv)
    order = {"order_id": args.order_id, "amount": args.amount, "email": args.email}
    with Client(args.address, actor="examples/submit.py") as client:
        # The key makes a repeated submit (a retried HTTP request...) return the same run.
        submitted = client.submit_once(workflow(), key=f"order-{args.order_id}", input=order)
        print(("submitted " if submitted.created else "already submitted ") + submitted.run_id)
        run = client.wait(submitted.run_id, timeout=60)
        print(render_run(run))
        return run.status


if __name__ == "__main__":
    sys.exit(0 if main() == "completed" else 1)
