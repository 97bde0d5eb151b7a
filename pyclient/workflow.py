"""Workflow definitions in Python: a named DAG of nodes, built in code or from a dict.

    wf = Workflow("order")
    charge = wf.node("charge", timeout=30, retry=RetryPolicy(max_attempts=5))
    receipt = wf.node("receipt", action="send_receipt", depends_on=[charge])
    wf.node("audit", depends_on=[receipt], trigger_rule="all_done")
    wf.node("ship", priority=10, concurrency=Concurrency("customer:{run.customer}", 2))

A node's action defaults to its name. Durations are seconds (int or float) or
``timedelta``. Settings left as ``None`` take the server's defaults. ``validate()``
runs the checks the server runs (cyclone.dag), so an invalid definition is refused
before the network call with the server's own message.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import duration_pb2

from cyclone import dag
from cyclone.jsonvalue import to_value
from cyclone.v1 import types_pb2
from pyclient.errors import InvalidArgument

Seconds = float | int | dt.timedelta

_TRIGGER_RULES = {
    "all_success": types_pb2.TRIGGER_RULE_ALL_SUCCESS,
    "all_done": types_pb2.TRIGGER_RULE_ALL_DONE,
    "one_failed": types_pb2.TRIGGER_RULE_ONE_FAILED,
}


def seconds(value: Seconds | None) -> float | None:
    """``value`` in seconds; timedeltas are converted, None stays None."""
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"a duration must be seconds or a timedelta, got {value!r}")
    return float(value)


def duration(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(value * 1e9))
    return d


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a node's failures are retried; ``None`` fields take the server's defaults."""

    max_attempts: int | None = None
    initial_backoff: float | None = None
    max_backoff: float | None = None
    multiplier: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "initial_backoff", seconds(self.initial_backoff))
        object.__setattr__(self, "max_backoff", seconds(self.max_backoff))

    def to_proto(self) -> types_pb2.RetryPolicy:
        p = types_pb2.RetryPolicy()
        if self.max_attempts is not None:
            p.max_attempts = self.max_attempts
        if self.initial_backoff is not None:
            p.initial_backoff.CopyFrom(duration(self.initial_backoff))
        if self.max_backoff is not None:
            p.max_backoff.CopyFrom(duration(self.max_backoff))
        if self.multiplier is not None:
            p.backoff_multiplier = self.multiplier
        return p


@dataclass(frozen=True, slots=True)
class Concurrency:
    """At most ``limit`` steps with the same key run at once (docs/flow-control.md).
    ``key`` is a template evaluated once per run, when it is created (submit, a child's
    start, or create_schedule for all its firings): ``{run.a.b}`` is a field of the run
    input, ``{node.a}`` one of the node's input, ``{{`` and ``}}`` are braces."""

    key: str
    limit: int


