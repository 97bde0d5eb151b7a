"""The versions of the durable function ``order`` that tests/sdk/test_durable_patches.py
deploys one after the other (in tests/sdk/patch_worker_process.py, or in memory), and
the steps they call. Each step appends ``RUN STEP`` to the file named by
$CYCLONE_PATCH_LOG, when set, so a test sees which steps ran for which run.

- ``v1``: ``reserve``, ``wait_for_event("go")``, ``charge``;
- ``v2``: v1 with ``if patched("fraud"): check_fraud()`` before the wait and
  ``if patched("notify"): notify()`` after it;
- ``v3``: v2 after the deprecation of ``fraud``: ``deprecate_patch("fraud")`` and
  ``check_fraud()`` in place of the ``if``;
- ``breaking``: v1 with ``check_fraud()`` before the wait, without a patch;
- ``twice``: checks the patch ``fraud`` twice;
- ``async-v1``, ``async-v2``: v1 and v2 as async bodies.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pyclient import current, deprecate_patch, patched, step, wait_for_event


def _log(name: str) -> str:
    path = os.environ.get("CYCLONE_PATCH_LOG")
    if path:
        with open(path, "a") as log:
            log.write(f"{current().run_id} {name}\n")
    return name


@step
def reserve(order: str) -> str:
    return _log("reserve") + ":" + order


@step
def check_fraud(order: str) -> str:
    return _log("check_fraud") + ":" + order


@step
def charge(order: str) -> str:
    return _log("charge") + ":" + order


@step
def notify(order: str) -> str:
    return _log("notify") + ":" + order


@step
async def reserve_async(order: str) -> str:
    return _log("reserve") + ":" + order


@step
async def check_fraud_async(order: str) -> str:
    return _log("check_fraud") + ":" + order


@step
async def charge_async(order: str) -> str:
    return _log("charge") + ":" + order


def v1(ctx: Any, order: str) -> list[str]:
    done = [reserve(order)]
    wait_for_event("go")
    return [*done, charge(order)]


def v2(ctx: Any, order: str) -> list[str]:
    done = [reserve(order)]
    if patched("fraud"):
        done.append(check_fraud(order))
    wait_for_event("go")
    if patched("notify"):
        done.append(notify(order))
    return [*done, charge(order)]


def v3(ctx: Any, order: str) -> list[str]:
    done = [reserve(order)]
    deprecate_patch("fraud")
    done.append(check_fraud(order))
    wait_for_event("go")
    if patched("notify"):
        done.append(notify(order))
    return [*done, charge(order)]


def breaking(ctx: Any, order: str) -> list[str]:
    done = [reserve(order), check_fraud(order)]
    wait_for_event("go")
    return [*done, charge(order)]


def twice(ctx: Any, order: str) -> list[str]:
    done = [reserve(order)]
    if patched("fraud"):
        done.append(check_fraud(order))
    if patched("fraud"):
        done.append(check_fraud(order))
    return done


async def async_v1(ctx: Any, order: str) -> list[str]:
    done = [await reserve_async(order)]
    await wait_for_event("go")
    return [*done, await charge_async(order)]


async def async_v2(ctx: Any, order: str) -> list[str]:
    done = [await reserve_async(order)]
    if patched("fraud"):
        done.append(await check_fraud_async(order))
    await wait_for_event("go")
    return [*done, await charge_async(order)]


#: The bodies by version name.
VERSIONS: dict[str, Callable[..., Any]] = {
    "v1": v1,
    "v2": v2,
    "v3": v3,
    "breaking": breaking,
    "twice": twice,
    "async-v1": async_v1,
    "async-v2": async_v2,
}
