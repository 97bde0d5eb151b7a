"""The console's actions beyond one run's retry, resolve and cancel: sending an event
to a waiting node, and retrying the failed runs of a filtered list at once.

Each is a page with its form (the confirmation), and a POST that keeps the CSRF check
of every form and leaves roles to the server: what it refuses, the page shows, with
nothing written. The server records each in the run's audit trail (SendEvent as
``send_event``, RetryAll as ``retry_all``), with the signed-in token's
name as the actor."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from console import start
from console.pages import client_of, form_of, http_status, render
from console.views import RunFilters, awaited_event
from pyclient.errors import CycloneError, InvalidArgument, PermissionDenied, Unauthenticated
from pyclient.models import Run, RunStatus

#: Most failed runs one bulk retry takes; the page says when more match.
BULK_LIMIT = 500
#: Runs named on the bulk retry's confirmation page.
BULK_SHOWN = 20


def json_field(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{what} is not valid JSON: {exc}") from None


async def event_form(request: Request) -> Response:
    run = await client_of(request).get_run(request.path_params["run_id"])
    node = request.query_params.get("node", "")
    step = next((s for s in run.steps if s.node == node), None)
    form = {"name": awaited_event(step) if step else "", "payload": "null", "key": ""}
    return _event_page(request, run, node, form, None)


def _event_page(
    request: Request,
    run: Run,
    node: str,
    form: Mapping[str, str],
    error: CycloneError | None,
) -> Response:
    return render(
        request,
        "event.html",
        {"run": run, "node": node, "form": form, "error": error},
        status_code=200 if error is None else http_status(error),
    )


async def event_send(request: Request) -> Response:
    run_id = request.path_params["run_id"]
    node = request.query_params.get("node", "")
    form = {k: v for k, v in form_of(request).items() if k != "csrf"}
    name = form.get("name", "").strip()
    key = form.get("key", "").strip()
    client = client_of(request)
    try:
        if not name:
            raise InvalidArgument("name the event to send")
        payload = json_field(form.get("payload", "").strip() or "null", "the payload")
        sent = await client.send_event(run_id, name, payload, key or None)
    except CycloneError as exc:
        run = await client.get_run(run_id)
        return _event_page(request, run, node, form, exc)
    if sent.created:
        done = f"Sent event {name} (event {sent.event_id})."
    else:
        done = f"An event with key {key} was sent before (event {sent.event_id}): nothing sent."
    query = {"node": node, "done": done} if node else {"done": done}
    return RedirectResponse(f"/runs/{run_id}?" + urlencode(query), status_code=303)


async def _failed_runs(request: Request, f: RunFilters) -> tuple[list[Run], bool]:
    """The failed runs matching the filters, newest first, at most BULK_LIMIT; and
    whether more match."""
    client = client_of(request)
    found: list[Run] = []
    token = ""
    while True:
        page = await client.list_runs(
            status=[RunStatus.FAILED.value],
            page_size=min(200, BULK_LIMIT + 1 - len(found)),
            page_token=token,
            **f.api(),
        )
        found.extend(page.runs)
        token = page.next_page_token
        if not token or len(found) > BULK_LIMIT:
            return found[:BULK_LIMIT], len(found) > BULK_LIMIT or bool(token)


async def bulk_confirm(request: Request) -> Response:
    return await _bulk_page(request, None, {}, status_code=200)


async def _bulk_page(
    request: Request,
    error: CycloneError | None,
    form: Mapping[str, str],
    *,
    status_code: int,
) -> Response:
    f = RunFilters.of(request)
    try:
        runs, more = await _failed_runs(request, f)
    except InvalidArgument as exc:
        runs, more, error = [], False, exc
        status_code = 400
    return render(
        request,
        "bulk_retry.html",
        {
            "f": f,
            "runs": runs,
            "shown": runs[:BULK_SHOWN],
            "more": more,
            "limit": BULK_LIMIT,
            "form": form,
            "error": error,
            "outcome": None,
        },
        status_code=status_code,
    )


async def bulk_retry(request: Request) -> Response:
    """RetryAll for each run the confirmation listed (still failed or not: the server
    decides per run). A refusal of the caller's role stops at the first run, so a token
    that may not retry changes nothing."""
    form = {k: v for k, v in form_of(request).items() if k != "csrf"}
    run_ids = form.get("runs", "").split()
    reason = form.get("reason", "").strip()
    if not run_ids or len(run_ids) > BULK_LIMIT:
        refused = InvalidArgument(f"name 1 to {BULK_LIMIT} runs to retry")
        return await _bulk_page(request, refused, form, status_code=400)
    client = client_of(request)
    retried: list[tuple[str, tuple[str, ...]]] = []
    skipped: list[tuple[str, str]] = []
    for run_id in run_ids:
        try:
            answer = await client.retry_all(run_id, reason)
        except (PermissionDenied, Unauthenticated) as exc:
            if not retried:
                return await _bulk_page(request, exc, form, status_code=http_status(exc))
            skipped.append((run_id, exc.message))
            break
        except CycloneError as exc:
            skipped.append((run_id, exc.message))
        else:
            retried.append((run_id, answer.nodes))
    return render(
        request,
        "bulk_retry.html",
        {
            "f": RunFilters.of(request),
            "outcome": {"retried": retried, "skipped": skipped, "asked": len(run_ids)},
            "error": None,
        },
    )


def bulk_offered(f: RunFilters) -> bool:
    """Whether the runs page offers the bulk retry: its status filter allows failed runs."""
    return not f.statuses or RunStatus.FAILED.value in f.statuses


routes = [
    Route("/runs/new", start.start_form, methods=["GET"]),
    Route("/runs/new", start.start_submit, methods=["POST"]),
    Route("/runs/retry-failed", bulk_confirm, methods=["GET"]),
    Route("/runs/retry-failed", bulk_retry, methods=["POST"]),
    Route("/runs/{run_id}/event", event_form, methods=["GET"]),
    Route("/runs/{run_id}/event", event_send, methods=["POST"]),
]
