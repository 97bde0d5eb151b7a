"""The server's span around each unary RPC, when --tracing is on (service.tracing;
docs/tracing.md). This module is imported only then."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from service.tracing import carrier, propagator

#: Services whose calls are not traced: health checks and reflection are noise.
UNTRACED = ("/grpc.health.", "/grpc.reflection.")
#: Request fields copied to a span's attributes.
ATTRIBUTES = (("run_id", "cyclone.run_id"), ("node", "cyclone.node"))

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
#: What an interceptor calls for the next one's handler.
Next: TypeAlias = "Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]]"


class Interceptor(grpc.aio.ServerInterceptor):
    """A SERVER span around each unary RPC, in the caller's trace when it sent one."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self._handlers: dict[str, Handler | None] = {}

    async def intercept_service(self, continuation: Next, call: grpc.HandlerCallDetails) -> Any:
        name = call.method
        if name in self._handlers:
            return self._handlers[name]
        handler = await continuation(call)
        if handler is None or handler.unary_unary is None or name.startswith(UNTRACED):
            return handler
        wrapped = grpc.unary_unary_rpc_method_handler(
            self._traced(name, handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        self._handlers[name] = wrapped
        return wrapped

    def _traced(self, name: str, inner: Any) -> Any:
        service, _, method = name.lstrip("/").partition("/")
        span_name = f"{service}/{method}"
        tracer = self.tracer
        extract = propagator().extract

        async def traced(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            parent = extract(carrier(context.invocation_metadata()))
            with tracer.start_as_current_span(
                span_name,
                context=parent,
                kind=SpanKind.SERVER,
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                span.set_attributes(
                    {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
                )
                span.set_attributes(request_attributes(request))
                try:
                    response = await inner(request, context)
                except BaseException as exc:
                    code = _code(context, exc)
                    span.set_attribute("rpc.grpc.status_code", code.value[0])
                    span.set_status(Status(StatusCode.ERROR, f"{code.name}: {context.details()}"))
                    raise
                span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.OK.value[0])
                return response

        return traced


def _code(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> grpc.StatusCode:
    """The status a call ended with, as far as its context knows."""
    code: Any = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    for known in grpc.StatusCode:
        if known.value[0] == code:
            return known
    return grpc.StatusCode.UNKNOWN if isinstance(exc, Exception) else grpc.StatusCode.CANCELLED


def request_attributes(request: Any) -> dict[str, str]:
    """cyclone.run_id, cyclone.node and cyclone.workflow, of the request fields that
    name them."""
    found: dict[str, str] = {}
    for field, attribute in ATTRIBUTES:
        value = getattr(request, field, None)
        if isinstance(value, str) and value:
            found[attribute] = value
    workflow = getattr(request, "workflow", None)
    if isinstance(workflow, str):
        if workflow:
            found["cyclone.workflow"] = workflow
    elif isinstance(name := getattr(workflow, "name", None), str) and name:
        found["cyclone.workflow"] = name
    return found
