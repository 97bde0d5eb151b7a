"""Server logs: with --log-json every line is one JSON object, every line about a step
names its run_id, node and attempt, and a blocked run is a warning, not an error."""

from __future__ import annotations

import json

import psycopg

from tests.helpers import claim, complete, eventually, fail, node, submit, workflow
from tests.test_processes import stubs


def entries(server) -> list[dict]:
    lines = [line for line in list(server.output) if line.startswith("{")]
    return [json.loads(line) for line in lines]


def test_json_logs_name_each_steps_run_node_and_attempt(server_process, database_url):
    server = server_process("--log-json", "--log-level", "DEBUG", "--sweep-interval", "0.05")
    s = stubs(server.address)
    run_id = submit(
        s,
        workflow(
            "w",
            node("a"),
            node("pay", action="charge"),
            node("flaky", action="flaky", max_attempts=1),
            node("after", deps=["pay"]),
        ),
    )
    [a] = claim(s)
    complete(s, a)
    [flaky] = claim(s, "flaky")
    fail(s, flaky, "broken")  # out of attempts: discarded
    claim(s, "charge", unsafe=("charge",), lease=5)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE cyclone.clock SET offset_by = offset_by + interval '6 seconds'")
        eventually(
            lambda: conn.execute(
                "SELECT count(*) FROM cyclone.step_errors WHERE kind = 'lease_expired'"
            ).fetchone()[0],
            "the sweep to reclaim the lease",
        )
    assert claim(s, "charge", unsafe=("charge",)) == []  # blocks the run instead

    def blocked_line():
        return [e for e in entries(server) if "blocked" in e["msg"] and e.get("node") == "pay"]

    [blocked] = eventually(blocked_line, "the blocked run's log line")
    assert blocked["level"] == "warning"
    assert blocked["run_id"] == run_id and blocked["attempt"] == 1

    about_steps = [e for e in entries(server) if "node" in e]
    assert about_steps, entries(server)
    for entry in about_steps:
        assert entry["run_id"] == run_id, entry
        assert isinstance(entry.get("attempt"), int), entry
    # Lapsed before its deadline: the worker was lost (a recovery, not an attempt).
    expired = next(e for e in about_steps if "was lost (its lease lapsed)" in e["msg"])
    assert expired["level"] == "warning" and expired["node"] == "pay"
    discarded = next(e for e in about_steps if "discarded" in e["msg"])
    assert discarded["level"] == "error" and discarded["node"] == "flaky"
    assert discarded["attempt"] == 1
    completed = [e["msg"] for e in about_steps if e["node"] == "a" and e["level"] == "debug"]
    assert any(m.startswith("completed") for m in completed), completed
    assert not [e for e in entries(server) if e["level"] == "error" and "blocked" in e["msg"]]
