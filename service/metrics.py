"""Prometheus metrics of one server process, served over HTTP (``--metrics-listen``).

Two kinds, with different costs (docs/metrics.md lists every metric):

- Counters and histograms updated in memory on the request paths: RPCs by method and
  code, steps claimed, completed, failed and discarded, lease expiries, claim wait and
  step duration, pool waits. No query is made for them. Those updated for every step
  (:class:`PerStep`) are plain numbers without locks, a fraction of a microsecond
  each: only the event loop writes them, and a scrape reads them as they are.
- Gauges of the database's state (runs by status, ready and running steps per action),
  read by one statement over partial indexes when Prometheus scrapes, at most once per
  ``GAUGE_MAX_AGE_S``: several scrapers, or several servers each scraped, cost one
  small query per interval each. They describe the whole database, so every server
  reports the same values: aggregate them with max(), not sum().
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, NamedTuple, TypeAlias

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from service import config
from service.db.workers import GaugeRow

log = logging.getLogger("cyclone")

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"

# No `_created` series beside each counter and histogram: twice the series for a
# timestamp that `rate()` does not need.
disable_created_metrics()

#: Gauges read from the database are reused for this long.
GAUGE_MAX_AGE_S = 5.0
#: How long a scrape waits for the database before reporting cyclone_database_up 0.
GAUGE_TIMEOUT_S = 5.0

_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_SLOW = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 21600)


#: Most distinct names (of workflows, of actions) one metric keeps apart. Names come
#: from clients, so without a bound each new name would grow the server's memory and
#: every scrape for good; past it, new names are counted together under OTHER.
MAX_NAMES = 1000
OTHER = "_other"


class Names:
    """The label values of one metric's name label, at most ``limit`` of them."""

    def __init__(self, limit: int = MAX_NAMES) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def __call__(self, name: str) -> str:
        if name in self._seen:
            return name
        if len(self._seen) >= self.limit:
            return OTHER
        self._seen.add(name)
        return name


class _ByName:
    """A labelled counter whose first label is a name from clients, bounded by Names."""

    def __init__(self, metric: Any, limit: int = MAX_NAMES) -> None:
        self.metric = metric
        self.names = Names(limit)

    def labels(self, name: str, *rest: str) -> Any:
        return self.metric.labels(self.names(name), *rest)


class Count:
    """A counter written by one thread (the event loop) only."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class Distribution:
    """A histogram written by one thread (the event loop) only: a count per bucket."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, int]]:
        """Cumulative counts by upper bound, as the exposition format wants them."""
        counts = list(self.counts)  # one consistent copy: the loop may write meanwhile
        cumulative, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            total += n
            cumulative.append((floatToGoString(bound), total))
        return cumulative


class ActionMetrics(NamedTuple):
    """The series of one action that the request paths update per step."""

    claimed: Count
    claim_wait: Distribution
    completed_seconds: Distribution
    failed_seconds: Distribution


class PerStep:
    """The metrics updated for every step, by action, and their exposition."""

    def __init__(self, limit: int = MAX_NAMES) -> None:
        self.actions: dict[str, ActionMetrics] = {}
        self.completed = Count()
        self.limit = limit

    def action(self, action: str) -> ActionMetrics:
        bound = self.actions.get(action)
        if bound is None:
            if len(self.actions) >= self.limit:
                action = OTHER
                bound = self.actions.get(OTHER)
                if bound is not None:
                    return bound
            bound = self.actions[action] = ActionMetrics(
                Count(), Distribution(_SLOW), Distribution(_SLOW), Distribution(_SLOW)
            )
        return bound

    def describe(self) -> Iterator[Metric]:
        return self._families({})

    def collect(self) -> Iterator[Metric]:
        return self._families(dict(self.actions))

    def _families(self, actions: dict[str, ActionMetrics]) -> Iterator[Metric]:
        claimed = CounterMetricFamily(
            "cyclone_steps_claimed", "Steps handed out by Claim", labels=["action"]
        )
        completed = CounterMetricFamily(
            "cyclone_steps_completed",
            "Steps completed through Complete or CompleteMany (not counting repeats)",
        )
        wait = HistogramMetricFamily(
            "cyclone_claim_wait_seconds",
            "How long a step was ready before a claim took it, by action",
            labels=["action"],
        )
        duration = HistogramMetricFamily(
            "cyclone_step_duration_seconds",
            "From claim to reported outcome, by action and outcome, for steps whose "
            "outcome reached the server that handed them out",
            labels=["action", "outcome"],
        )
        completed.add_metric([], self.completed.value)
        for action, m in sorted(actions.items()):
            claimed.add_metric([action], m.claimed.value)
            wait.add_metric([action], m.claim_wait.buckets(), m.claim_wait.sum)
            for outcome, d in (("completed", m.completed_seconds), ("failed", m.failed_seconds)):
                if d.sum or any(d.counts):
                    duration.add_metric([action, outcome], d.buckets(), d.sum)
        yield from (claimed, completed, wait, duration)


