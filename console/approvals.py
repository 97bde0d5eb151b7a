"""The console's approvals: the pending approvals of durable functions
(wait_for_approval), each with Approve and Reject.

The page lists them (ListApprovals; ``?run=`` for one run's). A decision is a POST
with the CSRF check of every form and an optional comment; the server checks the
caller's role (DecideApproval is an admin's) and records it in the run's audit trail
(``decide_approval``) with the signed-in token's name as the actor. What it refuses,
the page shows, with nothing written."""

from __future__ import annotations

from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from console.pages import client_of, form_of, http_status, render
from pyclient.errors import CycloneError, InvalidArgument


async def _page(
    request: Request, error: CycloneError | None = None, *, status_code: int = 200
) -> Response:
    run = request.query_params.get("run", "").strip() or None
    try:
        pending = await client_of(request).list_approvals(run)
    except InvalidArgument as exc:
        pending, error, status_code = [], exc, 400
    return render(
        request,
        "approvals.html",
        {
            "approvals": pending,
            "run": run,
            "error": error,
            "done": request.query_params.get("done", ""),
        },
        status_code=status_code,
    )


async def approvals_page(request: Request) -> Response:
    return await _page(request)


async def decide(request: Request) -> Response:
    approval_id = request.path_params["approval_id"]
    form = form_of(request)
    choice = form.get("decision", "")
    comment = form.get("comment", "").strip()
    try:
        if choice not in ("approve", "reject"):
            raise InvalidArgument("choose approve or reject")
        await client_of(request).decide_approval(approval_id, choice == "approve", comment)
    except CycloneError as exc:
        return await _page(request, exc, status_code=http_status(exc))
    done = f"Approval {approval_id} {'approved' if choice == 'approve' else 'rejected'}."
    query = {"done": done}
    if run := request.query_params.get("run", ""):
        query["run"] = run
    return RedirectResponse("/approvals?" + urlencode(query), status_code=303)


routes = [
    Route("/approvals", approvals_page, methods=["GET"]),
    Route("/approvals/{approval_id}", decide, methods=["POST"]),
]
