"""The HTTP ingress of one server process (``--http-listen``): approvals decided by
their one-time URL and signed webhooks.

- ``POST /callbacks/<token>``: the JSON body (empty: null) decides the approval whose
  token it is, once (approval_decide): 200 when this request decided it, 409 when it
  was decided already, 410 when it expired or its run finished, 404 for a token that
  is not (or no longer) one.
- ``POST /webhooks/<name>``: a delivery signed with the webhook's secret
  (``Cyclone-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``), its
  timestamp within ``--webhook-tolerance`` of the server's clock, its delivery id
  (``Cyclone-Delivery``, else the signature) not seen before: the webhook's action
  (SendEvent or SubmitOnce) and the delivery id are recorded in one transaction. A bad
  signature or timestamp is 401 and a delivery seen before 409, with nothing
  recorded. docs/webhooks.md.

Every answer is a JSON object: ``{"status": ...}`` on success, ``{"error": code,
"message": text}`` otherwise.

The server's dependencies hold no HTTP server framework, so this is the standard
library's threading HTTP server, on a thread of its own; each request runs its database
work on the server's event loop (asyncio.run_coroutine_threadsafe) and waits for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import ssl
import threading
import time
import uuid
from collections.abc import Coroutine
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from service import errors
from service.api.callbacks import WEBHOOK_NAME, token_sha256
from service.config import Settings
from service.db import Database
from service.db.callbacks import WebhookRow

log = logging.getLogger("cyclone")

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


class Ingress:
    """What the HTTP requests do, on the server's event loop."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings

    async def callback(self, token: str, body: bytes) -> dict[str, Any]:
        """POST /callbacks/<token>."""
        if not _TOKEN.fullmatch(token):
            raise Refused(HTTPStatus.NOT_FOUND, "not_found", "no approval has this token")
        payload = _json_body(body)
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
            self._send(HTTPStatus.OK, answer)
        except Refused as refused:
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
        self._send(
            HTTPStatus.METHOD_NOT_ALLOWED,
            {"error": "method_not_allowed", "message": "POST a JSON body"},
            allow="POST",
        )

    def _answer(self) -> dict[str, Any]:
        path = self.path.split("?", 1)[0]
        kind, _, rest = path.lstrip("/").partition("/")
        if kind not in ("callbacks", "webhooks") or not rest or "/" in rest:
            raise Refused(HTTPStatus.NOT_FOUND, "not_found", f"nothing is served at {path}")
        body = self._body()
        ingress = self.server.ingress
        if kind == "callbacks":
            return self._on_loop(ingress.callback(rest, body))
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

    def _on_loop(self, work: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
        future = asyncio.run_coroutine_threadsafe(work, self.server.loop)
        return future.result(REQUEST_TIMEOUT_S)

    def _send(self, status: HTTPStatus, answer: dict[str, Any], **headers: str) -> None:
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


class HttpIngress:
    """The listener: started on the server's loop, stopped with the server."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.ingress = Ingress(db, settings)
        self.settings = settings
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self, listen: str, loop: asyncio.AbstractEventLoop) -> int:
        """Listen on ``host:port`` (TLS with --tls-cert/--tls-key); the port bound."""
        host, _, port = listen.rpartition(":")
        server = _Server((host.strip("[]") or "127.0.0.1", int(port)), _Handler)
        server.ingress = self.ingress
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