def parse_listen(value: str) -> tuple[str, int] | None:
    """``host:port`` (``[::1]:9464`` for IPv6) as (host, port); None for ``off``."""
    if value.strip().lower() in ("off", "", "none"):
        return None
    port = config.port_of(value)
    if port is None:
        raise ValueError(
            f"--metrics-listen {value!r} is not host:port with a port from 0 to "
            f"{config.MAX_PORT}, or off"
        )
    return value.rpartition(":")[0].strip("[]") or "0.0.0.0", port


class Metrics:
    """The metrics of one server; ``registry`` is its own, so that several servers can
    live in one process (the tests run them so)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        # process_cpu_seconds_total, process_resident_memory_bytes, open fds, start time.
        ProcessCollector(registry=r)
        self.rpcs = Counter(
            "cyclone_rpcs",
            "RPCs answered, by method and status code",
            ["method", "code"],
            registry=r,
        )
        self.rpc_seconds = Histogram(
            "cyclone_rpc_duration_seconds",
            "Time to answer an RPC, by method (a Claim includes its long-poll wait)",
            ["method"],
            buckets=_FAST,
            registry=r,
        )
        self.submitted = _ByName(
            Counter(
                "cyclone_runs_submitted",
                "Runs created by Submit and SubmitOnce",
                ["workflow"],
                registry=r,
            )
        )
        self.schedule_firings = Counter(
            "cyclone_schedule_firings",
            "Firings of schedules by this server, by schedule and outcome (submitted: a "
            "run; existing: its key had a run already; overlap: skipped, the last run "
            "still running; missed: skipped, too late after downtime; failed: tried "
            "again at the next pass)",
            ["schedule", "outcome"],
            registry=r,
        )
        self._outcomes(r)
        self._upkeep(r)
        #: How long gauges read from the database are reused (tests set 0).
        self.gauge_max_age_s = GAUGE_MAX_AGE_S
        self._http: Any = None
        self.action = self.per_step.action

    def _outcomes(self, r: CollectorRegistry) -> None:
        """The counters of what became of runs and steps."""
        self.finished = Counter(
            "cyclone_runs_finished",
            "Runs finished by an outcome reported to this server, by final status",
            ["status"],
            registry=r,
        )
        self.blocked = _ByName(
            Counter(
                "cyclone_runs_blocked",
                "Runs blocked (EffectUncertain) by a claim, by an unsafe handler that "
                "stopped without an outcome, or by an unsafe step call left without one, "
                "by the uncertain step's action",
                ["action"],
                registry=r,
            )
        )
        self.per_step = PerStep()
        r.register(self.per_step)
        self.completed = self.per_step.completed
        self.failed = Counter(
            "cyclone_steps_failed",
            "Failed attempts reported by workers, by what became of the step "
            "(retry: available again after a backoff; discarded; held: pending in a "
            "blocked run; uncertain: an unsafe handler stopped without an outcome)",
            ["outcome"],
            registry=r,
        )
        self.discarded = Counter(
            "cyclone_steps_discarded",
            "Steps discarded, by cause (handler: a failure; lease_expired: out of "
            "attempts when the sweep reclaimed a lease that ran to its timeout; "
            "worker_lost: past --max-recoveries when the sweep reclaimed it)",
            ["cause"],
            registry=r,
        )
        self.deadlines_exceeded = Counter(
            "cyclone_runs_deadline_exceeded",
            "Runs cancelled by this server's upkeep at their deadline",
            registry=r,
        )
        self.bulk_runs = Counter(
            "cyclone_bulk_runs",
            "Runs worked by this server's share of the bulk actions, by action (cancel, "
            "retry, resolve_discard) and outcome (touched, skipped, failed)",
            ["action", "outcome"],
            registry=r,
        )
        self.bulk_finished = Counter(
            "cyclone_bulk_actions_finished",
            "Bulk actions this server worked to their end, by how they ended (done, cancelled)",
            ["state"],
            registry=r,
        )
        self.lease_expiries = _ByName(
            Counter(
                "cyclone_lease_expiries",
                "Expired leases reclaimed by this server's sweep, by action",
                ["action"],
                registry=r,
            )
        )

    def _upkeep(self, r: CollectorRegistry) -> None:
        """Refusals, retention, the pool and the waiting claims and Work streams."""
        self.http_requests = Counter(
            "cyclone_http_requests",
            "Requests to the HTTP listener (--http-listen), by endpoint (callbacks, "
            "webhooks, other) and outcome (decided, event_sent, submitted, page, or the "
            "error code answered)",
            ["endpoint", "outcome"],
            registry=r,
        )
        self.refused = Counter(
            "cyclone_completions_refused",
            "Completions refused because the lease was lost or the step is unknown",
            registry=r,
        )
        self.retention_deleted = Counter(
            "cyclone_retention_deleted_runs",
            "Runs deleted by retention, by policy (finished: completed and cancelled; failed), "
            "and SubmitOnce keys forgotten (keys)",
            ["policy"],
            registry=r,
        )
        self.pool_wait = Histogram(
            "cyclone_db_pool_wait_seconds",
            "How long a statement waited for a pooled database connection",
            buckets=_FAST,
            registry=r,
        )
        self.waiting_claims = Gauge(
            "cyclone_claims_waiting",
            "Claims long-polling on this server for work (idle worker slots), and Work "
            "streams waiting for a step with credit left",
            registry=r,
        )
        self.work_streams = Gauge(
            "cyclone_work_streams",
            "Work streams open on this server (WorkerService.Work: a worker's session)",
            registry=r,
        )
        work_seconds = Counter(
            "cyclone_work_stream_seconds",
            "Time the Work streams of this server spent, by phase: applying their "
            "reports (report), claiming (claim), waiting for their workers with every "
            "slot granted in use (worker), and waiting for a ready step with credit "
            "left (idle)",
            ["phase"],
            registry=r,
        )
        #: The phases' children, looked up once: they are counted at every round.
        self.work_report_s = work_seconds.labels("report")
        self.work_claim_s = work_seconds.labels("claim")
        self.work_worker_s = work_seconds.labels("worker")
        self.work_idle_s = work_seconds.labels("idle")

    # -- wiring -------------------------------------------------------------------

    def watch_pool(self, status: Callable[[], tuple[int, int]], size: int) -> None:
        """Gauges of the database pool, read at each scrape from ``status()``:
        (connections in use, connections open)."""
        in_use = Gauge(
            "cyclone_db_pool_connections",
            "Database connections of this server's pool, by state",
            ["state"],
            registry=self.registry,
        )
        in_use.labels("in_use").set_function(lambda: status()[0])
        in_use.labels("idle").set_function(lambda: status()[1] - status()[0])
        limit = Gauge(
            "cyclone_db_pool_size",
            "Most connections the pool opens (--pool-size)",
            registry=self.registry,
        )
        limit.set(size)

    def watch_database(
        self,
        read: Callable[[], Coroutine[Any, Any, Sequence[GaugeRow]]],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Gauges read from the database at a scrape, through ``read`` run on ``loop``."""
        self.registry.register(_DatabaseGauges(read, loop, lambda: self.gauge_max_age_s))

    def serve(self, listen: str) -> int | None:
        """Serve /metrics on ``listen``; the port, or None when off or unavailable."""
        address = parse_listen(listen)
        if address is None:
            return None
        host, port = address
        try:
            self._http, _ = start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            # Metrics are not worth refusing to serve for; say so loudly instead.
            log.warning(
                "metrics disabled: cannot listen on %s (%s); set --metrics-listen "
                "(CYCLONE_METRICS_LISTEN) to a free host:port, or off",
                listen,
                exc,
            )
            return None
        return int(self._http.server_port)

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        return _RpcMetrics(self)


