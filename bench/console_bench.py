"""`make bench-console`: the console's pages with 1,000,000 runs in the tables.

Loads finished runs straight into the tables (spread over 30 days, three workflows,
a tenth of them cancelled, a tenth with a SubmitOnce key), submits a hundred running
runs through gRPC and has a worker claim some of their steps and fail some (so that
steps run, back off and lose leases), then times the console's pages as a browser asks
for them (HTTP on loopback: the console's handler and its gRPC calls to the server).
Reports p50 and p95 in ms per page (target: p95 under 100 ms), the plans (EXPLAIN
ANALYZE) of the named queries behind the pages, ListRuns', CountRuns', ListSteps' and
ListWorkers', for each filter, and the sequential scans of the runs and steps tables
during the measurements (target: none).

Writes bench/results/console.json (--out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.dialects import postgresql

from bench import RESULTS, Server, admin_url, fresh_database  # bench/bench.py
from console import serve
from pyclient.client import Client
from pyclient.workflow import Workflow
from service.db.pool import Q

WORKFLOWS = ("orders", "reports", "emails")


#: The tags of --tagged runs (tags_bench.py): nine runs in ten carry ``env`` (two
#: values, half the runs each), ``team`` (five values), ``batch`` (500 values, 2,000 runs
#: each in a million) and ``customer`` (20,000 values, 50 runs each in a million).
TEAMS = ("red", "green", "blue", "gold", "grey")


def load(database_url: str, runs: int, tagged: bool = False) -> None:
    """Finished runs of one step each, inserted in batches by SQL; with ``tagged``,
    tagged as TEAMS says."""
    batch = 100_000
    with psycopg.connect(database_url, autocommit=True) as conn:
        for start in range(0, runs, batch):
            conn.execute(
                """
                WITH r AS (
                    INSERT INTO cyclone.runs (run_id, workflow, status, steps_total, steps_open,
                                              created_at, updated_at, finished_at, submit_key,
                                              tags)
                    SELECT gen_random_uuid(), (%s::text[])[1 + i %% 3],
                           CASE WHEN i %% 10 = 0 THEN 'cancelled' ELSE 'completed' END, 1, 0,
                           now() - make_interval(secs => 30 * 86400.0 * i / %s::int),
                           now(), now(), CASE WHEN i %% 10 = 1 THEN 'key-' || i END,
                           CASE WHEN %s AND i %% 10 <> 5 THEN jsonb_build_object(
                               'env', CASE WHEN i %% 2 = 0 THEN 'prod' ELSE 'staging' END,
                               'team', (%s::text[])[1 + i %% 5],
                               'batch', 'b' || (i %% 500),
                               'customer', 'c' || (i %% 20000)) END
                      FROM generate_series(%s::int, %s::int) i
                    RETURNING run_id, status, created_at, tags),
                t AS (
                    INSERT INTO cyclone.run_tags (run_id, key, value, created_at)
                    SELECT r.run_id, e.key, e.value, r.created_at
                      FROM r, jsonb_each_text(r.tags) e)
                INSERT INTO cyclone.steps (run_id, node, position, action, status, trigger_rule,
                    depends_on, dependents, deps_open, attempt, max_attempts, attempt_budget,
                    initial_backoff, max_backoff, backoff_multiplier, timeout, output,
                    started_at, finished_at)
                SELECT run_id, 'only', 0, 'work', status, 'all_success', '{}', '{}', 0, 1,
                       3, 3, '1s', '5m', 2, '5m',
                       CASE WHEN status = 'completed' THEN 'null'::jsonb END, created_at, created_at
                  FROM r
                """,
                (list(WORKFLOWS), runs, tagged, list(TEAMS), start + 1, min(start + batch, runs)),
            )
            print(f"loaded {min(start + batch, runs):,} runs", flush=True)
        conn.execute("VACUUM ANALYZE cyclone.runs")
        conn.execute("VACUUM ANALYZE cyclone.steps")
        conn.execute("VACUUM ANALYZE cyclone.run_tags")


def seq_scans(database_url: str) -> dict[str, int]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT relname, seq_scan FROM pg_stat_user_tables "
            "WHERE schemaname = 'cyclone' AND relname IN ('runs', 'steps')"
        ).fetchall()
    return dict(rows)


#: Each plan shown: the named query and its parameters (unset ones are NULL).
PLANS: dict[str, tuple[str, dict[str, Any]]] = {
    "ListRuns, newest": ("runs_list", {}),
    "ListRuns, one workflow": ("runs_list", {"workflow": "reports"}),
    "ListRuns, one status": ("runs_list", {"statuses": ["cancelled"]}),
    "ListRuns, a key (no workflow)": ("runs_list", {"key": "key-500001"}),
    "ListRuns, a key prefix": ("runs_list", {"key_like": "key-5000%"}),
    "ListRuns, a workflow prefix": ("runs_list", {"workflows": ["reports"]}),
    "ListRuns, a run id prefix": (
        "runs_list",
        {
            "run_id_lo": "abc00000-0000-0000-0000-000000000000",
            "run_id_hi": "abcfffff-ffff-ffff-ffff-ffffffffffff",
        },
    ),
    "ListRuns, newer page": (
        "runs_list_newer",
        {
            "after_created": "2000-01-01T00:00:00+00:00",
            "after_run_id": "00000000-0000-0000-0000-000000000000",
        },
    ),
    "ListRuns, workflow names of a prefix": ("runs_workflows", {"prefix": "rep"}),
    "CountRuns, every status": ("runs_count", {}),
    "CountRuns, one workflow": ("runs_count", {"workflow": "reports"}),
    "CountRuns, a time range": (
        "runs_count",
        {"created_after": "-infinity", "created_before": "infinity"},
    ),
    "CountRuns, a key": ("runs_count", {"key": "key-500001"}),
    "CountRuns, a key prefix": ("runs_count", {"key_like": "key-5000%"}),
    "ListSteps, running": ("steps_list", {"kind": "running"}),
    "ListSteps, lease expired": ("steps_list", {"kind": "running", "lease_expired": True}),
    "ListSteps, backing off": ("steps_list", {"kind": "backing_off"}),
    "ListSteps, ready (one action)": ("steps_list", {"kind": "ready", "action": "charge"}),
    "ListWorkers, workers seen": ("workers_seen_list", {}),
    "ListWorkers, running steps": ("workers_running", {}),
    "ListWorkers, actions": ("actions_activity", {}),
}


def plans(
    database_url: str, wanted: dict[str, tuple[str, dict[str, Any]]] = PLANS
) -> dict[str, list[str]]:
    """EXPLAIN ANALYZE of the named queries behind the pages, per filter, with the
    parameters the server sends (CountRuns' limit: the console's 1,000, plus one)."""
    found = {}
    statuses = ["running", "completed", "failed", "blocked", "cancelled"]
    with psycopg.connect(database_url) as conn:
        for title, (name, given) in wanted.items():
            limit = 1_001 if name.startswith("runs_count") else 51
            # The statement as the server sends it; its parameters, all unset (NULL).
            compiled = Q[name].compile(dialect=postgresql.psycopg.dialect())  # type: ignore[no-untyped-call]
            params = {**compiled.params, "limit": limit, "lease_expired": False, **given}
            if name.startswith("runs_count") and not params["statuses"]:
                params["statuses"] = statuses
            sql = str(compiled)
            rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}", params)
            found[title] = [r[0] for r in rows.fetchall()]
    return found


def plan_summary(plan: list[str]) -> str:
    """The scans of a plan and its execution time, on one line."""
    scans = [
        re.sub(r"\s+", " ", line.strip().removeprefix("->").strip())
        for line in plan
        if re.search(r"(Index Only Scan|Index Scan|Seq Scan|Bitmap Heap Scan) ", line)
    ]
    took = next((line for line in plan if line.startswith("Execution Time")), "")
    return f"{took}; " + "; ".join(dict.fromkeys(scans))


def busy(address: str) -> None:
    """A worker claims 60 of the submitted runs' first steps and fails 20 of them with
    an hour's backoff: steps running (their leases run out during the bench, as the
    sweep may not reclaim them yet) and steps backing off."""
    import grpc

    from cyclone.v1 import worker_service_pb2 as w
    from cyclone.v1 import worker_service_pb2_grpc as wg

    with grpc.insecure_channel(address) as channel:
        stub = wg.WorkerServiceStub(channel)
        claimed = stub.Claim(
            w.ClaimRequest(
                worker_id="bench-worker-1", actions=[w.ActionSpec(name="charge")], max_steps=60
            )
        ).steps
        for step in claimed[:20]:
            failure = w.Failure(message="card network down", type="TimeoutError")
            failure.retry_after.FromSeconds(3600)
            stub.Complete(
                w.CompleteRequest(
                    run_id=step.run_id,
                    node=step.node,
                    lease_token=step.lease_token,
                    failure=failure,
                )
            )


def timed(url: str, n: int) -> dict[str, float]:
    took = []
    for i in range(n + 3):
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as reply:
            reply.read()
            assert reply.status == 200, reply.status
        if i >= 3:  # warm-up
            took.append((time.perf_counter() - start) * 1000)
    q = statistics.quantiles(sorted(took), n=100)
    return {"p50": round(q[49], 1), "p95": round(q[94], 1), "n": n}


def arguments(doc: str | None, requests: int, database: str, out: str) -> argparse.Namespace:
    """The options of a bench with 1,000,000 runs loaded (this one's, tags_bench.py's)."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=requests, help="timed requests each")
    parser.add_argument("--database", default=database)
    parser.add_argument("--url", default=None, help="a superuser URL of the Postgres to use")
    parser.add_argument("--out", type=Path, default=RESULTS / out)
    parser.add_argument(
        "--reuse", action="store_true", help="time the runs loaded by the last run (no load)"
    )
    return parser.parse_args()