@dataclass(frozen=True, slots=True)
class Node:
    """A vertex of the DAG. Build it with :meth:`Workflow.node`."""

    name: str
    action: str
    depends_on: tuple[str, ...] = ()
    trigger_rule: str = "all_success"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout: float | None = None
    input: Any = None
    #: A node that waits for this event, served by the server (no action, no worker).
    event: str | None = None
    #: How long it waits, in seconds (None: no limit); then it is discarded.
    event_timeout: float | None = None
    priority: int | None = None
    concurrency: Concurrency | None = None

    def spec(self) -> dag.NodeSpec:
        """The node with the server's defaults applied, as cyclone.dag checks it."""
        r = self.retry
        return dag.NodeSpec(
            name=self.name,
            action=self.action,
            depends_on=self.depends_on,
            trigger_rule=self.trigger_rule,
            max_attempts=_or(r.max_attempts, dag.DEFAULT_MAX_ATTEMPTS),
            initial_backoff_s=_or(r.initial_backoff, dag.DEFAULT_INITIAL_BACKOFF_S),
            max_backoff_s=_or(r.max_backoff, dag.DEFAULT_MAX_BACKOFF_S),
            backoff_multiplier=_or(r.multiplier, dag.DEFAULT_BACKOFF_MULTIPLIER),
            timeout_s=_or(self.timeout, dag.DEFAULT_TIMEOUT_S),
            input=self.input,
            priority=self.priority,
            concurrency_key=self.concurrency.key if self.concurrency else None,
            concurrency_limit=self.concurrency.limit if self.concurrency else None,
        )

    def to_proto(self) -> types_pb2.Node:
        p = types_pb2.Node(
            name=self.name,
            action="" if self.event is not None else self.action,
            depends_on=self.depends_on,
            trigger_rule=_TRIGGER_RULES[self.trigger_rule],
            retry=self.retry.to_proto(),
        )
        if self.timeout is not None:
            p.timeout.CopyFrom(duration(self.timeout))
        if self.event is not None:
            p.event.name = self.event
            if self.event_timeout is not None:
                p.event.timeout.CopyFrom(duration(self.event_timeout))
        if self.priority is not None:
            p.priority = self.priority
        if self.concurrency is not None:
            p.concurrency.key = self.concurrency.key
            p.concurrency.limit = self.concurrency.limit
        if self.input is not None:
            try:
                p.input.CopyFrom(to_value(self.input))
            except (TypeError, ValueError) as exc:
                raise InvalidArgument(f"node {self.name!r}: input is not JSON: {exc}") from None
        return p


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


NodeRef = Node | str

_NODE_KEYS = {
    "name",
    "action",
    "depends_on",
    "trigger_rule",
    "retry",
    "timeout",
    "input",
    "event",
    "event_timeout",
    "priority",
    "concurrency",
}
#: The action the server gives a node that waits for an event (service.waits).
EVENT_ACTION = "cyclone.event"
_RETRY_KEYS = {"max_attempts", "initial_backoff", "max_backoff", "multiplier"}


