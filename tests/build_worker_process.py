"""A worker process of one build, for deploy tests (tests/build_lab.py): its build is
the environment's CYCLONE_BUILD_ID, as a deployed worker would get it (none when unset).

    CYCLONE_BUILD_ID=v1 python build_worker_process.py ADDRESS

Actions:

``deploy``
    A durable function: the step ``begin``, then ``wait_for_event("go")``, then the
    step ``finish``; each step returns the build that ran it, and the body returns
    ``{"began": ..., "finished": ...}``, so a test reads which build did what.
``checkout``
    A durable function: ``reserve``, then on the patched code (the environment's
    CYCLONE_TEST_PATCHED=1) ``add_tax`` behind ``patched("add-tax")``, then
    ``wait_for_event("go")`` and ``settle``. It returns the steps that the body's calls
    went through and the build of each, so a test reads which path each run took.
``probe``
    A plain action returning the build that ran it: once a probe submitted after a
    node became ready has completed, the workers have had their chance to take that
    node too.
"""

from __future__ import annotations

import argparse
import logging
import os

from pyclient import Worker, patched, step, wait_for_event

BUILD = os.environ.get("CYCLONE_BUILD_ID") or ""
PATCHED = os.environ.get("CYCLONE_TEST_PATCHED") == "1"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    worker = Worker(args.address, concurrency=2, lease=5.0, claim_wait=5.0, shutdown_grace=5.0)

    @step
    def begin() -> str:
        return BUILD

    @step
    def finish() -> str:
        return BUILD

    @worker.workflow("deploy")
    def deploy(ctx: object) -> dict[str, str]:
        began = begin()
        wait_for_event("go")
        return {"began": began, "finished": finish()}

    @step
    def reserve() -> str:
        return BUILD

    @step
    def add_tax() -> str:
        return BUILD

    @step
    def settle() -> str:
        return BUILD

    @worker.workflow("checkout")
    def checkout(ctx: object) -> dict[str, str]:
        path = {"reserve": reserve()}
        if PATCHED and patched("add-tax"):
            path["add_tax"] = add_tax()
        wait_for_event("go")
        path["settle"] = settle()
        return path

    @worker.action("probe")
    def probe(ctx: object) -> str:
        return BUILD

    worker.run()  # until SIGTERM


if __name__ == "__main__":
    main()
