"""Invalid workflows and submit arguments, each refused by Submit (or SubmitOnce) and by
cyclone.submit alike: one table, written in the JSON shape of a workflow file, which
cyclone.submit takes as it is and as_proto turns into the Workflow message the server
takes (without the SDK's own checks, so that the server sees the invalid value)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from cyclone.v1 import types_pb2
from tests.helpers import RULES, seconds, value


@dataclass(frozen=True)
class Case:
    name: str
    workflow: dict[str, Any]
    #: A part of the message both give (most often all of it).
    message: str
    run_input: Any = None
    #: cyclone.submit's other arguments (key, priority, start_at, deadline), SubmitOnce
    #: with a key.
    args: dict[str, Any] = field(default_factory=dict)
    #: The status Submit answers.
    code: str = "INVALID_ARGUMENT"


def one(**settings: Any) -> dict[str, Any]:
    """Workflow "w" of one node "a" with these settings."""
    return {"name": "w", "nodes": [{"name": "a", **settings}]}


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


#: A start time and a deadline before it (with microseconds, which both write).
_START = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(days=10)
_DEADLINE = _START - dt.timedelta(days=1, microseconds=-250000)

CASES = [
    Case(
        "bad workflow name",
        {"name": "9w", "nodes": [{"name": "a"}]},
        "workflow name '9w' is invalid: use letters, digits and _ . : - and start with a "
        "letter or _",
    ),
    Case("empty workflow name", {"name": "", "nodes": [{"name": "a"}]}, "workflow name is empty"),
    Case("no nodes", {"name": "w", "nodes": []}, "workflow 'w' has no nodes"),
    Case("bad node name", {"name": "w", "nodes": [{"name": "a b"}]}, "node name 'a b' is invalid"),
    Case(
        "long node name",
        {"name": "w", "nodes": [{"name": "n" * 129}]},
        "node name 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn'... (cut: 129 characters) is 129 "
        "characters; the limit is 128",
    ),
    Case(
        "node twice",
        {"name": "w", "nodes": [{"name": "a"}, {"name": "a"}]},
        "node 'a' is defined twice",
    ),
    Case("bad action", one(action="do it"), "node 'a': action name 'do it' is invalid"),
    Case(
        "reserved action",
        one(action="cyclone.event"),
        "node 'a': action names starting with 'cyclone.' are the server's own",
    ),
    Case(
        "unknown upstream",
        {"name": "w", "nodes": [{"name": "a", "depends_on": ["x"]}]},
        "node 'a' depends on unknown node 'x'",
    ),
    Case(
        "depends on itself",
        {"name": "w", "nodes": [{"name": "a", "depends_on": ["a"]}]},
        "node 'a' depends on itself",
    ),
    Case(
        "dependency twice",
        {"name": "w", "nodes": [{"name": "b"}, {"name": "a", "depends_on": ["b", "b"]}]},
        "node 'a' lists dependency 'b' twice",
    ),
    Case(
        "cycle",
        {
            "name": "w",
            "nodes": [
                {"name": "a", "depends_on": ["c"]},
                {"name": "b", "depends_on": ["a"]},
                {"name": "c", "depends_on": ["b"]},
            ],
        },
        "is part of a cycle: ",
    ),
    Case("unknown trigger rule", one(trigger_rule="sometimes"), "node 'a': unknown trigger rule"),
    Case(
        "max_attempts",
        one(retry={"max_attempts": 101}),
        "node 'a': max_attempts must be between 1 and 100, got 101",
    ),
    Case(
        "short timeout",
        one(timeout=0.5),
        "node 'a': timeout must be between 1s and 604800s, got 0.5s",
    ),
    Case(
        "long timeout",
        one(timeout=700000),
        "node 'a': timeout must be between 1s and 604800s, got 700000s",
    ),
    Case(
        "negative backoff",
        one(retry={"initial_backoff": -1}),
        "node 'a': initial_backoff must be between 0s and 86400s, got -1s",
    ),
    Case(
        "max_backoff under initial_backoff",
        one(retry={"initial_backoff": 10, "max_backoff": 5}),
        "node 'a': max_backoff must be between initial_backoff and 86400s, got 5s",
    ),
    Case(
        "multiplier",
        one(retry={"multiplier": 11}),
        "node 'a': backoff_multiplier must be between 1 and 10, got 11",
    ),
    Case(
        "node priority",
        one(priority=2_000_000),
        "node 'a': priority must be between -1000000 and 1000000, got 2000000",
    ),
    Case(
        "concurrency key not a field",
        one(concurrency={"key": "k{x}", "limit": 1}),
        "node 'a': concurrency key 'k{x}': '{x}' at 1 is not a field",
    ),
    Case(
        "lone brace",
        one(concurrency={"key": "k}", "limit": 1}),
        "node 'a': concurrency key 'k}': '}' at 1 is not a field",
    ),
    Case(
        "empty concurrency key",
        one(concurrency={"key": "", "limit": 1}),
        "node 'a': concurrency key is empty",
    ),
    Case(
        "concurrency limit",
        one(concurrency={"key": "k", "limit": 0}),
        "node 'a': concurrency limit must be between 1 and 10000, got 0",
    ),
    Case(
        "key field missing",
        one(concurrency={"key": "c:{run.customer}", "limit": 1}),
        "node 'a': concurrency key field {run.customer} is missing from the run input",
        run_input={"client": 1},
    ),
    Case(
        "key field a list",
        one(concurrency={"key": "c:{run.customer}", "limit": 1}),
        "node 'a': concurrency key field {run.customer} must be a string, a number or a "
        "boolean, got list",
        run_input={"customer": [1]},
    ),
    Case(
        "event with an action",
        one(event="paid", action="pay"),
        "node 'a' waits for an event: it takes no action and no input",
    ),
    Case(
        "event name empty",
        one(event=""),
        "node 'a': an event name must be 1 to 200 printable characters, got ''",
    ),
    Case(
        "event timeout",
        one(event="paid", event_timeout=0),
        "node 'a': an event timeout must be between 1ms and 366 days, got 0s",
    ),
    Case(
        "node input too deep",
        one(input=nested(32)),
        "node 'a' input is nested more than 32 levels deep",
    ),
    Case(
        "run input too deep",
        one(),
        "run input is nested more than 32 levels deep",
        run_input=nested(32),
    ),
    Case(
        "run input too large",
        one(),
        "run input is ",
        run_input={"blob": "x" * (1 << 20)},
        code="RESOURCE_EXHAUSTED",
    ),
    Case(
        "too many nodes",
        {"name": "w", "nodes": [{"name": f"n{i}"} for i in range(5001)]},
        "workflow 'w' has 5001 nodes; the limit is 5000",
    ),
    Case(
        "too many dependencies",
        {
            "name": "w",
            "nodes": [{"name": f"n{i}"} for i in range(1001)]
            + [{"name": "sink", "depends_on": [f"n{i}" for i in range(1001)]}],
        },
        "node 'sink' has 1001 dependencies; the limit is 1000",
    ),
    Case(
        "too many dependents",
        {
            "name": "w",
            "nodes": [{"name": "root"}]
            + [{"name": f"n{i}", "depends_on": ["root"]} for i in range(1001)],
        },
        "node 'root' has 1001 dependents; the limit is 1000",
    ),
    Case(
        "run priority",
        one(),
        "run: priority must be between -1000000 and 1000000, got 2000000",
        args={"priority": 2_000_000},
    ),
    Case(
        "start_at too far",
        one(),
        "start_at is 400 days ahead; the limit is 366 days",
        args={"start_at": dt.datetime.now(dt.UTC) + dt.timedelta(days=400)},
    ),
    Case(
        "deadline past",
        one(),
        "deadline 2020-01-01T00:00:00+00:00 is not in the future (now ",
        args={"deadline": dt.datetime(2020, 1, 1, tzinfo=dt.UTC)},
    ),
    Case(
        "deadline too far",
        one(),
        "deadline is 400 days ahead; the limit is 366 days",
        args={"deadline": dt.datetime.now(dt.UTC) + dt.timedelta(days=400, hours=1)},
    ),
    Case(
        "deadline before start",
        one(),
        f"deadline {_DEADLINE.isoformat()} is not after start_at {_START.isoformat()}",
        args={"start_at": _START, "deadline": _DEADLINE},
    ),
    Case("empty key", one(), "submit key is empty", args={"key": ""}),
    Case(
        "long key", one(), "submit key is 257 characters; the limit is 256", args={"key": "k" * 257}
    ),
]


def as_proto(wf: dict[str, Any]) -> types_pb2.Workflow:
    """The Workflow message of a workflow in the JSON shape, as an SDK would send it
    (a node's action defaults to its name), with no check of its values."""
    out = types_pb2.Workflow(name=wf["name"])
    for raw in wf["nodes"]:
        n = out.nodes.add(name=raw["name"], depends_on=raw.get("depends_on", []))
        n.trigger_rule = RULES.get(raw.get("trigger_rule", "all_success"), 99)  # type: ignore[assignment]
        if "event" in raw:
            n.event.SetInParent()
            n.event.name = raw["event"]
            n.action = raw.get("action", "")
            if "event_timeout" in raw:
                n.event.timeout.CopyFrom(seconds(raw["event_timeout"]))
        else:
            n.action = raw.get("action", raw["name"])
        retry = raw.get("retry", {})
        if "max_attempts" in retry:
            n.retry.max_attempts = retry["max_attempts"]
        for key, name in (("initial_backoff", "initial_backoff"), ("max_backoff", "max_backoff")):
            if key in retry:
                getattr(n.retry, name).CopyFrom(seconds(retry[key]))
        if "multiplier" in retry:
            n.retry.backoff_multiplier = retry["multiplier"]
        if "timeout" in raw:
            n.timeout.CopyFrom(seconds(raw["timeout"]))
        if "input" in raw:
            n.input.CopyFrom(value(raw["input"]))
        if "priority" in raw:
            n.priority = raw["priority"]
        if "concurrency" in raw:
            n.concurrency.key = raw["concurrency"]["key"]
            n.concurrency.limit = raw["concurrency"]["limit"]
    return out
