"""The gate every call passes before a servicer: who is calling, may they, and is the
request a well-formed message.

One server interceptor does both, because both must happen before any servicer code
runs. Authorization comes first, so a caller without credentials learns nothing from
how the server parses what it sent. Decoding is done here instead of by gRPC, so that
bytes that are not a valid message (truncated, random, invalid UTF-8 in a string)
are INVALID_ARGUMENT rather than gRPC's generic INTERNAL.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import grpc

from service.api import auth
from service.config import Settings

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"

log = logging.getLogger("cyclone")

#: Request size in bytes past which a request is decoded in a worker thread.
BIG_REQUEST = 1 << 20


class Gate(grpc.aio.ServerInterceptor):
    def __init__(self, settings: Settings) -> None:
        self.tokens = auth.Tokens(settings.token_file) if settings.token_file else None
        #: With mutual TLS, the client certificate authenticates; without a token file
        #: every certified client is admin.
        self.mtls = bool(settings.tls_client_ca)
        self.public_health = settings.public_health
        self.public_reflection = settings.public_reflection
        #: The wrapped handler of each registered method (a fixed set of names).
        self._handlers: dict[str, Handler] = {}

    @property
    def enabled(self) -> bool:
        return self.tokens is not None or self.mtls

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        method = handler_call_details.method
        known = self._handlers.get(method)
        if known is not None:
            return known
        handler = await continuation(handler_call_details)
        if handler is None:
            # An unknown method: gRPC answers UNIMPLEMENTED. Not remembered, so that
            # a client calling made-up names cannot grow this table.
            return None
        wrapped = self._handlers[method] = self._wrap(method, handler)
        return wrapped

    # Per call -------------------------------------------------------------------

    def _identify(self, method: str, context: Context) -> auth.Identity | str:
        """The caller's identity, or why the call is refused (a status code name)."""
        identity = None
        if self.tokens is not None:
            try:
                token = auth.bearer_token(context.invocation_metadata())
            except ValueError as exc:
                return f"UNAUTHENTICATED:{exc}"
            if token is not None:
                identity = self.tokens.identify(token)
                if identity is None:
                    return "UNAUTHENTICATED:unknown or revoked token"
        else:
            identity = _certificate_identity(context)
        public = auth.allowed(
            None,
            method,
            public_health=self.public_health,
            public_reflection=self.public_reflection,
        )
        if identity is None:
            if public:
                return auth.Identity("anonymous", "")
            return "UNAUTHENTICATED:this call needs a token: send 'authorization: Bearer <token>'"
        if public or auth.allowed(
            identity.role, method, public_health=False, public_reflection=False
        ):
            return identity
        return f"PERMISSION_DENIED:role {identity.role} ({identity.name}) may not call {method}"

    async def _admit(self, method: str, context: Context) -> None:
        if not self.enabled:
            return
        verdict = self._identify(method, context)
        if isinstance(verdict, str):
            code, _, message = verdict.partition(":")
            log.info("refused %s from %s: %s", method, context.peer(), message)
            await context.abort(grpc.StatusCode[code], message)
        if verdict.role:
            auth.caller.set(verdict)

    # Handlers --------------------------------------------------------------------

    def _wrap(self, method: str, handler: Handler) -> Handler:
        """The same handler behind the gate. Requests arrive as bytes and are decoded
        here, a streamed one message by message. A servicer may answer with bytes it
        serialized itself (WorkerService.Work does): they are sent as they are."""
        kind = next(k for k in _MAKERS if getattr(handler, k) is not None)
        # The stubs type a handler as a plain function; under grpc.aio it is async.
        inner: Any = getattr(handler, kind)
        admit = self._admit
        decode = _decoder(method, handler.request_deserializer)

        async def unary_unary(request: bytes, context: Context) -> Any:
            await admit(method, context)
            return await inner(await decode(request, context), context)

        async def unary_stream(request: bytes, context: Context) -> Any:
            await admit(method, context)
            result = inner(await decode(request, context), context)
            if not hasattr(result, "__aiter__"):
                await result  # a handler that writes with context.write
                return
            async for response in result:
                yield response

        async def decoded(requests: Any, context: Context) -> Any:
            async for raw in requests:
                yield await decode(raw, context)

        async def stream_unary(requests: Any, context: Context) -> Any:
            await admit(method, context)
            return await inner(decoded(requests, context), context)

        async def stream_stream(requests: Any, context: Context) -> Any:
            await admit(method, context)
            async for response in inner(decoded(requests, context), context):
                yield response

        behaviors = {
            "unary_unary": unary_unary,
            "unary_stream": unary_stream,
            "stream_unary": stream_unary,
            "stream_stream": stream_stream,
        }
        return _MAKERS[kind](
            behaviors[kind],
            request_deserializer=None,
            response_serializer=_serializer(handler.response_serializer),
        )


_MAKERS = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def _serializer(serialize: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """A response serializer that sends bytes as they are and serializes messages."""
    if serialize is None:
        return None

    def serializer(response: Any) -> bytes:
        return response if type(response) is bytes else serialize(response)

    return serializer


def _decoder(method: str, deserializer: Callable[[bytes], Any] | None) -> Any:
    name = method.rpartition("/")[2]

    async def decode(raw: bytes, context: Context) -> Any:
        if deserializer is None:
            return raw
        try:
            if len(raw) > BIG_REQUEST:
                # Decoding megabytes takes a while: not on the event loop.
                return await asyncio.to_thread(deserializer, raw)
            return deserializer(raw)
        except Exception:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the request is not a valid {name} request message (bad protobuf bytes "
                "or invalid UTF-8 in a string field)",
            )

    return decode


def _certificate_identity(context: Context) -> auth.Identity | None:
    """The admin identity of a client that presented a certificate the client CA signed
    (gRPC refuses the handshake of any other)."""
    ctx = context.auth_context() or {}
    names = ctx.get("x509_common_name") or ctx.get("x509_subject_alternative_name") or ()
    name = next(iter(names), None)
    if name is None:
        return None
    return auth.Identity(name.decode(errors="replace"), "admin")


def interceptors(settings: Settings) -> list[grpc.aio.ServerInterceptor]:
    return [Gate(settings)]
