"""What every page of the console shares: the connection settings (:class:`Console`),
the request's session, form and client, and the templates that render pages."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jinja2
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from console import text, timeline
from console.sessions import Session
from pyclient.client import AsyncClient
from pyclient.errors import CycloneError

HERE = Path(__file__).parent
#: Longest text shown whole; longer inputs, outputs and messages are cut, saying so.
MAX_SHOWN = 20_000


@dataclass
class Console:
    """What every request needs: the server's address, the channel to it, the actor."""

    address: str
    actor: str | None
    credentials: grpc.ChannelCredentials | None = None
    channel: grpc.aio.Channel | None = None

    def client(self, token: str | None) -> AsyncClient:
        assert self.channel is not None, "the console's channel opens with the app"
        return AsyncClient(self.address, token=token, actor=self.actor, channel=self.channel)


def session_of(request: Request) -> Session:
    found: Session = request.state.session
    return found


def form_of(request: Request) -> dict[str, str]:
    """The fields of a POST's form (read once, by the CSRF check)."""
    found: dict[str, str] = request.state.form
    return found


def client_of(request: Request) -> AsyncClient:
    console: Console = request.app.state.console
    return console.client(session_of(request).token)


def http_status(exc: CycloneError) -> int:
    by_code = {
        grpc.StatusCode.NOT_FOUND: 404,
        grpc.StatusCode.PERMISSION_DENIED: 403,
        grpc.StatusCode.UNAUTHENTICATED: 401,
        grpc.StatusCode.INVALID_ARGUMENT: 400,
        grpc.StatusCode.FAILED_PRECONDITION: 409,
        grpc.StatusCode.UNAVAILABLE: 502,
        grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    }
    return by_code.get(exc.code, 500) if exc.code is not None else 500


def error_code(exc: CycloneError) -> str:
    return exc.code.name if exc.code is not None else "ERROR"


def _when(value: dt.datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty(value: Any) -> str:
    """A JSON value for people: indented, cut when huge (the template escapes it)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    return cut(text)


def cut(text: str, limit: int = MAX_SHOWN) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n… (cut: {len(text) - limit:,} more characters)"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=_when, pretty=_pretty, cut=cut, code=error_code)
    env.filters.update(clip=text.clip, started=text.started, duration=text.duration)
    env.globals.update(timeline_of=timeline.timeline_of)
    return env


templates = Jinja2Templates(env=_environment())


def render(
    request: Request, name: str, context: dict[str, Any], *, status_code: int = 200
) -> Response:
    session = session_of(request)
    console: Console = request.app.state.console
    base = {"csrf": session.csrf, "signed_in": session.token is not None, "console": console}
    return templates.TemplateResponse(request, name, {**base, **context}, status_code=status_code)
