"""The console's web application: sessions, CSRF, security headers, and the one gRPC
channel to Cyclone that every page's calls share (the templates are in :mod:`console.pages`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from urllib.parse import quote, urlsplit

import grpc
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from console import actions, approvals, bulk, streams, views
from console.pages import HERE, Console, http_status, render
from console.sessions import COOKIE, Session, Sessions
from pyclient.errors import CycloneError, Unauthenticated

log = logging.getLogger("cyclone.console")

#: Scripts, styles and images only from the console itself; no framing, no referrer to other sites.
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


class _Sessions(BaseHTTPMiddleware):
    """Finds the browser's session (signed in, or anonymous and kept nowhere), checks
    CSRF on every POST, sets headers."""

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        sessions: Sessions = request.app.state.sessions
        cookie = request.cookies.get(COOKIE)
        session = sessions.find(cookie) or sessions.anonymous(cookie)
        request.state.session = session
        if request.method == "POST" and not await _csrf_ok(request, session):
            response: Response = PlainTextResponse(
                "Refused: this form is stale or came from another site. Reload the page "
                "and try again.",
                status_code=403,
            )
        else:
            response = await call_next(request)
        final: Session = request.state.session  # sign-in and sign-out renew it
        if final.id != cookie:
            response.set_cookie(
                COOKIE,
                final.id,
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        if not request.url.path.startswith("/static/"):
            response.headers["cache-control"] = "no-store"
        return response


async def _csrf_ok(request: Request, session: Session) -> bool:
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        return False
    form = await request.form()
    # The view's Request is another object on the same scope: it reads the form here.
    request.state.form = {k: v for k, v in form.items() if isinstance(v, str)}
    presented = form.get("csrf")
    return session.csrf_ok(presented if isinstance(presented, str) else None)


async def _cyclone_error(request: Request, exc: Exception) -> Response:
    """A refused or failed call: sign in when a token is needed, else say what failed."""
    assert isinstance(exc, CycloneError)
    if isinstance(exc, Unauthenticated) and request.method == "GET":
        if request.headers.get("hx-request"):
            # A live region's refresh: the whole page goes to sign-in, not the region.
            page = request.headers.get("hx-current-url", "/runs")
            target = urlsplit(page)._replace(scheme="", netloc="").geturl() or "/runs"
            login = f"/login?next={quote(target, safe='')}"
            return Response(status_code=204, headers={"hx-redirect": login})
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
    return render(request, "error.html", {"error": exc}, status_code=http_status(exc))


def create_app(
    address: str,
    *,
    actor: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    sessions: Sessions | None = None,
) -> Starlette:
    """The console for the Cyclone server at ``address`` (host:port); ``sessions``: where
    it keeps its signed-in sessions (new ones by default)."""

    console = Console(address, actor, credentials)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        console.channel = (
            grpc.aio.secure_channel(address, credentials)
            if credentials
            else grpc.aio.insecure_channel(address)
        )
        try:
            yield
        finally:
            await console.channel.close()

    app = Starlette(
        routes=[
            *actions.routes,
            *approvals.routes,
            *bulk.routes,
            *streams.routes,
            *views.routes,
            Mount("/static", StaticFiles(directory=HERE / "static")),
        ],
        middleware=[Middleware(_Sessions)],
        exception_handlers={CycloneError: _cyclone_error},
        lifespan=lifespan,
    )
    app.state.console = console
    app.state.sessions = sessions if sessions is not None else Sessions()
    return app


class ListenError(OSError):
    """The console cannot listen on the address it was given."""


def _bind(listen: str) -> socket.socket:
    """A listening socket on ``listen`` (host:port, port 0 for a free one)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ListenError(
            f"cannot serve the console on {listen!r}: not host:port with a port from 0 to 65535"
        )
    try:
        return socket.create_server((host.strip("[]") or "127.0.0.1", int(port)))
    except OSError as exc:
        # The errno's own words: create_server adds the address again to some.
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ListenError(f"cannot serve the console on {listen}: {reason}") from None


async def serve(
    address: str,
    listen: str,
    *,
    actor: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    started: Callable[[str], None] | None = None,
    sessions: Sessions | None = None,
) -> None:
    """Serve the console on ``listen`` (host:port; port 0 picks one) until cancelled.

    The port is bound here first, so a port in use (or out of range) is a ListenError
    for the caller (uvicorn would exit the process). ``started`` gets the console's URL
    once it serves.
    """
    import uvicorn

    class Server(uvicorn.Server):
        # The caller handles signals (the CLI's asyncio.run, or cyclone-server's loop).
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    sock = _bind(listen)
    host = listen.rpartition(":")[0].strip("[]") or "127.0.0.1"
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(address, actor=actor, credentials=credentials, sessions=sessions),
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    server = Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        while not server.started:  # uvicorn has no event for it
            if task.done():
                await task
                raise OSError(f"the console did not start on {listen}")
            await asyncio.sleep(0.02)
        if started is not None:
            started(f"http://{host}:{bound}/")
        await asyncio.shield(task)
    except asyncio.CancelledError:
        server.should_exit = True
        await task
        raise
    finally:
        sock.close()
