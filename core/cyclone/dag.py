"""Workflow validation shared by the SDK and the server.

The SDK checks a definition here before the network call, and the server checks it
here again, so a definition is refused with the very same message by either.
Everything here works on plain values; the SDK's Workflow and the server's protobuf
conversion both build :class:`NodeSpec` objects.
"""

from __future__ import annotations

import graphlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cyclone import flow
from cyclone.errors import InvalidWorkflow

__all__ = [
    "DEFAULT_BACKOFF_MULTIPLIER",
    "DEFAULT_INITIAL_BACKOFF_S",
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_BACKOFF_S",
    "DEFAULT_TIMEOUT_S",
    "EXCERPT_CHARS",
    "EXCERPT_NODES",
    "MAX_ATTEMPTS",
    "MAX_BACKOFF_MULTIPLIER",
    "MAX_BACKOFF_S",
    "MAX_BUILD_ID_LENGTH",
    "MAX_DEPENDENCIES",
    "MAX_DEPENDENTS",
    "MAX_EDGES",
    "MAX_NAME_LENGTH",
    "MAX_NODES",
    "MAX_SUBMIT_KEY_LENGTH",
    "MAX_TIMEOUT_S",
    "MIN_TIMEOUT_S",
    "NAME_PATTERN",
    "TRIGGER_RULES",
    "InvalidWorkflow",
    "Limits",
    "NodeSpec",
    "check_build_id",
    "check_edges",
    "check_name",
    "check_submit_key",
    "excerpt",
    "excerpt_path",
    "validate_workflow",
]

#: Names of workflows, nodes and actions: a letter or underscore, then letters,
#: digits and ``_ . : -``; 128 characters at most. Plain ASCII keeps names safe in
#: logs, metrics labels, URLs and shell commands, and rules out look-alike names.
NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}")
MAX_NAME_LENGTH = 128
MAX_NODES = 5_000
MAX_DEPENDENCIES = 1_000
#: Fan-out: most nodes that may depend on one node (completing it touches each).
MAX_DEPENDENTS = 1_000
#: Most dependency edges in one workflow, over all its nodes.
MAX_EDGES = 100_000
MAX_ATTEMPTS = 100
MAX_SUBMIT_KEY_LENGTH = 256
MIN_TIMEOUT_S = 1.0
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_BACKOFF_S = 24 * 3600.0
MAX_BACKOFF_MULTIPLIER = 10.0

TRIGGER_RULES = ("all_success", "all_done", "one_failed")

DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_INITIAL_BACKOFF_S = 1.0
DEFAULT_MAX_BACKOFF_S = 300.0
DEFAULT_BACKOFF_MULTIPLIER = 2.0


#: Most characters of a client's input that an error message quotes.
EXCERPT_CHARS = 40
#: Most nodes of a cycle that its error message names.
EXCERPT_NODES = 5


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """How an error message quotes a client's input: its repr when short, else the
    repr of its first ``limit`` characters marked as cut, with the full length.

    Every message that quotes input goes through here, so that no message grows with
    the input (a long one would exceed gRPC's metadata limit and hide the error).
    """
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... (cut: {len(text)} characters)"


def excerpt_path(names: Sequence[str], limit: int = EXCERPT_NODES) -> str:
    """A path of node names (``a -> b -> c``), at most ``limit`` of them shown."""
    shown = " -> ".join(excerpt(n) for n in names[:limit])
    if len(names) > limit:
        shown += f" -> ... (cut: {len(names)} nodes)"
    return shown


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits of one workflow. The SDK checks the defaults; a server checks the
    ones its settings give (--max-nodes, --max-dependencies, --max-dependents,
    --max-edges)."""

    max_nodes: int = MAX_NODES
    max_dependencies: int = MAX_DEPENDENCIES
    max_dependents: int = MAX_DEPENDENTS
    max_edges: int = MAX_EDGES


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node as validated and stored; defaults already applied."""

    name: str
    action: str
    depends_on: tuple[str, ...] = ()
    trigger_rule: str = "all_success"
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    initial_backoff_s: float = DEFAULT_INITIAL_BACKOFF_S
    max_backoff_s: float = DEFAULT_MAX_BACKOFF_S
    backoff_multiplier: float = DEFAULT_BACKOFF_MULTIPLIER
    timeout_s: float = DEFAULT_TIMEOUT_S
    input: Any = None
    dependents: tuple[str, ...] = field(default=(), compare=False)
    #: Claim priority; None: the run's (cyclone.flow).
    priority: int | None = None
    #: Concurrency key template and limit (cyclone.flow.KeyTemplate); both or neither.
    concurrency_key: str | None = None
    concurrency_limit: int | None = None


