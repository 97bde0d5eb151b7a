"""A worker in a process of its own, for the shutdown test.

    python worker_process.py ADDRESS LOG_FILE

Serves the action "work": appends "start RUN" to LOG_FILE, sleeps for the node's
input (seconds), appends "end RUN", returns "ok". Stops on SIGTERM like any worker.
"""

from __future__ import annotations

import logging
import sys
import time

from pyclient import Worker


def main() -> None:
    address, log_path = sys.argv[1:3]
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    worker = Worker(address, concurrency=4, lease=10, claim_wait=5, shutdown_grace=15)

    @worker.action("work")
    def work(ctx, seconds: float):
        with open(log_path, "a") as log:
            log.write(f"start {ctx.run_id}\n")
        time.sleep(seconds)  # still running when the test sends SIGTERM
        with open(log_path, "a") as log:
            log.write(f"end {ctx.run_id}\n")
        return "ok"

    worker.run()


if __name__ == "__main__":
    main()