def loaded_database(args: argparse.Namespace, tagged: bool = False) -> str:
    """The bench's database: made afresh, migrated and loaded with --runs runs, or with
    --reuse the one the last run loaded."""
    from service.migrate import migrate

    admin = admin_url(args.url)
    if args.reuse:
        return re.sub(
            r"(postgres(?:ql)?://[^/]*/)([^?]*)", rf"\g<1>{args.database}", admin, count=1
        )
    database_url = fresh_database(admin, args.database)
    migrate(database_url)
    load(database_url, args.runs, tagged)
    return database_url


def main() -> None:
    args = arguments(__doc__, 40, "cyclone_console_bench", "console.json")

    database_url = loaded_database(args)
    server = Server(database_url)
    ready = threading.Event()
    urls: list[str] = []
    loop = asyncio.new_event_loop()

    def started(url: str) -> None:
        urls.append(url.rstrip("/"))
        ready.set()

    async def run_console() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await serve(server.address, "127.0.0.1:0", started=started)

    console = loop.create_task(run_console())
    threading.Thread(target=loop.run_until_complete, args=(console,), daemon=True).start()
    try:
        assert ready.wait(30), "the console did not start"
        with Client(server.address) as client:
            wf = Workflow("orders")
            wf.node("ship", depends_on=wf.node("charge"))
            running = [client.submit(wf, {"i": i}) for i in range(100)]
            old = next(iter(client.list_runs(status="cancelled", page_size=1).runs)).run_id
            busy(server.address)
            # A page deep in the list, and the page of newer runs before it.
            deep = client.list_runs(page_size=50, page_token="")
            for _ in range(20):
                deep = client.list_runs(page_size=50, page_token=deep.next_page_token)
            pages_at = (deep.next_page_token, deep.prev_page_token)
            every = Workflow("reports")
            every.node("build")
            client.create_schedule("hourly-report", every, cron="0 * * * *")
        base = urls[0]
        pages = {
            "runs (first page)": "/runs",
            "counts by status": "/runs/counts",
            "counts of one workflow": "/runs/counts?workflow=reports",
            "counts in a time range": "/runs/counts?after=2000-01-01T00:00&before=2100-01-01T00:00",
            "runs live refresh": "/runs/live",
            "runs of one workflow": "/runs?workflow=reports",
            "cancelled runs": "/runs?status=cancelled",
            "runs in a time range": "/runs?after=2000-01-01T00:00&before=2100-01-01T00:00",
            "runs by key (no workflow)": "/runs?key=key-500001&match=exact",
            "runs by key prefix": "/runs?key=key-5000",
            "runs by workflow prefix": "/runs?workflow=rep",
            "runs by run id prefix": f"/runs?run={old[:4]}",
            "runs by whole run id": f"/runs?run={old}",
            "runs, an older page": f"/runs?page={pages_at[0]}",
            "runs, a newer page": f"/runs?page={pages_at[1]}",
            "a running run": f"/runs/{running[-1]}?node=charge",
            "a finished run": f"/runs/{old}?node=only",
            "needs a person": "/attention",
            "workers": "/workers",
            "schedules": "/schedules",
        }
        before = seq_scans(database_url)
        results: dict[str, Any] = {"runs_loaded": args.runs, "pages_ms": {}}
        for name, path in pages.items():
            results["pages_ms"][name] = timed(base + path, args.requests)
            print(f"{name:32} {results['pages_ms'][name]}", flush=True)
        time.sleep(2)  # the statistics reach pg_stat_user_tables within a second
        after = seq_scans(database_url)
        results["seq_scans_during_pages"] = {t: after[t] - before[t] for t in after}
        results["plans"] = plans(database_url)
        for title, plan in results["plans"].items():
            print(f"plan of {title}: {plan_summary(plan)}")
        print("sequential scans during the pages:", results["seq_scans_during_pages"])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.out}")
    finally:
        loop.call_soon_threadsafe(console.cancel)
        server.stop()


if __name__ == "__main__":
    main()