def check_name(kind: str, value: str) -> None:
    """Raise InvalidWorkflow unless ``value`` is a valid workflow, node or action name."""
    if not value:
        raise InvalidWorkflow(f"{kind} name is empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidWorkflow(
            f"{kind} name {excerpt(value)} is {len(value)} characters; the limit is "
            f"{MAX_NAME_LENGTH}"
        )
    if not NAME_PATTERN.fullmatch(value):
        raise InvalidWorkflow(
            f"{kind} name {excerpt(value)} is invalid: use letters, digits and _ . : - "
            "and start with a letter or _"
        )


#: The longest build id a worker may declare (ClaimRequest.build_id).
MAX_BUILD_ID_LENGTH = 200


def check_build_id(value: str) -> None:
    """Raise InvalidWorkflow unless ``value`` is a valid build id: 1-200 printable
    characters (no control characters, no line breaks)."""
    if not value:
        raise InvalidWorkflow("build id is empty")
    if len(value) > MAX_BUILD_ID_LENGTH:
        raise InvalidWorkflow(
            f"build id {excerpt(value)} is {len(value)} characters; the limit is "
            f"{MAX_BUILD_ID_LENGTH}"
        )
    if not value.isprintable():
        raise InvalidWorkflow(
            f"build id {excerpt(value)} is invalid: use printable characters only"
        )


def check_submit_key(key: str) -> None:
    if not key:
        raise InvalidWorkflow("submit key is empty")
    if len(key) > MAX_SUBMIT_KEY_LENGTH:
        raise InvalidWorkflow(
            f"submit key is {len(key)} characters; the limit is {MAX_SUBMIT_KEY_LENGTH}"
        )
    if "\x00" in key:
        raise InvalidWorkflow("submit key contains a NUL character")


def check_edges(name: str, edges: int, limits: Limits = DEFAULT_LIMITS) -> None:
    if edges > limits.max_edges:
        raise InvalidWorkflow(
            f"workflow {excerpt(name)} has {edges} dependencies in all; "
            f"the limit is {limits.max_edges}"
        )


def _check_node_settings(node: NodeSpec) -> None:
    where = f"node {node.name!r}"
    if node.trigger_rule not in TRIGGER_RULES:
        raise InvalidWorkflow(f"{where}: unknown trigger rule {excerpt(node.trigger_rule)}")
    if not 1 <= node.max_attempts <= MAX_ATTEMPTS:
        raise InvalidWorkflow(
            f"{where}: max_attempts must be between 1 and {MAX_ATTEMPTS}, got {node.max_attempts}"
        )
    if not MIN_TIMEOUT_S <= node.timeout_s <= MAX_TIMEOUT_S:
        raise InvalidWorkflow(
            f"{where}: timeout must be between {MIN_TIMEOUT_S:g}s and {MAX_TIMEOUT_S:g}s, "
            f"got {node.timeout_s:g}s"
        )
    if not 0 <= node.initial_backoff_s <= MAX_BACKOFF_S:
        raise InvalidWorkflow(
            f"{where}: initial_backoff must be between 0s and {MAX_BACKOFF_S:g}s, "
            f"got {node.initial_backoff_s:g}s"
        )
    if not node.initial_backoff_s <= node.max_backoff_s <= MAX_BACKOFF_S:
        raise InvalidWorkflow(
            f"{where}: max_backoff must be between initial_backoff and {MAX_BACKOFF_S:g}s, "
            f"got {node.max_backoff_s:g}s"
        )
    if not 1.0 <= node.backoff_multiplier <= MAX_BACKOFF_MULTIPLIER:
        raise InvalidWorkflow(
            f"{where}: backoff_multiplier must be between 1 and {MAX_BACKOFF_MULTIPLIER:g}, "
            f"got {node.backoff_multiplier:g}"
        )
    if node.priority is not None:
        flow.check_priority(where, node.priority)
    if (node.concurrency_key is None) != (node.concurrency_limit is None):
        raise InvalidWorkflow(f"{where}: a concurrency limit needs both a key and a limit")
    if node.concurrency_key is not None and node.concurrency_limit is not None:
        flow.KeyTemplate.parse(where, node.concurrency_key)
        if not 1 <= node.concurrency_limit <= flow.MAX_CONCURRENCY_LIMIT:
            raise InvalidWorkflow(
                f"{where}: concurrency limit must be between 1 and "
                f"{flow.MAX_CONCURRENCY_LIMIT}, got {node.concurrency_limit}"
            )


