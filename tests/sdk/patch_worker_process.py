"""A worker process serving one version of the durable function ``order`` (and its
async twin ``order_async``), for tests/sdk/test_durable_patches.py: a deploy is this
process stopped and started again with another version.

    python patch_worker_process.py ADDRESS LOG_FILE VERSION [ASYNC_VERSION]

VERSION and ASYNC_VERSION name bodies of tests/sdk/patch_bodies.py; each step call
appends "RUN STEP" to LOG_FILE. Stops on SIGTERM like any worker.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyclient import Worker
from tests.sdk.patch_bodies import VERSIONS


def main() -> None:
    address, log_path, version = sys.argv[1:4]
    async_version = sys.argv[4] if len(sys.argv) > 4 else "async-v1"
    os.environ["CYCLONE_PATCH_LOG"] = log_path
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    worker = Worker(address, concurrency=4, lease=10, claim_wait=1, shutdown_grace=10)
    worker.workflow("order")(VERSIONS[version])
    worker.workflow("order_async")(VERSIONS[async_version])
    worker.run()


if __name__ == "__main__":
    main()
