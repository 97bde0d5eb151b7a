"""The HTTP ingress of one server process (``--http-listen``): approvals decided by
their one-time URL and signed webhooks.

- ``POST /callbacks/<token>``: the JSON body (empty: null) decides the approval whose
  token it is, once (approval_decide): 200 when this request decided it, 409 when it
  was decided already, 410 when it expired or its run finished, 404 for a token that
  is not (or no longer) one. ``GET /callbacks/<token>`` shows a person a page with
  what is asked and Approve and Reject buttons, which POST the form
  (``application/x-www-form-urlencoded``: the decision is then ``{"approved": bool,
  "comment": text}`` and the answer a page); a GET decides nothing.
- ``POST /webhooks/<name>``: a delivery signed with the webhook's secret
  (``Cyclone-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``), its
  timestamp within ``--webhook-tolerance`` of the server's clock, its delivery id
  (``Cyclone-Delivery``, else the signature) not seen before: the webhook's action
  (SendEvent or SubmitOnce) and the delivery id are recorded in one transaction. A bad
  signature or timestamp is 401 and a delivery seen before 409, with nothing
  recorded. docs/webhooks.md.

Every other answer is a JSON object: ``{"status": ...}`` on success, ``{"error": code,
"message": text}`` otherwise.

The server's dependencies hold no HTTP server framework, so this is the standard
library's threading HTTP server, on a thread of its own; each request runs its database
work on the server's event loop (asyncio.run_coroutine_threadsafe) and waits for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import html
import json
import logging
import re
import ssl
import threading
import time
import urllib.parse
import uuid
from collections.abc import Coroutine
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from service import errors
from service.api.callbacks import WEBHOOK_NAME, token_sha256
from service.config import Settings
from service.db import Database
from service.db.callbacks import WebhookRow
from service.tls import ListenError

log = logging.getLogger("cyclone")

T = TypeVar("T")

#: The signature header of a webhook delivery, and the optional delivery id header.
SIGNATURE_HEADER = "Cyclone-Signature"
DELIVERY_HEADER = "Cyclone-Delivery"
#: The actor of a decision made through an approval's URL.
CALLBACK_ACTOR = "callback"
#: What an approval token looks like (secrets.token_urlsafe); anything else is unknown.
_TOKEN = re.compile(r"[A-Za-z0-9_-]{20,200}")
#: How long a request waits for the database.
REQUEST_TIMEOUT_S = 30.0


class Refused(Exception):
    """An answer other than success: its HTTP status, error code and message."""

    def __init__(self, status: HTTPStatus, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.extra = extra


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The value at a JSON pointer (RFC 6901) in ``document``; KeyError when none."""
    if pointer == "":
        return document
    value = document
    for part in pointer[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(pointer)
    return value


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The v1 signature of a delivery: hex HMAC-SHA256 of "<timestamp>." + body."""
    message = str(timestamp).encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), message, hashlib.sha256).hexdigest()


def signature_header(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The Cyclone-Signature header a sender puts on ``body``."""
    at = int(time.time()) if timestamp is None else timestamp
    return f"t={at},v1={sign(secret, at, body)}"


def _parse_signature(header: str | None) -> tuple[int, list[str]]:
    if not header:
        raise Refused(HTTPStatus.UNAUTHORIZED, "no_signature", f"{SIGNATURE_HEADER} is missing")
    timestamp: int | None = None
    signatures: list[str] = []
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t" and value.isdigit() and len(value) <= 12:
            timestamp = int(value)
        elif key == "v1" and re.fullmatch(r"[0-9a-f]{64}", value):
            signatures.append(value)
    if timestamp is None or not signatures:
        raise Refused(
            HTTPStatus.UNAUTHORIZED,
            "bad_signature",
            f"{SIGNATURE_HEADER} must be t=<unix seconds>,v1=<64 hex digits>",
        )
    return timestamp, signatures


def verify(secret: str, header: str | None, body: bytes, tolerance_s: float) -> str:
    """Check a delivery's signature and timestamp (Refused, 401); its v1 signature."""
    timestamp, signatures = _parse_signature(header)
    if abs(time.time() - timestamp) > tolerance_s:
        raise Refused(
            HTTPStatus.UNAUTHORIZED,
            "timestamp_outside_tolerance",
            f"the signature's timestamp is more than {tolerance_s:g}s from the server's clock",
        )
    expected = sign(secret, timestamp, body)
    for given in signatures:
        if hmac.compare_digest(expected, given):
            return given
    raise Refused(HTTPStatus.UNAUTHORIZED, "bad_signature", "the signature does not match")


def _json_body(body: bytes) -> Any:
    if not body.strip():
        return None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise Refused(HTTPStatus.BAD_REQUEST, "bad_json", f"the body is not JSON: {exc}") from None


#: The page GET /callbacks/<token> shows a person: what is asked, and a form that POSTs
#: the decision (a GET decides nothing, so that a mail scanner that follows the link
#: does not decide for them).
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{title}</title>
<style>body{{font:16px/1.5 system-ui,sans-serif;max-width:36rem;margin:3rem auto;padding:0 1rem}}
textarea{{width:100%}}button{{font-size:1rem;padding:.4rem 1.2rem;margin-right:.5rem}}</style>
</head><body><main>
<h1>{title}</h1>
{body}
</main></body></html>
"""

_FORM = """<p>Run <code>{run_id}</code> ({workflow}, node {node}) asks for your decision, until
{expires} UTC. It can be given once.</p>
<form method="post">
<label for="comment">Comment (optional)</label>
<textarea id="comment" name="comment" rows="3" maxlength="1000"></textarea>
<p><button type="submit" name="approved" value="true">Approve</button>
<button type="submit" name="approved" value="false">Reject</button></p>
</form>"""


def _html(title: str, body: str) -> bytes:
    return _PAGE.format(title=html.escape(title), body=body).encode()


def _form_payload(body: bytes) -> dict[str, Any]:
    """The decision a person's form POSTed: {"approved": bool, "comment": text}."""
    fields = urllib.parse.parse_qs(body.decode("utf-8", "replace"), max_num_fields=10)
    approved = fields.get("approved", [""])[0]
    if approved not in ("true", "false"):
        raise Refused(HTTPStatus.BAD_REQUEST, "bad_form", "choose Approve or Reject")
    return {"approved": approved == "true", "comment": fields.get("comment", [""])[0][:1000]}


class Ingress:
    """What the HTTP requests do, on the server's event loop."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings

    async def callback_page(self, token: str) -> tuple[HTTPStatus, bytes]:
        """GET /callbacks/<token>: the approval's form, or why there is none."""
        row = None
        if _TOKEN.fullmatch(token):
            row = await self.db.callbacks.approval_by_token(token_sha256(token))
        if row is None:
            return HTTPStatus.NOT_FOUND, _html(
                "Not found", "<p>This link does not name an approval (any more).</p>"
            )
        title = row.title or "Approval"
        if row.decided_at is not None:
            when = f"{row.decided_at:%Y-%m-%d %H:%M}"
            return HTTPStatus.CONFLICT, _html(
                title, f"<p>This was decided already, at {when} UTC.</p>"
            )
        if row.expired:
            return HTTPStatus.GONE, _html(title, "<p>This approval has expired.</p>")
        form = _FORM.format(
            run_id=html.escape(str(row.run_id)),
            workflow=html.escape(row.workflow),
            node=html.escape(row.node),
            expires=f"{row.expires_at:%Y-%m-%d %H:%M}",
        )
        return HTTPStatus.OK, _html(title, form)

    async def callback(self, token: str, body: bytes, *, form: bool = False) -> dict[str, Any]:
        """POST /callbacks/<token>: a JSON body, or a person's form (``form``)."""
        if not _TOKEN.fullmatch(token):
            raise Refused(HTTPStatus.NOT_FOUND, "not_found", "no approval has this token")
        payload = _form_payload(body) if form else _json_body(body)
        row = await self.db.callbacks.approval_decide(
            token_sha256=token_sha256(token),
            approval_id=None,
            payload=payload,
            actor=CALLBACK_ACTOR,
        )
        if row.outcome == "unknown":
            raise Refused(HTTPStatus.NOT_FOUND, "not_found", "no approval has this token")
        ids = {"approval_id": str(row.approval_id), "run_id": str(row.run_id)}
        if row.outcome == "already_decided":
            assert row.decided_at is not None
            raise Refused(
                HTTPStatus.CONFLICT,
                "already_decided",
                f"this approval was decided already, at {row.decided_at.isoformat()}",
                decided_at=row.decided_at.isoformat(),
                **ids,
            )
        if row.outcome == "expired":
            raise Refused(HTTPStatus.GONE, "expired", "this approval has expired", **ids)
        if row.outcome == "finished":
            raise Refused(
                HTTPStatus.GONE, "run_finished", "the run of this approval has finished", **ids
            )
        log.info(
            "approval %s decided through its URL",
            row.approval_id,
            extra={"run_id": str(row.run_id)},
        )
        return {"status": "decided", **ids}

    async def webhook(self, name: str, headers: Any, body: bytes) -> dict[str, Any]:
        """POST /webhooks/<name>."""
        hook = await self.db.callbacks.webhook_get(name) if WEBHOOK_NAME.fullmatch(name) else None
        if hook is None:
            raise Refused(HTTPStatus.NOT_FOUND, "not_found", f"no webhook is named {name!r}")
        tolerance = self.settings.webhook_tolerance_s
        signature = verify(hook.secret, headers.get(SIGNATURE_HEADER), body, tolerance)
        delivery = headers.get(DELIVERY_HEADER) or f"v1={signature}"
        if not 1 <= len(delivery) <= 200 or not delivery.isprintable():
            raise Refused(
                HTTPStatus.BAD_REQUEST,
                "bad_delivery_id",
                f"{DELIVERY_HEADER} must be 1 to 200 printable characters",
            )
        payload = _json_body(body)
        run_id, key = _target(hook, payload)
        try:
            row = await self.db.callbacks.webhook_deliver(
                name=name,
                delivery_id=delivery,
                payload_json=json.dumps(payload, separators=(",", ":")),
                run_id=run_id,
                key=key,
                keep_s=2 * tolerance,
            )
        except errors.NotFound as exc:
            raise Refused(HTTPStatus.NOT_FOUND, "run_not_found", str(exc)) from None
        except errors.FailedPrecondition as exc:
            raise Refused(HTTPStatus.CONFLICT, "run_finished", str(exc)) from None
        except errors.InvalidArgument as exc:
            raise Refused(HTTPStatus.BAD_REQUEST, "invalid", str(exc)) from None
        if row.outcome == "unknown":
            raise Refused(HTTPStatus.NOT_FOUND, "not_found", f"no webhook is named {name!r}")
        if row.outcome == "replayed":
            raise Refused(
                HTTPStatus.CONFLICT, "replayed", f"delivery {delivery!r} was received already"
            )
        if row.outcome == "event_sent":
            log.info(
                "webhook %s sent event %s to run %s",
                name,
                hook.event,
                row.run_id,
                extra={"run_id": str(row.run_id)},
            )
            return {"status": "event_sent", "run_id": str(row.run_id), "event_id": row.event_id}
        log.info(
            "webhook %s submitted run %s (created %s)",
            name,
            row.run_id,
            row.created,
            extra={"run_id": str(row.run_id)},
        )
        return {"status": "submitted", "run_id": str(row.run_id), "created": row.created}


def _target(hook: WebhookRow, payload: Any) -> tuple[uuid.UUID | None, str | None]:
    """The run (send_event) or the key (submit_once) a delivery names."""
    pointer = hook.run_id_pointer if hook.action == "send_event" else hook.key_pointer
    assert pointer is not None
    try:
        value = resolve_pointer(payload, pointer)
    except KeyError:
        raise Refused(
            HTTPStatus.BAD_REQUEST, "missing_field", f"the body has no value at {pointer}"
        ) from None
    if hook.action == "send_event":
        try:
            return uuid.UUID(str(value)), None
        except ValueError:
            raise Refused(
                HTTPStatus.BAD_REQUEST, "bad_run_id", f"the value at {pointer} is not a run id"
            ) from None
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise Refused(
            HTTPStatus.BAD_REQUEST,
            "bad_key",
            f"the value at {pointer} must be a string or an integer",
        )
    return None, str(value)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "cyclone"

    def do_POST(self) -> None:
        try:
            answer = self._answer()
            if self._is_form():
                self._send_html(
                    HTTPStatus.OK, _html("Thank you", "<p>Your decision is recorded.</p>")
                )
            else:
                self._send(HTTPStatus.OK, answer)
        except Refused as refused:
            if self._is_form():
                why = f"<p>{html.escape(str(refused))}.</p>"
                self._send_html(refused.status, _html("Not recorded", why))
                return
            self._send(
                refused.status,
                {"error": refused.code, "message": str(refused), **refused.extra},
            )
        except errors.Unavailable:
            self._send(
                HTTPStatus.SERVICE_UNAVAILABLE,
                {"error": "unavailable", "message": "the database is unavailable; try again"},
            )
        except Exception:
            log.exception("HTTP ingress: %s failed", self.path)
            self._send(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                {"error": "internal", "message": "the server failed; see its log"},
            )

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        kind, _, token = path.lstrip("/").partition("/")
        if kind != "callbacks" or not token or "/" in token:
            self._send(
                HTTPStatus.METHOD_NOT_ALLOWED,
                {"error": "method_not_allowed", "message": "POST a JSON body"},
                allow="POST",
            )
            return
        try:
            status, page = self._on_loop(self.server.ingress.callback_page(token))
        except Exception:
            log.exception("HTTP ingress: the page of an approval failed")
            status, page = HTTPStatus.INTERNAL_SERVER_ERROR, _html("Error", "<p>Try again.</p>")
        self._send_html(status, page)

    def _is_form(self) -> bool:
        kind = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        return kind == "application/x-www-form-urlencoded" and self.path.startswith("/callbacks/")

    def _send_html(self, status: HTTPStatus, page: bytes) -> None:
        self._count("page" if status == HTTPStatus.OK else str(status.value))
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header(
            "Content-Security-Policy",
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
        )
        self.end_headers()
        self.wfile.write(page)

    def _answer(self) -> dict[str, Any]:
        path = self.path.split("?", 1)[0]
        kind, _, rest = path.lstrip("/").partition("/")
        if kind not in ("callbacks", "webhooks") or not rest or "/" in rest:
            raise Refused(HTTPStatus.NOT_FOUND, "not_found", f"nothing is served at {path}")
        body = self._body()
        ingress = self.server.ingress
        if kind == "callbacks":
            return self._on_loop(ingress.callback(rest, body, form=self._is_form()))
        return self._on_loop(ingress.webhook(rest, self.headers, body))

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise Refused(HTTPStatus.LENGTH_REQUIRED, "length_required", "send Content-Length")
        if int(length) > self.server.max_body:
            raise Refused(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                "too_large",
                f"the body is over {self.server.max_body} bytes",
            )
        return self.rfile.read(int(length))

    def _on_loop(self, work: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(work, self.server.loop)
        return future.result(REQUEST_TIMEOUT_S)

    def _count(self, outcome: str) -> None:
        counted = self.server.counted
        if counted is None:
            return
        kind = self.path.lstrip("/").partition("/")[0]
        endpoint = kind if kind in ("callbacks", "webhooks") else "other"
        counted.labels(endpoint, outcome).inc()

    def _send(self, status: HTTPStatus, answer: dict[str, Any], **headers: str) -> None:
        self._count(str(answer.get("status") or answer.get("error") or status.value))
        data = json.dumps(answer).encode() + b"\n"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        for name, value in headers.items():
            self.send_header(name.title(), value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        # Request lines name tokens: never logged.
        return


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    ingress: Ingress
    loop: asyncio.AbstractEventLoop
    max_body: int
    #: cyclone_http_requests_total (endpoint, outcome), or None.
    counted: Any


class HttpIngress:
    """The listener: started on the server's loop, stopped with the server."""

    def __init__(self, db: Database, settings: Settings, counted: Any = None) -> None:
        self.ingress = Ingress(db, settings)
        self.settings = settings
        #: A counter by endpoint and outcome (Metrics.http_requests), or None.
        self.counted = counted
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self, listen: str, loop: asyncio.AbstractEventLoop) -> int:
        """Listen on ``host:port`` (TLS with --tls-cert/--tls-key); the port bound."""
        host, _, port = listen.rpartition(":")
        try:
            server = _Server((host.strip("[]") or "127.0.0.1", int(port)), _Handler)
        except OSError as exc:
            raise ListenError(
                f"cannot serve --http-listen {listen}: {exc.strerror or exc}"
            ) from None
        server.ingress = self.ingress
        server.counted = self.counted
        server.loop = loop
        server.max_body = self.settings.max_payload_bytes
        if self.settings.tls_cert and self.settings.tls_key:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.settings.tls_cert, self.settings.tls_key)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.5},
            daemon=True,
            name="cyclone-http-ingress",
        )
        self._thread.start()
        self.port = server.server_address[1]
        return self.port

    def close(self) -> None:
        """Stop listening (up to half a second); requests in flight are dropped."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
