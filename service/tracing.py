"""OpenTelemetry spans of the server (``--tracing``; docs/tracing.md).

Off by default, and then nothing here is imported: no OpenTelemetry code runs per
request. On, the server has a tracer provider of its own (it leaves the process's
global one alone) exporting by OTLP (gRPC or HTTP, the standard exporters, configured
by the standard OTEL_EXPORTER_OTLP_* variables) or to the console, and:

- each unary RPC is a SERVER span, a child of the W3C trace context the caller sent in
  its metadata (``traceparent``, ``tracestate``), with the run, node and workflow the
  request names as attributes (service.api.tracing);
- Submit stores its span's traceparent with the run, so that the steps of the run,
  handed out later and elsewhere, continue its trace;
- each step handed out with a traceparent gets a "claim" span, and its outcome a
  "complete" span, both in the run's trace (:class:`StepSpans`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

#: The values of --tracing.
CHOICES = ("off", "otlp", "otlp-http", "console")

#: A W3C traceparent of version 00, the only one this server stores or continues.
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
#: Longest tracestate header taken from a caller (the W3C's advice: at least 512 kept).
MAX_TRACESTATE = 512


class Unavailable(Exception):
    """--tracing asks for an exporter whose packages are not installed."""


def valid_traceparent(value: str) -> bool:
    """Whether ``value`` is a well-formed traceparent of version 00 naming a trace and a
    span (all-zero ids are invalid)."""
    match = TRACEPARENT.fullmatch(value)
    return match is not None and match.group(1) != "0" * 32 and match.group(2) != "0" * 16


def carrier(metadata: Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    """The trace context headers of a call's metadata, those malformed or too long
    left out (then the call's span starts a trace of its own)."""
    found: dict[str, str] = {}
    for key, value in metadata or ():
        if key == "traceparent" and isinstance(value, str) and valid_traceparent(value):
            found["traceparent"] = value
        elif key == "tracestate" and isinstance(value, str) and len(value) <= MAX_TRACESTATE:
            found["tracestate"] = value
    if "traceparent" not in found:
        found.pop("tracestate", None)
    return found


def propagator() -> Any:
    """The W3C trace context propagator (whatever OTEL_PROPAGATORS says: the stored
    traceparent is W3C's)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def format_traceparent(span: Any) -> str | None:
    """The traceparent of ``span`` (an OpenTelemetry span), None when it has no valid
    context."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def exporter(mode: str) -> Any:
    """The span exporter of ``--tracing mode`` (not off)."""
    try:
        if mode == "otlp":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            return OTLPSpanExporter()
        if mode == "otlp-http":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter as HttpExporter,
            )

            return HttpExporter()
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    except ImportError as exc:
        raise Unavailable(
            f"--tracing {mode} needs the OpenTelemetry packages: "
            f"pip install 'cyclone-workflows[tracing]' ({exc})"
        ) from None


class Tracing:
    """The server's tracer provider and what makes spans with it."""

    def __init__(self, mode: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        span_exporter = exporter(mode)
        # OTEL_SERVICE_NAME (and OTEL_RESOURCE_ATTRIBUTES) win over this default.
        name = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "cyclone-server"}
        self.provider: TracerProvider = TracerProvider(resource=Resource.create(name))
        self.provider.add_span_processor(BatchSpanProcessor(span_exporter))
        self.tracer: Tracer = self.provider.get_tracer("cyclone.server")

    def steps(self) -> StepSpans:
        return StepSpans(self.tracer)

    def shutdown(self) -> None:
        """Export what is left, then stop."""
        self.provider.shutdown()


def start(mode: str) -> Tracing | None:
    """The server's tracing for ``--tracing mode``; None when off."""
    return None if mode == "off" else Tracing(mode)


def submit_traceparent() -> str | None:
    """The traceparent that Submit stores with a run: its own span's."""
    from opentelemetry import trace

    return format_traceparent(trace.get_current_span())


class StepSpans:
    """Spans of steps in their run's trace: one when a step is handed out, one when its
    outcome is applied. Both are children of the run's stored traceparent."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.extract = propagator().extract

    def _span(self, name: str, traceparent: str, attributes: dict[str, Any]) -> None:
        parent = self.extract({"traceparent": traceparent})
        span = self.tracer.start_span(name, context=parent)
        span.set_attributes(attributes)
        span.end()

    def claimed(self, traceparent: str, run_id: Any, node: str, action: str, attempt: int) -> None:
        self._span(
            f"claim {node}",
            traceparent,
            {
                "cyclone.run_id": str(run_id),
                "cyclone.node": node,
                "cyclone.action": action,
                "cyclone.attempt": attempt,
            },
        )

    def completed(
        self, traceparent: str, run_id: Any, node: str, step_status: str, run_status: str
    ) -> None:
        self._span(
            f"complete {node}",
            traceparent,
            {
                "cyclone.run_id": str(run_id),
                "cyclone.node": node,
                "cyclone.step_status": step_status,
                "cyclone.run_status": run_status,
            },
        )
