"""The Python SDK's worker for the bench's `languages` scenario (bench/languages.py):
serves one action with an async no-op handler until SIGTERM.

    python bench/workers/python_worker.py --address A --action X --concurrency N
"""

from __future__ import annotations

import argparse
import os
import resource
from pathlib import Path

from pyclient import Worker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--action", required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    worker = Worker(args.address, concurrency=args.concurrency, shutdown_grace=5.0)

    @worker.action(args.action)
    async def noop(ctx):
        return None

    where = os.environ.get("CYCLONE_BENCH_STARTUP_DIR")
    if where:  # the CPU spent starting, which the bench leaves out of the CPU per step
        me = resource.getrusage(resource.RUSAGE_SELF)
        Path(where, str(os.getpid())).write_text(repr(me.ru_utime + me.ru_stime))
    worker.run()


if __name__ == "__main__":
    main()
