"""Query and update handlers of a durable function (docs/durable-functions.md,
"Queries and updates").

A body registers them while it runs, as closures over its own state::

    @worker.workflow("cart")
    def cart(ctx, user: str) -> list[str]:
        items: list[str] = []

        @ctx.query("items")
        def _items() -> list[str]:
            return items

        @ctx.update("add_item")
        def _add(item: str) -> int:
            items.append(item)
            return len(items)

        wait_for_event("checkout")
        return items

A query handler reads (it runs on the worker's loop, beside the body: keep it quick
and read-only). An update handler changes the state: the body runs it at a journal
point (when a step call returns, at a wait), and the journal records it there (step
id ``update:<id>``, function ``cyclone.update``) with its arguments and result, so
that a replay runs it again at the same point, before the body's code after it.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from cyclone.jsonvalue import dumps

log = logging.getLogger("pyclient.durable")

#: The journal's function of an update's application, and its step ids' prefix.
UPDATE_FUNCTION = "cyclone.update"
UPDATE_PREFIX = "update:"

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True, slots=True)
class Delivered:
    """An update the server handed to the worker running the body."""

    update_id: str
    name: str
    args: list[Any]


def _publishable(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` can be called with no arguments (its value is then published)."""
    try:
        inspect.signature(fn).bind()
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): not published
        return False
    return True


def _error(kind: str, message: str) -> dict[str, str]:
    return {"type": kind, "message": message}


class BodyHandlers:
    """The query and update handlers one attempt of a body registered, the updates
    delivered to it and not yet applied, and what it last published."""

    def __init__(self) -> None:
        self.queries: dict[str, Callable[..., Any]] = {}
        self.updates: dict[str, Callable[..., Any]] = {}
        self._publish: set[str] = set()
        self._lock = threading.Lock()
        self._delivered: list[Delivered] = []
        self._last: dict[str, str] = {}
        #: Set by the worker: called with the changed values (JSON text, by name) of the
        #: queries that take no arguments, at each journal point (None: none published).
        self.on_publish: Callable[[dict[str, str]], None] | None = None

    # -- registration (from the body)

    def query(self, name: str) -> Callable[[F], F]:
        def register(fn: F) -> F:
            self.queries[_checked_name(name, "query")] = fn
            if _publishable(fn):
                self._publish.add(name)
            return fn

        return register

    def update(self, name: str) -> Callable[[F], F]:
        def register(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):
                raise TypeError(f"update handler {name!r} must be a plain function, not async")
            self.updates[_checked_name(name, "update")] = fn
            return fn

        return register

    # -- queries (from the worker's loop)

    def answer(self, name: str, args: Sequence[Any]) -> tuple[Any, dict[str, str] | None]:
        """A query's answer: (value, None), or (None, {type, message})."""
        handler = self.queries.get(name)
        if handler is None:
            known = ", ".join(sorted(self.queries)) or "none"
            return None, _error(
                "UnknownQuery", f"the body has no query handler {name!r} (it has: {known})"
            )
        try:
            value = handler(*args)
            dumps(value)
        except Exception as exc:  # the handler's failure is the asker's answer
            return None, _error(type(exc).__name__, str(exc))
        return value, None

    # -- updates

    @property
    def pending(self) -> bool:
        return bool(self._delivered)

    def deliver(self, update: Delivered) -> None:
        """From the worker's loop: an update for the body's next journal point."""
        with self._lock:
            if all(d.update_id != update.update_id for d in self._delivered):
                self._delivered.append(update)

    def take(self) -> list[Delivered]:
        with self._lock:
            taken, self._delivered = self._delivered, []
        return taken

    def apply(self, update: Delivered) -> dict[str, Any]:
        """Run an update's handler: what the journal records of it."""
        recorded: dict[str, Any] = {"update": update.name, "args": list(update.args)}
        handler = self.updates.get(update.name)
        if handler is None:
            known = ", ".join(sorted(self.updates)) or "none"
            recorded["error"] = _error(
                "UnknownUpdate", f"the body has no update handler {update.name!r} (it has: {known})"
            )
            return recorded
        try:
            result = handler(*update.args)
            dumps(result)
        except Exception as exc:  # the handler's failure is the sender's answer
            recorded["error"] = _error(type(exc).__name__, str(exc))
        else:
            recorded["result"] = result
        return recorded

    def reapply(self, recorded: Any, step_id: str) -> None:
        """A replay meets an update's journal entry: its handler runs again with the
        recorded arguments (its state as it was), its result is the recorded one."""
        if not isinstance(recorded, dict) or "error" in recorded:
            return  # refused or failed when applied: it changed nothing to replay
        name = recorded.get("update")
        handler = self.updates.get(name) if isinstance(name, str) else None
        if handler is None:
            log.warning("journal entry %s: the body has no update handler %r now", step_id, name)
            return
        try:
            handler(*(recorded.get("args") or []))
        except Exception:
            log.warning("journal entry %s: update handler %r raised on replay", step_id, name)

    # -- publication (from the body, at its journal points)

    def publish(self) -> None:
        """Hand the worker the values of the queries without arguments that changed
        since the last publication."""
        if self.on_publish is None or not self._publish:
            return
        changed: dict[str, Any] = {}
        for name in sorted(self._publish):
            try:
                value = self.queries[name]()
                text = dumps(value)
            except Exception:  # not publishable now: the last value stays
                continue
            if self._last.get(name) != text:
                self._last[name] = text
                changed[name] = text
        if changed:
            self.on_publish(changed)


def _checked_name(name: str, kind: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 200 or not name.isprintable():
        raise ValueError(f"a {kind} handler's name must be 1-200 printable characters")
    return name