class Workflow:
    """A named DAG of nodes, sent whole with every submit."""

    def __init__(self, name: str, nodes: Iterable[Node] = ()):
        self.name = name
        self._nodes: list[Node] = list(nodes)

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, nodes={[n.name for n in self._nodes]})"

    @property
    def nodes(self) -> tuple[Node, ...]:
        return tuple(self._nodes)

    def node(
        self,
        name: str,
        action: str | None = None,
        *,
        depends_on: Iterable[NodeRef] | NodeRef = (),
        trigger_rule: str = "all_success",
        retry: RetryPolicy | None = None,
        timeout: Seconds | None = None,
        input: Any = None,
        priority: int | None = None,
        concurrency: Concurrency | tuple[str, int] | None = None,
    ) -> Node:
        """Add a node and return it, to name it in a later node's ``depends_on``.

        ``action`` defaults to ``name``. ``trigger_rule`` is ``"all_success"`` (run
        when every upstream completed), ``"all_done"`` (run once every upstream has
        finished, whatever the outcome: cleanup) or ``"one_failed"`` (run only when an
        upstream failed: compensation). ``timeout`` caps each attempt and its lease.
        ``input`` is static JSON handed to the handler with the run input.
        ``priority`` overrides the run's (higher is claimed first); ``concurrency``
        (a :class:`Concurrency` or ``(key, limit)``) caps how many steps with its key run
        at once (docs/flow-control.md).
        """
        if isinstance(depends_on, Node | str):
            depends_on = [depends_on]
        node = Node(
            name=name,
            action=name if action is None else action,
            depends_on=tuple(d.name if isinstance(d, Node) else d for d in depends_on),
            trigger_rule=trigger_rule,
            retry=retry or RetryPolicy(),
            timeout=seconds(timeout),
            input=input,
            priority=priority,
            concurrency=Concurrency(*concurrency)
            if isinstance(concurrency, tuple)
            else concurrency,
        )
        self._nodes.append(node)
        return node

    def wait_for_event(
        self,
        name: str,
        event: str,
        *,
        timeout: Seconds | None = None,
        depends_on: Iterable[NodeRef] | NodeRef = (),
        trigger_rule: str = "all_success",
    ) -> Node:
        """Add a node that waits for the event ``event`` sent to the run
        (``client.send_event``), with no worker: the server completes it with the
        event's payload as its output (an event sent earlier counts), or discards it
        with ``EventTimeout`` after ``timeout`` so that ``one_failed`` nodes run."""
        if isinstance(depends_on, Node | str):
            depends_on = [depends_on]
        node = Node(
            name=name,
            action=EVENT_ACTION,
            depends_on=tuple(d.name if isinstance(d, Node) else d for d in depends_on),
            trigger_rule=trigger_rule,
            event=event,
            event_timeout=seconds(timeout),
        )
        self._nodes.append(node)
        return node

    def validate(self) -> None:
        """Raise InvalidArgument, with the server's message, when the DAG is invalid."""
        try:
            dag.validate_workflow(self.name, [n.spec() for n in self._nodes])
        except dag.InvalidWorkflow as exc:
            raise InvalidArgument(str(exc)) from None

    def to_proto(self) -> types_pb2.Workflow:
        """The protobuf Workflow, after :meth:`validate`."""
        self.validate()
        return types_pb2.Workflow(name=self.name, nodes=[n.to_proto() for n in self._nodes])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Workflow:
        """Build from ``{"name": ..., "nodes": [{"name": ..., "action": ..., ...}]}``.

        Node keys are the arguments of :meth:`node`; ``retry`` is a mapping of
        ``max_attempts``, ``initial_backoff``, ``max_backoff``, ``multiplier``;
        ``concurrency`` one of ``key`` and ``limit``.
        """
        if not isinstance(data, Mapping):
            raise InvalidArgument("a workflow must be a mapping with 'name' and 'nodes'")
        name = data.get("name")
        nodes = data.get("nodes")
        if not isinstance(name, str):
            raise InvalidArgument("the workflow needs a 'name' string")
        if not isinstance(nodes, list):
            raise InvalidArgument(f"workflow {name!r} needs a 'nodes' list")
        wf = cls(name)
        for i, raw in enumerate(nodes):
            if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
                raise InvalidArgument(f"node #{i + 1} must be a mapping with a 'name' string")
            where = f"node {raw['name']!r}"
            _check_keys(where, raw, _NODE_KEYS)
            retry = raw.get("retry") or {}
            if not isinstance(retry, Mapping):
                raise InvalidArgument(f"{where}: 'retry' must be a mapping")
            _check_keys(f"{where}: retry", retry, _RETRY_KEYS)
            if raw.get("event") is not None:
                wf.wait_for_event(
                    raw["name"],
                    raw["event"],
                    timeout=raw.get("event_timeout"),
                    depends_on=raw.get("depends_on") or (),
                    trigger_rule=raw.get("trigger_rule") or "all_success",
                )
                continue
            limit = raw.get("concurrency")
            if limit is not None and not isinstance(limit, Mapping):
                raise InvalidArgument(f"{where}: 'concurrency' must be a mapping")
            if limit is not None:
                _check_keys(f"{where}: concurrency", limit, {"key", "limit"})
            wf.node(
                raw["name"],
                raw.get("action"),
                depends_on=raw.get("depends_on") or (),
                trigger_rule=raw.get("trigger_rule") or "all_success",
                retry=RetryPolicy(**retry),
                timeout=raw.get("timeout"),
                input=raw.get("input"),
                priority=raw.get("priority"),
                concurrency=(
                    Concurrency(limit.get("key", ""), limit.get("limit", 0)) if limit else None
                ),
            )
        return wf


def _check_keys(where: str, raw: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise InvalidArgument(
            f"{where}: unknown field {unknown[0]!r}; expected one of {sorted(allowed)}"
        )
