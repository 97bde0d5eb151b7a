"""`make bench-tags`: ListRuns and CountRuns by tag with 1,000,000 runs in the tables.

Loads finished runs of one step each straight into the tables as `make bench-console`
does (spread over 30 days, three workflows, a tenth cancelled), nine in ten of them
tagged: ``env`` (two values, half the runs each), ``team`` (five values), ``batch``
(500 values, 2,000 runs each) and ``customer`` (20,000 values, 50 runs each); then
times ListRuns (a page of 50) and CountRuns (the console's limit, 1,000) through gRPC
on loopback with tag filters: selective ones alone and with a status, a workflow or a
second tag, a later page, and a common tag for comparison. Reports p50 and p95 in ms
per call (target for a selective tag: p95 under 50 ms), the plans (EXPLAIN ANALYZE) of
the named queries and the machine's load average during the calls.

Writes bench/results/tags.json (--out); --reuse times the runs the last run loaded.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import grpc

from bench import Server  # bench/bench.py
from console_bench import arguments, loaded_database, plans  # bench/console_bench.py
from cyclone.v1 import types_pb2
from cyclone.v1 import workflow_service_pb2 as W
from cyclone.v1 import workflow_service_pb2_grpc as WG

CANCELLED = types_pb2.RUN_STATUS_CANCELLED

#: Each call timed: ListRuns or CountRuns and its request's fields.
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "ListRuns, a customer (50 runs)": ("list", {"tags": {"customer": "c123"}}),
    "ListRuns, a batch (2,000 runs)": ("list", {"tags": {"batch": "b7"}}),
    "ListRuns, a batch, the next page": ("list", {"tags": {"batch": "b7"}, "next": True}),
    "ListRuns, a batch and a team": ("list", {"tags": {"batch": "b7", "team": "blue"}}),
    "ListRuns, a batch, cancelled": ("list", {"tags": {"batch": "b10"}, "statuses": [CANCELLED]}),
    "ListRuns, a batch, one workflow": ("list", {"tags": {"batch": "b7"}, "workflow": "orders"}),
    "ListRuns, a common tag (half the runs)": ("list", {"tags": {"env": "prod"}}),
    "CountRuns, a customer": ("count", {"tags": {"customer": "c123"}}),
    "CountRuns, a batch": ("count", {"tags": {"batch": "b7"}}),
    "CountRuns, a batch and a team, one workflow": (
        "count",
        {"tags": {"batch": "b7", "team": "blue"}, "workflow": "emails"},
    ),
    "CountRuns, a common tag (half the runs)": ("count", {"tags": {"env": "prod"}}),
}

#: The plans shown: the named query and its parameters (unset ones are NULL).
PLANS: dict[str, tuple[str, dict[str, Any]]] = {
    "ListRuns, a customer": (
        "runs_list_tagged",
        {"tags": '{"customer": "c123"}', "tag_key": "customer", "tag_value": "c123"},
    ),
    "ListRuns, a batch, cancelled": (
        "runs_list_tagged",
        {
            "tags": '{"batch": "b10"}',
            "tag_key": "batch",
            "tag_value": "b10",
            "statuses": ["cancelled"],
        },
    ),
    "ListRuns, a batch, one workflow": (
        "runs_list_tagged",
        {"tags": '{"batch": "b7"}', "tag_key": "batch", "tag_value": "b7", "workflow": "orders"},
    ),
    "ListRuns, a common tag": (
        "runs_list_tagged",
        {"tags": '{"env": "prod"}', "tag_key": "env", "tag_value": "prod"},
    ),
    "CountRuns, a batch": (
        "runs_count_tag_whole",
        {"tags": '{"batch": "b7"}', "tag_key": "batch", "tag_value": "b7"},
    ),
    "CountRuns, a common tag": (
        "runs_count_tagged",
        {"tags": '{"env": "prod"}', "tag_key": "env", "tag_value": "prod"},
    ),
}


def timed(stub: WG.WorkflowServiceStub, kind: str, fields: dict[str, Any], n: int) -> Any:
    fields = dict(fields)
    token = ""
    if fields.pop("next", False):
        token = stub.ListRuns(W.ListRunsRequest(page_size=50, **fields)).next_page_token
        assert token
    took = []
    found = 0
    for i in range(n + 3):
        start = time.perf_counter()
        if kind == "list":
            reply = stub.ListRuns(W.ListRunsRequest(page_size=50, page_token=token, **fields))
            found = len(reply.runs)
        else:
            counted = stub.CountRuns(W.CountRunsRequest(limit=1000, **fields))
            found = sum(c.count for c in counted.counts)
        if i >= 3:  # warm-up
            took.append((time.perf_counter() - start) * 1000)
    q = statistics.quantiles(sorted(took), n=100)
    return {"p50": round(q[49], 1), "p95": round(q[94], 1), "n": n, "found": found}


def main() -> None:
    args = arguments(__doc__, 100, "cyclone_tags_bench", "tags.json")
    database_url = loaded_database(args, tagged=True)
    server = Server(database_url)
    try:
        results: dict[str, Any] = {"runs_loaded": args.runs, "calls_ms": {}}
        with grpc.insecure_channel(server.address) as channel:
            stub = WG.WorkflowServiceStub(channel)
            for name, (kind, fields) in CALLS.items():
                results["calls_ms"][name] = timed(stub, kind, fields, args.requests)
                print(f"{name:45} {results['calls_ms'][name]}", flush=True)
        results["load_average"] = os.getloadavg()
        results["plans"] = plans(database_url, PLANS)
        for title, plan in results["plans"].items():
            took = next((line for line in plan if line.startswith("Execution Time")), "")
            print(f"plan of {title}: {took}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.out}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
