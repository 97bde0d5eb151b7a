"""The console's bulk actions: "Cancel these runs" from the runs list's filters (a
confirmation that counts them, then a job on the server), and the page of jobs with
their progress, where a running one can be stopped.

As the other actions (console/actions.py), every POST keeps the CSRF check and
leaves roles to the server: a token whose role may not start or stop a bulk action
gets the server's refusal on the page, with nothing written. The server records each
run it cancels in the run's audit trail, with the signed-in token's name as the actor
and the job's id."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from console.pages import client_of, form_of, http_status, render
from console.views import RunFilters
from pyclient.errors import CycloneError
from pyclient.models import BulkAction, BulkStarted

#: Jobs the jobs page lists, newest first.
JOBS_SHOWN = 50


def _filters(f: RunFilters) -> dict[str, Any]:
    """start_bulk's filters of the runs page's: its statuses, when it names some."""
    return {**f.api(), "status": list(f.statuses) or None}


async def cancel_confirm(request: Request) -> Response:
    return await _cancel_page(request, None, {}, status_code=200)


async def _cancel_page(
    request: Request, error: CycloneError | None, form: Mapping[str, str], *, status_code: int
) -> Response:
    """The confirmation: how many runs the filters match (a dry run, nothing written)."""
    f = RunFilters.of(request)
    counted: BulkStarted | None = None
    everything = False
    try:
        filters = _filters(f)
        everything = not any(filters.values())
        counted = await client_of(request).start_bulk(
            "cancel", dry_run=True, confirm_all=True, **filters
        )
    except CycloneError as exc:
        if error is None:
            error, status_code = exc, http_status(exc)
    return render(
        request,
        "bulk_cancel.html",
        {"f": f, "counted": counted, "everything": everything, "form": form, "error": error},
        status_code=status_code,
    )


async def cancel_start(request: Request) -> Response:
    """Start the bulk cancel of the runs the filters match; then the jobs page."""
    form = {k: v for k, v in form_of(request).items() if k != "csrf"}
    f = RunFilters.of(request)
    try:
        started = await client_of(request).start_bulk(
            "cancel",
            reason=form.get("reason", "").strip(),
            confirm_all=form.get("confirm_all") == "yes",
            **_filters(f),
        )
    except CycloneError as exc:
        return await _cancel_page(request, exc, form, status_code=http_status(exc))
    assert started.job is not None
    done = f"Started cancelling {started.matched:,} run(s): job {started.job.job_id}."
    return RedirectResponse("/bulk?" + urlencode({"done": done}), status_code=303)


async def jobs(request: Request) -> Response:
    return await _jobs_page(request, "bulk_jobs.html")


async def jobs_live(request: Request) -> Response:
    return await _jobs_page(request, "_bulk_jobs_live.html")


async def _jobs_page(
    request: Request, template: str, error: CycloneError | None = None
) -> Response:
    page = await client_of(request).list_bulk(page_size=JOBS_SHOWN)
    return render(
        request,
        template,
        {
            "jobs": page.jobs,
            "live": any(j.running for j in page.jobs),
            "done": request.query_params.get("done", ""),
            "error": error,
            "progress": progress,
        },
        status_code=200 if error is None else http_status(error),
    )


def progress(job: BulkAction) -> tuple[int, int]:
    """How far a job got: runs taken so far, of how many (at least that many)."""
    taken = job.touched + job.skipped + job.failed
    return taken, max(job.total, taken, 1)


async def job_stop(request: Request) -> Response:
    job_id = request.path_params["job_id"]
    try:
        job = await client_of(request).cancel_bulk(job_id)
    except CycloneError as exc:
        return await _jobs_page(request, "bulk_jobs.html", exc)
    done = f"Stopped job {job.job_id} after {job.touched:,} run(s)."
    return RedirectResponse("/bulk?" + urlencode({"done": done}), status_code=303)


routes = [
    Route("/runs/cancel-matching", cancel_confirm, methods=["GET"]),
    Route("/runs/cancel-matching", cancel_start, methods=["POST"]),
    Route("/bulk", jobs, methods=["GET"]),
    Route("/bulk/live", jobs_live, methods=["GET"]),
    Route("/bulk/{job_id}/stop", job_stop, methods=["POST"]),
]