def validate_workflow(
    name: str, nodes: Sequence[NodeSpec], limits: Limits = DEFAULT_LIMITS
) -> list[NodeSpec]:
    """Check a workflow and return its nodes in topological order with dependents filled.

    Raises InvalidWorkflow with a message that names the offending node or limit:
    bad names, duplicate nodes, unknown or repeated dependencies, self-edges, cycles,
    settings out of range, more nodes, edges in all, upstreams of one node (fan-in) or
    downstreams of one node (fan-out) than ``limits`` allow. Time and memory grow in
    proportion to nodes plus edges (each node's dependents are also sorted).
    """
    check_name("workflow", name)
    if not nodes:
        raise InvalidWorkflow(f"workflow {excerpt(name)} has no nodes")
    if len(nodes) > limits.max_nodes:
        raise InvalidWorkflow(
            f"workflow {excerpt(name)} has {len(nodes)} nodes; the limit is {limits.max_nodes}"
        )
    check_edges(name, sum(len(n.depends_on) for n in nodes), limits)
    by_name: dict[str, NodeSpec] = {}
    for node in nodes:
        check_name("node", node.name)
        if node.name in by_name:
            raise InvalidWorkflow(f"node {node.name!r} is defined twice")
        check_name(f"node {node.name!r}: action", node.action)
        _check_node_settings(node)
        by_name[node.name] = node
    dependents: dict[str, list[str]] = {n: [] for n in by_name}
    for node in nodes:
        if len(node.depends_on) > limits.max_dependencies:
            raise InvalidWorkflow(
                f"node {node.name!r} has {len(node.depends_on)} dependencies; "
                f"the limit is {limits.max_dependencies}"
            )
        seen: set[str] = set()
        for dep in node.depends_on:
            if dep == node.name:
                raise InvalidWorkflow(f"node {node.name!r} depends on itself")
            if dep not in by_name:
                raise InvalidWorkflow(f"node {node.name!r} depends on unknown node {excerpt(dep)}")
            if dep in seen:
                raise InvalidWorkflow(f"node {node.name!r} lists dependency {excerpt(dep)} twice")
            seen.add(dep)
            dependents[dep].append(node.name)
    for upstream, downstream in dependents.items():
        if len(downstream) > limits.max_dependents:
            raise InvalidWorkflow(
                f"node {upstream!r} has {len(downstream)} dependents; "
                f"the limit is {limits.max_dependents}"
            )
    sorter = graphlib.TopologicalSorter({n.name: n.depends_on for n in nodes})
    try:
        order = list(sorter.static_order())
    except graphlib.CycleError as exc:
        cycle = exc.args[1]
        raise InvalidWorkflow(
            f"node {cycle[0]!r} is part of a cycle: {excerpt_path(cycle)}"
        ) from None
    return [
        NodeSpec(**{**_as_dict(by_name[n]), "dependents": tuple(sorted(dependents[n]))})
        for n in order
    ]


def _as_dict(node: NodeSpec) -> dict[str, Any]:
    return {f: getattr(node, f) for f in NodeSpec.__dataclass_fields__}
