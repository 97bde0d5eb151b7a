"""OpenTelemetry in the SDK, when it is installed and the program set a tracer provider
(docs/tracing.md). The SDK never requires it, nor loads it: only once the program has
loaded OpenTelemetry's API does this module use it.

- A client's Submit and SubmitOnce carry the current trace context in their metadata
  (the standard propagator's ``traceparent`` and ``tracestate``): :func:`with_context`.
- A worker runs each step of a traced run (ClaimedStep.traceparent set) under a span
  that is a child of the run's trace context: :func:`step_tracer`, :func:`step_span`,
  :func:`end_step_span`.
"""

from __future__ import annotations

import sys
from typing import Any

#: The calls that carry the trace context: the run continues the caller's trace.
SUBMITS = frozenset({"Submit", "SubmitOnce"})

#: Metadata as the clients send it.
Metadata = tuple[tuple[str, str], ...]

_inject: Any = None


def _injector() -> Any:
    """OpenTelemetry's inject, or None while the program has not loaded OpenTelemetry's
    API (a program with a span has): the SDK never loads it itself."""
    global _inject
    if _inject is None and "opentelemetry.trace" in sys.modules:
        from opentelemetry import propagate

        _inject = propagate.inject
    return _inject


def with_context(metadata: Metadata) -> Metadata:
    """``metadata`` and the current trace context's headers, if there is a span."""
    inject = _injector()
    if inject is None:
        return metadata
    carrier: dict[str, str] = {}
    inject(carrier)
    if not carrier:
        return metadata
    return (*metadata, *((k.lower(), v) for k, v in carrier.items()))


def step_tracer() -> Any:
    """The tracer of step spans: None when OpenTelemetry is not installed or no tracer
    provider was set (then steps cost nothing more)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:  # the program never loaded it, so it set no tracer provider
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer("cyclone.worker")


def step_span(tracer: Any, step: Any, worker_id: str) -> Any:
    """A started span for the handler of ``step`` (a ClaimedStep with a traceparent),
    a child of its run's trace context."""
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract({"traceparent": step.traceparent})
    span = tracer.start_span(f"step {step.node}", context=parent, kind=SpanKind.CONSUMER)
    span.set_attributes(
        {
            "cyclone.run_id": step.run_id,
            "cyclone.node": step.node,
            "cyclone.workflow": step.workflow,
            "cyclone.action": step.action,
            "cyclone.attempt": step.attempt,
            "cyclone.worker_id": worker_id,
        }
    )
    return span


def in_span(action: Any, span: Any) -> Any:
    """``action`` (an Action) with its handler run with ``span`` as the current span, so
    that the spans the handler makes are children of its step's."""
    import dataclasses

    from opentelemetry import context, trace

    current = trace.set_span_in_context(span)
    fn = action.fn

    async def traced_async(*args: Any) -> Any:
        token = context.attach(current)
        try:
            return await fn(*args)
        finally:
            context.detach(token)

    def traced(*args: Any) -> Any:
        token = context.attach(current)
        try:
            return fn(*args)
        finally:
            context.detach(token)

    return dataclasses.replace(action, fn=traced_async if action.is_async else traced)


def end_step_span(span: Any, outcome: str, error: BaseException | None = None) -> None:
    """End a step's span: ``outcome`` (completed, failed, dropped, stopped) as an
    attribute, the status ERROR with the exception for a failure."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("cyclone.outcome", outcome)
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    elif outcome == "completed":
        span.set_status(Status(StatusCode.OK))
    elif outcome == "stopped":
        span.set_status(Status(StatusCode.ERROR, "the worker stopped"))
    span.end()
