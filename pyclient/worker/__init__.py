"""The worker: claims steps of the actions it serves, runs their handlers, reports outcomes.

    worker = Worker("127.0.0.1:50051", concurrency=8)

    @worker.action("charge", timeout=30)
    def charge(ctx, order: Order) -> dict: ...

    worker.run()   # until SIGTERM or SIGINT

How it runs. An asyncio control loop does all the talking to the server: one Work
stream (WorkerService.Work) that hands out steps as the free handler slots allow and
carries the completion reports, heartbeats for each held step (every third of the
lease), and the begins of durable functions' unsafe step calls. A server without
Work streams is claimed from with long-poll claims sized to the free slots and
reported to with CompleteMany instead. Sync handlers run each in a thread of their own (idle
threads are reused) and async handlers on a second event loop in its own thread, so
neither a CPU-bound handler nor a blocking async one can starve the heartbeats.

Outcomes. A return value is the step's output. An exception is a retryable failure
carrying its type, message and traceback; NonRetryableError discards the step,
RetryAfter(seconds) sets the delay of the retry. When the handler used
``ctx.completion_tx()``, success is committed by ``cyclone.step_complete`` in that
transaction instead of the Complete RPC.

Timeouts. A step's time budget ends at the node's deadline, or earlier at the
action's own ``timeout``. An async handler is cancelled there and the step fails with
HandlerTimeout. A sync handler cannot be stopped from outside: ``ctx.should_stop`` is
set, its heartbeats stop, and its lease lapses so that another attempt can start; if it
returns later its outcome is still sent and the server decides whether it counts.
For an action marked ``unsafe_to_repeat`` no second attempt may start: a handler that
did not finish (timed out, given up on, or cut off by shutdown) is reported with
``effect_uncertain`` and its run is blocked until an operator resolves it.

Durable functions. A handler registered with :meth:`Worker.workflow` calls steps
(``@step``); the claim hands out the node's journal and the replay engine
(:mod:`pyclient.durable`) returns recorded outcomes without running them. A body that
stops on an unsafe call an earlier attempt left started (EffectUncertain) is dropped
without a Complete: the server has already blocked its run.

Losing the step. A heartbeat answered ABORTED sets ``ctx.lease_lost``; one that says
the run was cancelled sets ``ctx.cancelled``. Both set ``ctx.should_stop``, cancel an
async handler, and drop the outcome (the server would refuse it).

Shutdown. SIGTERM or SIGINT (or :meth:`Worker.stop`) stops claiming and waits up to
``shutdown_grace`` seconds for the handlers in flight; a second signal stops waiting.
Handlers still running then are abandoned: their leases lapse and the steps run again
elsewhere. Server unavailable: claims, heartbeats and completions retry with
exponential backoff while the channel reconnects.

The package, one module per job (the worker's seams):

- ``__init__``: :class:`Worker`, the public API: registering actions, run and stop;
  and one run of a worker (``_Run``): the channel, the parts below composed with
  explicit arguments, shutdown.
- ``_config``: the worker's settings as a run serves them, and the server as the
  parts call it (stub and metadata). No part holds a reference to the run or the
  Worker: each takes its collaborators (events, callbacks, other parts) by argument.
- ``_runner``: each claimed step's life (:meth:`StepRunner.start`, :class:`StepRun`).
- ``_context``: a claimed step's Context, each field read from the claim when asked.
- ``_session``: the Work stream: steps handed out within the credit of the free
  slots, reports answered on it, reopened with backoff, failed over to CompleteMany.
- ``_producer``: the handler slots, and the long-poll claims of a server without
  Work streams.
- ``_executor``: running handlers: threads for sync ones, the handler loop for async.
- ``_watch``: heartbeats and time limits. **Change the heartbeat here**: one policy
  object, :class:`~pyclient.worker._watch.WatchPolicy` (interval, time budget, what a
  timeout does, the unsafe_to_repeat rule).
- ``_completer``: reporting outcomes: batching (on the stream, or CompleteMany), the
  completion transaction path, effect_uncertain reports.
- ``_retry``: **change retry here**: the one backoff that streams, claims and
  CompleteMany use while the server is unavailable.
- ``_journal``: durable functions (``@worker.workflow``): Begin and End of their step
  calls, sent from the worker's loop for the replay engine of :mod:`pyclient.durable`.
- ``_timers``, ``_mailbox``, ``_common``: alarms on the worker's loop, calls handed
  between threads, and what they all share (logger, HandlerTimeout).
- ``_gc``: the cycle collector's first threshold, raised while a worker serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import threading
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import grpc

from cyclone.dag import InvalidWorkflow, check_build_id
from cyclone.v1 import worker_service_pb2_grpc as pb_grpc
from pyclient.actions import Action, RateLimit
from pyclient.client import call_metadata, default_address
from pyclient.completion import open_pool
from pyclient.durable._calls import MAX_STEP_CALLS
from pyclient.errors import InvalidArgument
from pyclient.worker import _logs as step_logs
from pyclient.worker._common import HandlerTimeout, log
from pyclient.worker._completer import Completer
from pyclient.worker._config import Server, WorkerConfig, worker_limits
from pyclient.worker._executor import Executor
from pyclient.worker._gc import fewer_collections
from pyclient.worker._journal import Journaling
from pyclient.worker._mailbox import Mailbox
from pyclient.worker._producer import Producer
from pyclient.worker._runner import StepRunner
from pyclient.worker._session import Session
from pyclient.worker._timers import Alarms
from pyclient.worker._watch import Watching, WatchPolicy
from pyclient.workflow import Seconds

__all__ = ["HandlerTimeout", "Worker"]


class Worker:
    """Serves actions: ``concurrency`` handler slots, leases of ``lease`` seconds.

    ``database_url`` gives the worker its own psycopg pool for ``ctx.completion_tx()``.
    ``claim_wait`` is the long-poll of each claim, only on a server without Work
    streams (on a stream the server hands steps out as they become ready);
    ``shutdown_grace`` how long a stop waits for handlers in flight;
    ``reconnect_max_delay`` caps the backoff while the server is unavailable.
    Results are checked against the server's limits before they are sent: the server
    announces them on the Work stream (its ``--max-payload-bytes``, the journal's
    10,000 step calls, the longest error text); ``max_payload_bytes`` and
    ``max_step_calls`` may lower them for this worker, never raise them (see "Limits"
    in docs/operations.md). Before the first announcement, and with a server that
    makes none, they are the defaults (1 MiB, 10,000) or the values given.
    ``build_id`` names the build of this worker's code (default: the environment's
    ``CYCLONE_BUILD_ID``; none when unset), 1-200 printable characters: a durable
    body a worker of one build started replays only on workers of that build or of one
    declared compatible with it ("Build pinning" in docs/durable-functions.md).
    ``shard_node`` (on Citus, default: the environment's ``CYCLONE_SHARD_NODE``; any
    node when unset) is a node of the cluster, ``"host:port"`` as the cluster names
    it: the worker takes only steps of the runs whose shards that node holds ("A
    worker pinned to a node" in docs/scaling.md). A server that cannot honour it
    refuses the worker's claims, and the worker stops, saying why.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        worker_id: str | None = None,
        concurrency: int = 4,
        database_url: str | None = None,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        lease: float = 30.0,
        claim_wait: float = 10.0,
        shutdown_grace: float = 30.0,
        reconnect_max_delay: float = 10.0,
        max_payload_bytes: int | None = None,
        max_step_calls: int | None = None,
        build_id: str | None = None,
        shard_node: str | None = None,
    ):
        if shard_node is None:
            shard_node = os.environ.get("CYCLONE_SHARD_NODE") or None
        if shard_node is not None and not shard_node.strip():
            raise InvalidArgument("shard_node must name a node, host:port")
        self.shard_node = shard_node
        if build_id is None:
            build_id = os.environ.get("CYCLONE_BUILD_ID") or None
        if build_id is not None:
            try:
                check_build_id(build_id)
            except InvalidWorkflow as e:
                raise InvalidArgument(str(e)) from None
        self.build_id = build_id
        if concurrency < 1:
            raise InvalidArgument(f"concurrency must be at least 1, got {concurrency}")
        if not 1.0 <= lease <= 600.0:
            raise InvalidArgument(f"lease must be between 1s and 600s, got {lease:g}s")
        if not 0.0 <= claim_wait <= 60.0:
            raise InvalidArgument(f"claim_wait must be between 0s and 60s, got {claim_wait:g}s")
        if max_payload_bytes is not None and max_payload_bytes < 1:
            raise InvalidArgument(f"max_payload_bytes must be positive, got {max_payload_bytes}")
        if max_step_calls is not None and not 1 <= max_step_calls <= MAX_STEP_CALLS:
            raise InvalidArgument(
                f"max_step_calls must be between 1 and {MAX_STEP_CALLS}, got {max_step_calls}"
            )
        self.max_payload_bytes = max_payload_bytes
        self.max_step_calls = max_step_calls
        self.address = address or default_address()
        self.worker_id = worker_id or (
            f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(2)}"
        )
        self.concurrency = concurrency
        self.database_url = database_url
        self.lease = lease
        self.claim_wait = claim_wait
        self.shutdown_grace = shutdown_grace
        self.reconnect_max_delay = reconnect_max_delay
        self._token = token
        self._credentials = credentials
        self._actions: dict[str, Action] = {}
        self._stop_requests = 0
        self._runtime: _Run | None = None
        self._lock = threading.Lock()

    @property
    def actions(self) -> dict[str, Action]:
        return dict(self._actions)

    def action(
        self,
        name: str | None = None,
        *,
        timeout: float | None = None,
        unsafe_to_repeat: bool = False,
        rate_limit: RateLimit | tuple[int, Seconds] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering a handler for ``name`` (default: the function's name).

        ``timeout`` (seconds) caps each call below the node's own timeout.
        ``unsafe_to_repeat``: the effect must not happen twice; a step of this action
        that lost its lease with no outcome blocks its run until an operator resolves
        it, instead of running again. ``rate_limit`` (a :class:`RateLimit` or
        ``(count, period)``): at most ``count`` steps of the action are claimed in any
        window of ``period`` seconds, across all workers (docs/flow-control.md).
        """

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register(
                name or fn.__name__,
                fn,
                timeout=timeout,
                unsafe_to_repeat=unsafe_to_repeat,
                rate_limit=rate_limit,
            )
            return fn

        return register

    def workflow(
        self,
        name: str | None = None,
        *,
        timeout: float | None = None,
        rate_limit: RateLimit | tuple[int, Seconds] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering a durable function for the action ``name`` (default:
        the function's name): a handler whose body calls steps (``@step``), each call
        journaled and replayed when the node runs again. Same signatures as
        :meth:`action`; any DAG node may name it, and ``client.start(name, input)`` runs
        it as a one-node workflow. ``timeout`` caps each attempt below the node's;
        ``rate_limit`` as for :meth:`action` (each claim of the node counts, resumes too).
        """

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            action = self.register(
                name or fn.__name__, fn, timeout=timeout, durable=True, rate_limit=rate_limit
            )
            with contextlib.suppress(AttributeError, TypeError):  # for client.start(fn)
                fn.__cyclone_action__ = action.name  # type: ignore[attr-defined]
            return fn

        return register

    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        timeout: float | None = None,
        unsafe_to_repeat: bool = False,
        durable: bool = False,
        rate_limit: RateLimit | tuple[int, Seconds] | None = None,
    ) -> Action:
        """Register ``fn`` for ``name``; see :meth:`action` (and :meth:`workflow` for
        ``durable=True``)."""
        if name in self._actions:
            raise InvalidArgument(f"action {name!r} is registered twice")
        if durable and unsafe_to_repeat:
            raise InvalidArgument(
                f"action {name!r}: a durable function is not unsafe_to_repeat as a whole; "
                "mark its steps: @step(unsafe_to_repeat=True)"
            )
        action = Action.of(
            name,
            fn,
            timeout=timeout,
            unsafe_to_repeat=unsafe_to_repeat,
            durable=durable,
            rate_limit=rate_limit,
        )
        self._actions[name] = action
        return action

    def run(self, *, handle_signals: bool = True) -> None:
        """Serve until stopped: by SIGTERM/SIGINT (in the main thread) or :meth:`stop`."""
        asyncio.run(self.run_async(handle_signals=handle_signals))

    async def run_async(self, *, handle_signals: bool = False) -> None:
        """:meth:`run` on the running event loop."""
        if not self._actions:
            raise InvalidArgument("the worker serves no action: register one first")
        config = WorkerConfig(
            worker_id=self.worker_id,
            address=self.address,
            actions=MappingProxyType(dict(self._actions)),
            concurrency=self.concurrency,
            lease=self.lease,
            claim_wait=self.claim_wait,
            shutdown_grace=self.shutdown_grace,
            reconnect_max_delay=self.reconnect_max_delay,
            database_url=self.database_url,
            max_payload_bytes=self.max_payload_bytes,
            max_step_calls=self.max_step_calls,
            build_id=self.build_id or "",
            shard_node=self.shard_node or "",
        )
        runtime = _Run(config, asyncio.get_running_loop(), self._token, self._credentials)
        with self._lock:
            self._runtime = runtime
            for _ in range(self._stop_requests):
                runtime.request_stop()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        handle_signals = handle_signals and threading.current_thread() is threading.main_thread()
        if handle_signals:
            for sig in signals:
                loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            with fewer_collections():
                await runtime.serve()
        finally:
            if handle_signals:
                for sig in signals:
                    loop.remove_signal_handler(sig)
            with self._lock:
                self._runtime = None

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("worker %s: %s received", self.worker_id, sig.name)
        self.stop()

    def stop(self) -> None:
        """Stop claiming and finish the handlers in flight; a second call stops waiting.

        Safe to call from any thread, also before :meth:`run`.
        """
        with self._lock:
            self._stop_requests += 1
            runtime = self._runtime
        if runtime is not None:
            runtime.loop.call_soon_threadsafe(runtime.request_stop)


class _Run:
    """One run of a worker: opens the channel (and the completion pool), composes the
    parts, serves until stopped, then drains."""

    def __init__(
        self,
        config: WorkerConfig,
        loop: asyncio.AbstractEventLoop,
        token: str | None,
        credentials: grpc.ChannelCredentials | None,
    ):
        self.config = config
        self.loop = loop
        self.credentials = credentials
        self.metadata = call_metadata(token, None)
        self.stopping = asyncio.Event()
        self.forced = asyncio.Event()
        # Reconnect as eagerly as the claim loop retries, not after gRPC's default backoff.
        self.channel_options = [
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", max(100, int(config.reconnect_max_delay * 1000))),
        ]

    def request_stop(self) -> None:
        if self.stopping.is_set():
            self.forced.set()
        self.stopping.set()

    async def serve(self) -> None:
        config, options = self.config, self.channel_options
        channel = (
            grpc.aio.secure_channel(config.address, self.credentials, options=options)
            if self.credentials
            else grpc.aio.insecure_channel(config.address, options=options)
        )
        pool = None
        if config.database_url:
            pool = await asyncio.to_thread(open_pool, config.database_url, config.concurrency)
        inbox = Mailbox(self.loop)  # handler outcomes and heartbeat requests
        executor = Executor(
            self.loop, inbox, any_async=any(a.is_async for a in config.actions.values())
        )
        producer, completer, session = self._compose(
            Server(pb_grpc.WorkerServiceStub(channel), self.metadata), executor, inbox, pool
        )
        log.info(
            "worker %s: serving %s on %s with %d slots%s%s",
            config.worker_id,
            ", ".join(sorted(config.actions)),
            config.address,
            config.concurrency,
            f", build {config.build_id}" if config.build_id else "",
            f", the runs of node {config.shard_node}'s shards only" if config.shard_node else "",
        )
        try:
            with step_logs.capturing():
                # On Work streams; with Claim and CompleteMany on a server without them.
                # Either returns once nothing more can be handed out (the last stream
                # has ended): the drain below then sees every step handed out.
                if not await session.serve():
                    await producer.claim_loop()
        finally:
            await self._drain(producer, completer)
            await channel.close()
            executor.close()
            if pool is not None:
                await asyncio.to_thread(pool.close)
            log.info("worker %s: stopped", config.worker_id)

    def _compose(
        self, server: Server, executor: Executor, inbox: Mailbox, pool: Any
    ) -> tuple[Producer, Completer, Session]:
        """The parts, each given its collaborators. The completer, producer and session
        call each other back: a report answered frees slots (the producer's), a freed
        slot is granted on the stream (the session's), a report goes on the stream."""
        config, loop = self.config, self.loop
        policy = WatchPolicy(config.lease)
        session: Session | None = None
        producer: Producer | None = None

        async def send_on_stream(request: Any) -> Any:
            assert session is not None
            return await session.report(request)

        def freed() -> None:
            assert producer is not None
            producer.freed()

        def regrant() -> None:
            assert session is not None
            session.regrant()

        completer = Completer(
            server=server,
            loop=loop,
            policy=policy,
            reconnect_max_delay=config.reconnect_max_delay,
            max_payload_bytes=worker_limits(config).max_payload_bytes,
            send_on_stream=send_on_stream,
            on_answered=freed,
        )
        runner = StepRunner(
            config=config,
            executor=executor,
            completer=completer,
            pool=pool,
            watching=Watching(
                policy=policy,
                server=server,
                loop=loop,
                inbox=inbox,
                alarms=Alarms(loop),
                abandon=completer.abandon,
            ),
            journaling=Journaling(
                server=server,
                loop=loop,
                inbox=inbox,
                completer=completer,
                handler_loop=executor.handler_loop,
                pool=pool,
                lease=policy.lease,
                reconnect_max_delay=config.reconnect_max_delay,
            ),
        )
        producer = Producer(
            config=config,
            server=server,
            stopping=self.stopping,
            completer=completer,
            start_step=runner.start,
            regrant=regrant,
        )
        session = Session(
            config=config,
            server=server,
            loop=loop,
            stopping=self.stopping,
            forced=self.forced,
            producer=producer,
            completer=completer,
            on_limits=_adopter(config, runner, completer),
        )
        producer.regrant = session.regrant  # (the closure's call saved, once per step)
        return producer, completer, session

    async def _drain(self, producer: Producer, completer: Completer) -> None:
        """Wait up to the shutdown grace (or a second stop) for the handlers in flight
        and then for their outcomes' answers; abandon the handlers still running."""
        give_up = self.loop.time() + self.config.shutdown_grace
        inflight = producer.inflight
        if inflight:
            await self._until_forced(producer.all_over(), give_up, len(inflight))
            left = list(inflight)
            if left:
                log.warning(
                    "worker %s: abandoning %d handler(s); their leases will lapse and the "
                    "steps run again",
                    self.config.worker_id,
                    len(left),
                )
                await asyncio.gather(*(run.stop() for run in left), return_exceptions=True)
        if completer.holding and not self.forced.is_set():
            await self._until_forced(completer.settled(), give_up)

    async def _until_forced(self, aw: Any, give_up: float, handlers: int = 0) -> None:
        """Await ``aw`` until ``give_up`` (loop time) or a second stop."""
        if handlers:
            log.info(
                "worker %s: waiting up to %gs for %d handler(s)",
                self.config.worker_id,
                max(give_up - self.loop.time(), 0.0),
                handlers,
            )
        waited = asyncio.ensure_future(aw)
        forced = asyncio.ensure_future(self.forced.wait())
        await asyncio.wait(
            {waited, forced},
            timeout=max(give_up - self.loop.time(), 0.0),
            return_when="FIRST_COMPLETED",
        )
        waited.cancel()
        forced.cancel()


def _adopter(
    config: WorkerConfig, runner: StepRunner, completer: Completer
) -> Callable[[Any], None]:
    """What takes the limits a server announces on a Work stream: checked against from
    then on (lowered by the worker's settings), looked at again only when they change."""
    announced: list[Any] = [None]

    def adopt(limits: Any) -> None:
        if limits == announced[0]:
            return
        announced[0] = limits
        runner.limits = worker_limits(config, limits)
        completer.max_payload_bytes = runner.limits.max_payload_bytes

    return adopt
