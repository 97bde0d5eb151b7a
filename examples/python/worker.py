"""Run the order worker until Ctrl-C or SIGTERM.

.venv/bin/python examples/python/worker.py [--address HOST:PORT] [--database-url URL]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from order import make_worker

from pyclient.client import default_address

#: Where `make run` keeps its embedded Postgres, and so the URL of its database.
EMBEDDED = Path(__file__).resolve().parents[2] / ".cyclone" / "pgdata"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default=default_address())
    parser.add_argument(
        "--database-url",
        default=os.environ.get("CYCLONE_DATABASE_URL")
        or f"postgresql://postgres:@/cyclone?host={EMBEDDED}",
        help="the Cyclone database (default: $CYCLONE_DATABASE_URL, else make run's)",
    )
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    make_worker(args.address, args.database_url, concurrency=args.concurrency).run()


if __name__ == "__main__":
    main()
