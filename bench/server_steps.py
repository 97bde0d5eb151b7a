"""The server's Python per step, offline: the WorkerService's Claim and CompleteMany
called directly (no network, no gRPC core), against a real embedded Postgres.

    python bench/server_steps.py prepare --runs 2000 [--input flow]
    python bench/server_steps.py run --steps 1000      # CPU µs per step of this process
    python bench/server_steps.py micro                 # timeit of _claimed, _completion

``prepare`` makes a fresh database of one-node runs ready to claim (``--input flow``:
each run carries ``{"customer": N}``, as bench.py's flow scenario does). ``run`` claims
batches of 64 through ``WorkerServicer.Claim`` (the response serialized, as gRPC would)
and completes them through ``CompleteMany`` (the request parsed from bytes, a null
output each), and prints this process's CPU time per step for each side: Postgres
runs in its own processes, so only the server's Python is counted. Under
``valgrind --tool=callgrind`` the difference of two ``run``s (e.g. 500 and 1500
steps, each after its own ``prepare``) gives instructions per step, which do not
depend on the machine's load. ``micro`` times the per-step functions themselves on
claimed rows and parsed items (``prepare`` first). ``run --profile N`` prints a
cProfile (on process time) of the drain, ``--batch`` sets the steps per claim, and
SERVER_STEPS_DB names the database (on the embedded Postgres under
.cyclone/server-steps; ``cyclone-server embedded stop --data-dir .cyclone/server-steps``
stops it). docs/performance.md, "The server", has the figures.

``micro --answers`` says how the server under test builds its answers: ``wire`` (the
default) times this tree's servicer, whose claim answer is written as protobuf bytes
(``service/api/wire.py``) and whose completion items go to SQL as one JSON text
(``service.db.completion.outcomes_json``); ``messages`` times a server that builds one ClaimedStep
message per step through the protobuf API (``servicer._claimed``) and dumps the items
one by one (``_outcome_items``), for A/B runs of this script copied into such a
checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import timeit
import warnings
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "core")]

from cyclone.v1 import worker_service_pb2  # noqa: E402
from service import embedded  # noqa: E402
from service.api.worker import WorkerServicer  # noqa: E402
from service.config import Settings  # noqa: E402
from service.db import Database  # noqa: E402
from service.engine.activity import ActionActivity, Handouts  # noqa: E402
from service.engine.notify import Dispatcher  # noqa: E402
from service.metrics import Metrics  # noqa: E402
from service.migrate import migrate  # noqa: E402

DATABASE = os.environ.get("SERVER_STEPS_DB", "cyclone_server_steps")
ACTION = "micro"
BATCH = 64


def admin_url() -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return embedded.attach(ROOT / ".cyclone" / "server-steps", "postgres").url


def _db(url: str, name: str) -> str:
    base, _, query = url.partition("?")
    return base.rsplit("/", 1)[0] + "/" + name + ("?" + query if query else "")


async def _submit(url: str, runs: int, flow: bool) -> None:
    from cyclone.dag import NodeSpec

    store = Database(url, pool_size=8)
    node = NodeSpec(name="only", action=ACTION)
    sem = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with sem:
            await store.runs.run_submit(
                workflow="micro",
                nodes=[node],
                input_json=f'{{"customer":{i % 200}}}' if flow else None,
                submit_key=None,
            )

    await asyncio.gather(*(one(i) for i in range(runs)))
    await store.close()


def prepare(runs: int, flow: bool) -> None:
    admin = admin_url()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    url = _db(admin, DATABASE)
    migrate(url)
    asyncio.run(_submit(url, runs, flow))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    print(f"prepared {runs} runs in {DATABASE}")


class _Context:
    """What the servicer asks of a gRPC context on the success path: nothing."""

    async def abort(self, code: Any, message: str) -> None:
        raise RuntimeError(f"{code}: {message}")

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass


def _servicer(url: str) -> tuple[WorkerServicer, Database]:
    settings = Settings(database_url=url)
    store = Database(url, pool_size=2)
    servicer = WorkerServicer(
        store, Dispatcher(url), settings, Metrics(), ActionActivity(), Handouts()
    )
    return servicer, store


def _claim_bytes(limit: int) -> bytes:
    request = worker_service_pb2.ClaimRequest(
        worker_id="micro", actions=[worker_service_pb2.ActionSpec(name=ACTION)], max_steps=limit
    )
    return request.SerializeToString()


def _complete_bytes(steps: list[worker_service_pb2.ClaimedStep]) -> bytes:
    from google.protobuf import struct_pb2

    null = struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
    request = worker_service_pb2.CompleteManyRequest(
        completions=[
            worker_service_pb2.CompleteRequest(
                run_id=s.run_id, node=s.node, lease_token=s.lease_token, output=null
            )
            for s in steps
        ]
    )
    return request.SerializeToString()


async def _run(url: str, steps: int, batch: int = BATCH) -> None:
    servicer, store = _servicer(url)
    context: Any = _Context()
    claim_cpu = complete_cpu = 0.0
    done = 0
    # One claim and completion first, outside the figures: connections, plans.
    warm = True
    while done < steps:
        limit = 1 if warm else min(batch, steps - done)
        raw = _claim_bytes(limit)
        t0 = time.process_time()
        request = worker_service_pb2.ClaimRequest.FromString(raw)
        reply = await servicer.Claim(request, context)
        answer = reply.SerializeToString()
        t1 = time.process_time()
        got = worker_service_pb2.ClaimResponse.FromString(answer).steps
        if not got:
            raise SystemExit(f"nothing left to claim after {done} steps: prepare more runs")
        raw = _complete_bytes(list(got))
        t2 = time.process_time()
        many = worker_service_pb2.CompleteManyRequest.FromString(raw)
        response = await servicer.CompleteMany(many, context)
        response.SerializeToString()
        t3 = time.process_time()
        if warm:
            warm = False
            continue
        claim_cpu += t1 - t0
        complete_cpu += t3 - t2
        done += len(got)
    await store.close()
    print(
        f"steps {done}: claim {claim_cpu / done * 1e6:.1f} µs/step, "
        f"complete {complete_cpu / done * 1e6:.1f} µs/step, "
        f"total {(claim_cpu + complete_cpu) / done * 1e6:.1f} µs/step (process CPU)"
    )


async def _micro(url: str, number: int, only: str | None = None, answers: str = "wire") -> None:
    servicer, store = _servicer(url)
    rows = await store.steps.step_claim(
        worker_id="micro", actions=[ACTION], unsafe=[], limit=BATCH, lease_s=30.0
    )
    if not rows:
        raise SystemExit("nothing to claim: prepare first")
    lease = 30.0

    if answers == "messages":
        if not hasattr(servicer, "_claimed"):
            raise SystemExit("--answers messages: this server has no servicer._claimed")

        def claimed() -> Any:
            steps = [servicer._claimed(r, lease) for r in rows]
            return worker_service_pb2.ClaimResponse(steps=steps, blocked=[])

    else:
        from service.api import build, wire

        def claimed() -> Any:
            servicer.claims.handed_out(rows, lease)
            return wire.claim_response(rows, build.rare_parts)

    steps = list(claimed().steps)
    many = worker_service_pb2.CompleteManyRequest.FromString(_complete_bytes(steps))
    items = list(many.completions)

    def completion() -> None:
        for c in items:
            servicer._completion(c)

    from service.db import completion as db_completion

    outcomes = [servicer._completion(c) for c in items]

    def dumped() -> None:
        if answers == "messages":
            db_completion._dump_items(db_completion._outcome_items(outcomes))
        else:
            db_completion.outcomes_json(outcomes)

    parts = {"claim answer": claimed, "_completion": completion, "items json": dumped}
    if only is not None:
        # For callgrind: run one part ``number`` times over the batch, untimed.
        for _ in range(number):
            parts[only]()
        parts = {}
    for name, fn in parts.items():
        best = min(timeit.repeat(fn, number=number, repeat=7, timer=time.process_time))
        print(f"{name:12} {best / number / len(rows) * 1e6:6.2f} µs/step")
    await store.steps.steps_release(rows)
    await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("what", choices=["prepare", "run", "micro"])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--input", choices=["none", "flow"], default="none")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--number", type=int, default=200)
    parser.add_argument("--batch", type=int, default=BATCH, help="run: steps per claim")
    parser.add_argument(
        "--profile", type=int, default=0, help="run: print the N costliest functions (cProfile)"
    )
    parser.add_argument(
        "--only",
        choices=["claim answer", "_completion", "items json"],
        help="micro: run only this part, --number times, untimed (for callgrind)",
    )
    parser.add_argument(
        "--answers",
        choices=["wire", "messages"],
        default="wire",
        help="micro: how the server builds its answers: claim answers written as protobuf "
        "bytes and completion items as one JSON text (wire, this tree), or one ClaimedStep "
        "message per step and items dumped one by one (messages, a server with "
        "servicer._claimed)",
    )
    args = parser.parse_args()
    if args.what == "prepare":
        prepare(args.runs, args.input == "flow")
        return
    url = _db(admin_url(), DATABASE)
    if args.what == "run" and args.profile:
        import cProfile
        import pstats

        profile = cProfile.Profile(time.process_time)
        profile.runcall(asyncio.run, _run(url, args.steps, args.batch))
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
    elif args.what == "run":
        asyncio.run(_run(url, args.steps, args.batch))
    else:
        asyncio.run(_micro(url, args.number, args.only, args.answers))
    os._exit(0)  # the embedded Postgres keeps running for the next call


if __name__ == "__main__":
    main()
