"""The handler context: what a handler knows about the step it runs.

A :class:`Context` is a frozen value handed to the handler and reachable anywhere in
its call stack through :func:`current`. Its state that does change while the handler
runs (cancellation, loss of the lease, the lease expiry, the completion transaction)
lives in a :class:`StepControl` owned by the worker.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import threading
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from operator import attrgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pyclient.errors import OutsideHandler
from pyclient.models import timestamp_datetime

_F = TypeVar("_F", bound=Callable[..., Any])

if TYPE_CHECKING:
    import psycopg
    from google.protobuf.timestamp_pb2 import Timestamp

    from pyclient.completion import CompletionTx
    from pyclient.models import UpstreamFailure

_current: contextvars.ContextVar[Context] = contextvars.ContextVar("cyclone_context")

#: The events of a StepControl, as bits.
_CANCELLED, _LEASE_LOST, _SHOULD_STOP = 1, 2, 4
#: The bits of a step whose outcome is not reported (``StepControl.raised & LOST``).
LOST = _CANCELLED | _LEASE_LOST


class StepControl:
    """The changing side of a running step, shared by the worker and the handler.

    ``should_stop`` is set with ``cancelled`` or ``lease_lost`` and when the worker gives
    up on the handler (deadline passed, shutdown grace over, or the step is over), so a
    handler can wait on one event. Each event is made when first asked for: most
    handlers never look, and a worker would otherwise make three per step.
    """

    __slots__ = (
        "__weakref__",
        "_delivered",
        "_events",
        "_lease_expires_at",
        "_lease_timestamp",
        "_lock",
        "_recorded",
        "_taken",
        "completion_tx",
        "log_lines",
        "on_heartbeat",
        "progress",
        "progress_set",
        "raised",
        "streams",
    )

    def __init__(
        self,
        *,
        lease_expires_at: dt.datetime | None = None,
        completion_tx: CompletionTx | None = None,
        on_heartbeat: Callable[[], None] | None = None,
        lease_timestamp: Timestamp | None = None,
    ):
        self._lease_expires_at = lease_expires_at
        #: The lease expiry as the server sent it, made a datetime when first read
        #: (``lease_timestamp``: as :meth:`lease_until` would set it, without the lock).
        self._lease_timestamp = lease_timestamp
        self.completion_tx = completion_tx
        #: What the handler logged and was not sent yet (the worker's StepLines).
        self.log_lines: Any = None
        self.on_heartbeat = on_heartbeat
        self.progress: Any = None
        self.progress_set = False
        # Versions of the progress value: recorded, taken by a heartbeat, delivered.
        self._recorded = self._taken = self._delivered = 0
        #: The events raised, as bits (only the worker's loop raises them); and those made.
        self.raised = 0
        #: Where ctx.emit sends chunks (the worker's StepStreams); None: nowhere.
        self.streams: Any = None
        self._events: dict[int, threading.Event] | None = None
        self._lock = threading.Lock()

    @property
    def lease_expires_at(self) -> dt.datetime | None:
        if self._lease_timestamp is not None:
            with self._lock:
                if self._lease_timestamp is not None:
                    self._lease_expires_at = timestamp_datetime(self._lease_timestamp)
                    self._lease_timestamp = None
        return self._lease_expires_at

    @lease_expires_at.setter
    def lease_expires_at(self, value: dt.datetime | None) -> None:
        with self._lock:
            self._lease_expires_at, self._lease_timestamp = value, None

    def lease_until(self, timestamp: Timestamp) -> None:
        """Set the lease expiry from the server's Timestamp (read as a datetime only
        if someone asks: most handlers never do)."""
        with self._lock:
            self._lease_timestamp = timestamp

    @property
    def cancelled(self) -> threading.Event:
        return self._event(_CANCELLED)

    @property
    def lease_lost(self) -> threading.Event:
        return self._event(_LEASE_LOST)

    @property
    def should_stop(self) -> threading.Event:
        return self._event(_SHOULD_STOP)

    # The same, read without making the event.
    @property
    def is_cancelled(self) -> bool:
        return bool(self.raised & _CANCELLED)

    @property
    def is_lease_lost(self) -> bool:
        return bool(self.raised & _LEASE_LOST)

    @property
    def is_stopped(self) -> bool:
        return bool(self.raised & _SHOULD_STOP)

    def cancel(self) -> None:
        self._raise(_CANCELLED | _SHOULD_STOP)

    def lose_lease(self) -> None:
        self._raise(_LEASE_LOST | _SHOULD_STOP)

    def stop(self) -> None:
        """The worker gives up on the handler, or the step is over."""
        self.raised |= _SHOULD_STOP  # as _raise(), without its call: once per step
        if self._events is not None:
            self._raise(_SHOULD_STOP)

    def _event(self, bit: int) -> threading.Event:
        with self._lock:
            if self._events is None:
                self._events = {}
            event = self._events.get(bit)
            if event is None:
                # Made before the raised bits are read, which _raise sets before it
                # looks for events: one of the two sets the event.
                event = self._events[bit] = threading.Event()
                if self.raised & bit:
                    event.set()
            return event

    def _raise(self, bits: int) -> None:
        self.raised |= bits
        if self._events is not None:
            with self._lock:
                made = [event for bit, event in self._events.items() if bit & bits]
            for event in made:
                event.set()

    def request_heartbeat(self, progress: Any, has_progress: bool) -> None:
        if has_progress:
            with self._lock:
                self.progress, self.progress_set = progress, True
                self._recorded += 1
        if self.on_heartbeat is not None:
            self.on_heartbeat()

    def take_progress(self) -> tuple[bool, Any]:
        """The progress to send with the next heartbeat, once."""
        with self._lock:
            sent, value = self.progress_set, self.progress
            self.progress_set = False
            self._taken = self._recorded
            return sent, value

    def progress_delivered(self) -> None:
        """The server acknowledged the heartbeat that carried the last take."""
        with self._lock:
            self._delivered = max(self._delivered, self._taken)

    def undelivered_progress(self) -> tuple[bool, Any]:
        """The latest progress when no acknowledged heartbeat carried it yet."""
        with self._lock:
            return self._recorded > self._delivered, self.progress


_NO_PROGRESS: Any = object()


class StepCallScope(Protocol):
    """The step call of a durable function running now, as its context uses it (the
    replay engine's StepScope)."""

    def connection(self) -> Any: ...

    def record(self, conn: Any, output: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class Context:
    """The step a handler runs. ``(run_id, node)`` is its idempotency key."""

    run_id: str
    node: str
    action: str
    workflow: str
    #: This claim's attempt (first = 1). For logs and metrics only, never for a key.
    attempt: int
    max_attempts: int
    #: The node's static input.
    input: Any
    #: The run's input.
    run_input: Any
    #: Outputs of the completed upstream nodes, by node name.
    upstream: Mapping[str, Any]
    #: The handler timeout: no heartbeat keeps the lease past it.
    deadline: dt.datetime | None = None
    #: Progress sent by an earlier attempt's heartbeat, if any.
    progress: Any = None
    #: An earlier attempt lost its lease with no outcome: its effect may have happened.
    effect_uncertain: bool = False
    worker_id: str = ""
    #: For a node that runs after a failure (trigger rule ``all_done`` or
    #: ``one_failed``): its direct upstream nodes that were discarded, each with its
    #: last error, or skipped; in the workflow's order. Empty when all succeeded.
    upstream_failures: tuple[UpstreamFailure, ...] = ()
    #: Inside a step call of a durable function: the call's step id (``charge``,
    #: ``charge#2``); None elsewhere.
    step_id: str | None = None
    #: The run's deadline (given to submit, or its workflow's default): at it the run
    #: is cancelled and ``cancelled`` is set. None: the run has none. For budgeting work.
    run_deadline: dt.datetime | None = None
    _control: StepControl = field(default_factory=StepControl, repr=False, compare=False)
    #: The replay of a durable function's step calls (a pyclient.durable Replay, read
    #: through ``replay_of``); None for a plain handler.
    _durable: object | None = field(default=None, repr=False, compare=False)
    #: The step call running here, inside one.
    _scope: StepCallScope | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.upstream, MappingProxyType):
            object.__setattr__(self, "upstream", MappingProxyType(dict(self.upstream)))
        failures: object = self.upstream_failures  # a test may hand in a list
        if not isinstance(failures, tuple):
            object.__setattr__(self, "upstream_failures", tuple(self.upstream_failures))

    def _in_call(self, step_id: str, scope: StepCallScope) -> Context:
        """This context inside the step call ``step_id`` (the replay binds it while the
        call's function runs)."""
        return in_step_call(self, step_id, scope)

    @property
    def idempotency_key(self) -> str:
        """``"run_id:node"``: the same on every attempt, retry and reclaim of this node."""
        return f"{self.run_id}:{self.node}"

    @property
    def workflow_id(self) -> str:
        """The run id, under the name the everystep samples use: a UUIDv7 fixed when
        the run was submitted, the same on every replay."""
        return self.run_id

    @property
    def step_key(self) -> str:
        """``"run_id:node:step_id"`` inside a step call: the same on every replay of
        that call, so a receiver can deduplicate its effect (an idempotency key).
        RuntimeError outside a step call."""
        if self.step_id is None:
            raise RuntimeError("step_key exists only inside a step call of a durable function")
        return f"{self.run_id}:{self.node}:{self.step_id}"

    @property
    def cancelled(self) -> threading.Event:
        """Set when the run was cancelled: stop, the outcome will be refused."""
        return self._control.cancelled

    @property
    def lease_lost(self) -> threading.Event:
        """Set when this attempt lost its lease: another attempt may run the node."""
        return self._control.lease_lost

    @property
    def should_stop(self) -> threading.Event:
        """Set when the handler should give up: cancelled, lease lost, or past its deadline."""
        return self._control.should_stop

    @property
    def lease_expires_at(self) -> dt.datetime | None:
        """The current lease expiry, moved forward by every heartbeat."""
        return self._control.lease_expires_at

    def heartbeat(self, progress: Any = _NO_PROGRESS) -> None:
        """Ask for a heartbeat now, optionally recording ``progress`` (small JSON).

        The worker heartbeats on its own; call this to store progress, which the next
        attempt receives as ``ctx.progress`` if this one fails (GetRun shows it too).
        Returns at once; the last value recorded is stored before a failure is
        reported, so recording progress and then raising keeps it.
        """
        self._control.request_heartbeat(progress, progress is not _NO_PROGRESS)

    def emit(self, stream: str, chunk: Any) -> int:
        """Append ``chunk`` to the run's output stream ``stream`` and return its offset
        (docs/streams.md). ``chunk`` is a str (text) or any other JSON value (sent as JSON
        and read back as the same value). Returns once the chunk is stored; readers of
        the stream (``Client.read_stream``, ``cyclone stream``) see it at once.

        In a durable function each chunk is tied to where the body emitted it (the step
        call it runs in, or the body, and its order there): a replay after a crash
        emits the chunks stored already again, and they are not stored twice. Raises
        StreamFull when the run's streams are full (the server's bounds) and LeaseLost
        when this attempt no longer holds the node. In an async handler use
        :meth:`emit_async`. RuntimeError outside a worker's handler."""
        offset: int = self._streams().emit(stream, chunk, self.step_id or "")
        return offset

    async def emit_async(self, stream: str, chunk: Any) -> int:
        """:meth:`emit` for an async handler: the same, awaited."""
        offset: int = await self._streams().emit_async(stream, chunk, self.step_id or "")
        return offset

    def _streams(self) -> Any:
        streams = self._control.streams
        if streams is None:
            raise RuntimeError("emit() works in the handlers a Worker or pyclient.testing runs")
        return streams

    def record_step_call(self, conn: psycopg.Connection, output: Any = None) -> None:
        """Inside a step call: record the call's success with ``output`` in ``conn``'s
        open transaction (``cyclone.step_call_record``), your own connection to the
        Cyclone database; commit it yourself, after your writes. The writes and the
        record commit together or not at all, so the step's effect happens once. A
        lost lease raises LeaseLost (roll back). Return the same value from the step:
        a replay returns the recorded ``output``. RuntimeError outside a step call."""
        if self._scope is None:
            raise RuntimeError("record_step_call() exists only inside a step call")
        self._scope.record(conn, output)

    def query(self, name: str) -> Callable[[_F], _F]:
        """Decorator: register a query handler of this durable function, answered for
        QueryRun (``client.query``) while the body runs, without journaling; a handler
        that takes no arguments also has its value published at each journal point, for
        the queries asked when no worker runs the body. Call it in the body, before its
        first step call (docs/durable-functions.md, "Queries and updates")."""
        register: Callable[[_F], _F] = self._body_handlers("query").query(name)
        return register

    def update(self, name: str) -> Callable[[_F], _F]:
        """Decorator: register an update handler of this durable function (a plain
        function), for UpdateRun (``client.update``): the body applies each update at
        its next journal point and records it there, so that a replay applies it again
        at the same point; the caller gets the handler's return value. Call it in the
        body, before its first step call."""
        register: Callable[[_F], _F] = self._body_handlers("update").update(name)
        return register

    def _body_handlers(self, kind: str) -> Any:
        handlers = getattr(self._durable, "handlers", None)
        if handlers is None or self.step_id is not None:
            raise OutsideHandler(
                f"ctx.{kind}() registers a handler of a durable function: call it in the "
                "body of a @worker.workflow (not in a step or a plain action)"
            )
        return handlers

    def completion_tx(self) -> psycopg.Connection:
        """A psycopg connection in the transaction that will complete this step.

        Write your effects on it. When the handler returns, the SDK calls
        ``cyclone.step_complete`` in this transaction and commits, so the effects and
        the completion commit together or not at all; when the handler raises, it rolls
        back. Do not commit it yourself. Every call returns the same connection. Needs
        ``Worker(database_url=...)`` and the ``postgres`` extra.

        Inside a step call of a durable function it is that call's own transaction:
        when the step function returns, ``cyclone.step_call_record`` records the call's
        success in it and it commits, so the step's writes happen once.
        """
        if self._scope is not None:
            conn: psycopg.Connection = self._scope.connection()
            return conn
        if self._control.completion_tx is None:
            raise RuntimeError(
                "completion_tx() needs a database: create the Worker with database_url="
            )
        return self._control.completion_tx.connection()


#: Each field of Context as its slot's setter.
_SET = {f.name: getattr(Context, f.name).__set__ for f in fields(Context)}
_SETTERS = tuple(_SET.values())
_values = attrgetter(*_SET)
_set_worker_id, _set_step_id, _set_control, _set_durable, _set_scope = (
    _SET[name] for name in ("worker_id", "step_id", "_control", "_durable", "_scope")
)
_new_object = object.__new__


def context_fields() -> tuple[Field[Any], ...]:
    """Context's fields, in order."""
    return fields(Context)


def in_step_call(ctx: Context, step_id: str | None, scope: StepCallScope | None) -> Context:
    """``ctx`` inside a step call: what ``dataclasses.replace(ctx, step_id=step_id,
    _scope=scope)`` makes, at a third of its cost (a durable body makes one per call).
    Each slot is copied directly: ctx's values are already what ``__post_init__``
    would make them."""
    new: Context = _new_object(Context)
    for put, value in zip(_SETTERS, _values(ctx), strict=True):
        put(new, value)
    _set_step_id(new, step_id)
    _set_scope(new, scope)
    return new


def set_fields(ctx: Context, worker_id: str, control: StepControl, durable: object | None) -> None:
    """Set the fields of a Context a worker makes that are not the claimed step's (the
    worker's ``ClaimedContext``): no step call, ``step_id`` None."""
    _set_worker_id(ctx, worker_id)
    _set_step_id(ctx, None)
    _set_control(ctx, control)
    _set_durable(ctx, durable)
    _set_scope(ctx, None)


def current() -> Context:
    """The context of the step running here; OutsideHandler when called elsewhere."""
    try:
        return _current.get()
    except LookupError:
        raise OutsideHandler() from None


def active() -> Context | None:
    """The context of the step running here, or None."""
    return _current.get(None)


def bind(ctx: Context) -> contextvars.Token[Context]:
    """Make ``ctx`` current (used by the worker and pyclient.testing)."""
    return _current.set(ctx)


#: bind() without its call, for the worker's async handlers (one per step).
set_current = _current.set


def unbind(token: contextvars.Token[Context]) -> None:
    _current.reset(token)