class _RpcMetrics(grpc.aio.ServerInterceptor):
    """Counts and times every unary RPC by method and status code."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._handlers: dict[str, Handler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        name = handler_call_details.method
        known = self._handlers.get(name)
        if known is not None:
            return known
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None:
            return handler
        wrapped = self._timed(name.lstrip("/").rsplit(".", 1)[-1], handler)
        self._handlers[name] = wrapped
        return wrapped

    def _timed(self, method: str, handler: Handler) -> Handler:
        # The stubs type a handler as a plain function; under grpc.aio it is async.
        inner: Any = handler.unary_unary
        rpcs = self.metrics.rpcs
        counts: dict[str, Any] = {}
        seconds = self.metrics.rpc_seconds.labels(method)

        async def timed(request: Any, context: Context) -> Any:
            start = time.perf_counter()
            code = "UNKNOWN"
            try:
                response = await inner(request, context)
                code = "OK"
                return response
            except asyncio.CancelledError:
                code = "CANCELLED"
                raise
            finally:
                seconds.observe(time.perf_counter() - start)
                status = context.code()
                if status is not None:
                    code = status.name
                count = counts.get(code)
                if count is None:
                    count = counts[code] = rpcs.labels(method, code)
                count.inc()

        return grpc.unary_unary_rpc_method_handler(
            timed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class _DatabaseGauges:
    """Gauges of the database's state, read at a scrape and kept GAUGE_MAX_AGE_S.

    collect() runs in the HTTP server's thread; the statement runs on the server's
    event loop, with its pool.
    """

    def __init__(
        self,
        read: Callable[[], Coroutine[Any, Any, Sequence[GaugeRow]]],
        loop: asyncio.AbstractEventLoop,
        max_age: Callable[[], float],
    ) -> None:
        self._read = read
        self._loop = loop
        self._max_age = max_age
        self._lock = threading.Lock()
        self._rows: Sequence[GaugeRow] = ()
        self._read_at: float | None = None
        self._up = 0

    def _refresh(self) -> None:
        if self._read_at is not None and time.monotonic() - self._read_at < self._max_age():
            return
        future = asyncio.run_coroutine_threadsafe(self._read(), self._loop)
        try:
            self._rows = future.result(GAUGE_TIMEOUT_S)
            self._up = 1
        except Exception as exc:
            future.cancel()
            self._up = 0
            log.warning("metrics: cannot read the database's gauges: %s", exc)
        self._read_at = time.monotonic()

    def describe(self) -> Iterator[Metric]:
        yield from self._families(())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            self._refresh()
            rows, up = self._rows, self._up
        yield from self._families(rows, up)

    @staticmethod
    def _families(rows: Sequence[Any], up: int = 0) -> Iterator[Metric]:
        runs = GaugeMetricFamily(
            "cyclone_runs",
            "Runs by status, all servers (completed runs are not counted: see "
            "cyclone_runs_finished_total)",
            labels=["status"],
        )
        ready = GaugeMetricFamily(
            "cyclone_steps_ready", "Steps ready to be claimed now, by action", labels=["action"]
        )
        oldest = GaugeMetricFamily(
            "cyclone_steps_ready_oldest_seconds",
            "How long the oldest ready step of each action has been waiting",
            labels=["action"],
        )
        backing_off = GaugeMetricFamily(
            "cyclone_steps_backing_off",
            "Steps available only later: waiting out a retry backoff, or a durable "
            "function's sleep or event wait, by action",
            labels=["action"],
        )
        running = GaugeMetricFamily(
            "cyclone_steps_running", "Steps leased to a worker, by action", labels=["action"]
        )
        expired = GaugeMetricFamily(
            "cyclone_steps_lease_expired",
            "Running steps whose lease expired and that no sweep has reclaimed yet",
            labels=["action"],
        )
        counts = {s: 0 for s in ("running", "blocked", "failed", "cancelled")}
        for row in rows:
            if row.part == "runs":
                counts[row.label] = row.n
            elif row.part == "available":
                ready.add_metric([row.label], row.n)
                backing_off.add_metric([row.label], row.extra)
                if row.age_s is not None:
                    oldest.add_metric([row.label], float(row.age_s))
            else:
                running.add_metric([row.label], row.n)
                expired.add_metric([row.label], row.extra)
        if rows or up:
            for status, n in counts.items():
                runs.add_metric([status], n)
        up_family = GaugeMetricFamily(
            "cyclone_database_up", "1 when the last read of the database's gauges succeeded"
        )
        up_family.add_metric([], up)
        yield from (runs, ready, oldest, backing_off, running, expired, up_family)
