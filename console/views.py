"""The console's pages and actions. Each reads or acts through one or a few RPCs; the
server's answer (including a refusal) is what the page shows."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from console import graph, survey
from console.app import client_of, form_of, render, session_of
from pyclient.errors import CycloneError, InvalidArgument, PermissionDenied, Unauthenticated
from pyclient.models import Explanation, Run, RunStatus, Step, StepStatus

PAGE_SIZES = (20, 50, 100, 200)
#: Counts by status stop here ("100+"): the API lists runs, it does not count them, and
#: listing costs about a millisecond per run.
COUNT_CAP = 100
#: A key filter reads this many of the newest matching runs (ListRuns has no key filter).
KEY_SCAN = 10_000
#: Seconds between refreshes of a live region.
POLL_S = 2


@dataclass(frozen=True, slots=True)
class RunFilters:
    workflow: str
    statuses: tuple[str, ...]
    after: str  # as typed: YYYY-MM-DDTHH:MM, UTC
    before: str
    key: str
    size: int
    page: str

    @classmethod
    def of(cls, request: Request) -> RunFilters:
        q = request.query_params
        size = q.get("size", "")
        return cls(
            workflow=q.get("workflow", "").strip(),
            statuses=tuple(s for s in q.getlist("status") if s in RunStatus.__members__.values()),
            after=q.get("after", "").strip(),
            before=q.get("before", "").strip(),
            key=q.get("key", "").strip(),
            size=int(size) if size.isdigit() and int(size) in PAGE_SIZES else 50,
            page=q.get("page", ""),
        )

    def query(self, **change: Any) -> str:
        values = {
            "workflow": self.workflow,
            "status": list(self.statuses),
            "after": self.after,
            "before": self.before,
            "key": self.key,
            "size": self.size,
            "page": self.page,
        }
        values.update(change)
        return urlencode({k: v for k, v in values.items() if v}, doseq=True)

    def api(self) -> dict[str, Any]:
        """The ListRuns filters (without paging)."""
        return {
            "workflow": self.workflow or None,
            "created_after": _instant(self.after, "created after"),
            "created_before": _instant(self.before, "created before"),
        }


def _instant(text: str, what: str) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)
    except ValueError:
        raise InvalidArgument(f"{what}: not a date and time ({text[:40]!r})") from None


async def home(request: Request) -> Response:
    return RedirectResponse("/runs", status_code=303)


async def runs(request: Request) -> Response:
    return await _runs(request, "runs.html")


async def runs_live(request: Request) -> Response:
    return await _runs(request, "_runs_live.html")


async def _runs(request: Request, template: str) -> Response:
    f = RunFilters.of(request)
    context: dict[str, Any] = {"f": f, "sizes": PAGE_SIZES, "statuses": list(RunStatus)}
    client = client_of(request)
    try:
        if f.key:
            found = []
            async for run in client.iter_runs(
                limit=KEY_SCAN, status=f.statuses or None, page_size=1000, **f.api()
            ):
                if run.submit_key == f.key:
                    found.append(run)
            context.update(runs=found, next_page="", key_scan=KEY_SCAN)
        else:
            page = await client.list_runs(
                status=f.statuses or None, page_size=f.size, page_token=f.page, **f.api()
            )
            context.update(runs=page.runs, next_page=page.next_page_token, key_scan=0)
        context["error"] = None
    except (InvalidArgument, PermissionDenied) as exc:
        context.update(runs=(), next_page="", key_scan=0, error=exc)
    return render(request, template, context)


async def run_counts(request: Request) -> Response:
    f = RunFilters.of(request)
    try:
        counts = await _counts(request, f)
    except (InvalidArgument, PermissionDenied):
        counts = {}  # the list beside says why
    return render(request, "_run_counts.html", {"f": f, "counts": counts})


async def _counts(request: Request, f: RunFilters) -> dict[str, str]:
    client = client_of(request)
    pages = await asyncio.gather(
        *(client.list_runs(status=s.value, page_size=COUNT_CAP, **f.api()) for s in RunStatus)
    )
    return {
        s.value: f"{len(p.runs):,}+" if p.next_page_token else f"{len(p.runs):,}"
        for s, p in zip(RunStatus, pages, strict=True)
    }


async def run_page(request: Request) -> Response:
    return await _run(request, "run.html")


async def run_live(request: Request) -> Response:
    return await _run(request, "_run_live.html")


async def _run(request: Request, template: str) -> Response:
    client = client_of(request)
    run = await client.get_run(request.path_params["run_id"])
    node = request.query_params.get("node", "")
    step = next((s for s in run.steps if s.node == node), None)
    explanation: Explanation | None = None
    if step is not None:
        explanation = await client.explain(run.run_id, step.node)
    dependents = {d for s in run.steps for d in s.depends_on}
    context = {
        "run": run,
        "step": step,
        "explanation": explanation,
        "picture": await graph.picture_of(run),
        "status_of": {s.node: str(s.status) for s in run.steps},
        "sinks": [s for s in run.steps if s.node not in dependents],
        "actions": run_actions(run),
        "step_actions": step_actions(run, step) if step else [],
        "live": not RunStatus(run.status).finished,
        "done": request.query_params.get("done", ""),
        "poll_s": POLL_S,
    }
    return render(request, template, context)


def run_actions(run: Run) -> list[str]:
    """What the page offers for the run; the server decides in the end."""
    offered = []
    if run.status == RunStatus.FAILED:
        offered.append("retry-all")
    if run.status in (RunStatus.RUNNING, RunStatus.BLOCKED, RunStatus.FAILED):
        offered.append("cancel")
    return offered


def step_actions(run: Run, step: Step) -> list[str]:
    offered = []
    if step.status == StepStatus.DISCARDED and run.status != RunStatus.CANCELLED:
        offered.append("retry")
    if run.status == RunStatus.BLOCKED and run.error is not None and run.error.node == step.node:
        offered.append("resolve")
    return offered


#: Each action: its title, and whether it names a node.
ACTIONS: Mapping[str, tuple[str, bool]] = {
    "cancel": ("Cancel the run", False),
    "retry-all": ("Retry every discarded node", False),
    "retry": ("Retry this node", True),
    "resolve": ("Resolve the blocked run", True),
}


async def confirm(request: Request) -> Response:
    return await _confirm(request, None, {})


async def _confirm(
    request: Request, error: CycloneError | None, form: Mapping[str, Any]
) -> Response:
    action = request.path_params["action"]
    if action not in ACTIONS:
        return render(request, "error.html", {"error": None}, status_code=404)
    run = await client_of(request).get_run(request.path_params["run_id"])
    node = request.query_params.get("node", "")
    title, needs_node = ACTIONS[action]
    return render(
        request,
        "confirm.html",
        {
            "run": run,
            "action": action,
            "title": title,
            "node": node if needs_node else "",
            "form": form,
            "error": error,
        },
        status_code=200 if error is None else _status_of(error),
    )


def _status_of(error: CycloneError) -> int:
    if isinstance(error, PermissionDenied):
        return 403
    if isinstance(error, Unauthenticated):
        return 401
    return 400 if isinstance(error, InvalidArgument) else 409


async def act(request: Request) -> Response:
    action = request.path_params["action"]
    run_id = request.path_params["run_id"]
    node = request.query_params.get("node", "")
    fields = {k: v for k, v in form_of(request).items() if k != "csrf"}
    reason = fields.get("reason", "").strip()
    client = client_of(request)
    try:
        if action == "cancel":
            await client.cancel(run_id, reason)
            done = "Run cancelled."
        elif action == "retry-all":
            retried = await client.retry_all(run_id, reason)
            done = f"Reopened {', '.join(retried.nodes)}."
        elif action == "retry":
            await client.retry(run_id, node, reason)
            done = f"Reopened {node}."
        elif action == "resolve":
            done = await _resolve(request, run_id, node, fields, reason)
        else:
            return render(request, "error.html", {"error": None}, status_code=404)
    except CycloneError as exc:
        return await _confirm(request, exc, fields)
    target = f"/runs/{run_id}?" + urlencode(
        {"node": node, "done": done} if node else {"done": done}
    )
    return RedirectResponse(target, status_code=303)


async def _resolve(
    request: Request, run_id: str, node: str, fields: Mapping[str, str], reason: str
) -> str:
    client = client_of(request)
    step_id = fields.get("step_id") or None
    choice = fields.get("choice", "")
    if choice == "result":
        try:
            value = json.loads(fields.get("result", ""))
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"the result is not valid JSON: {exc}") from None
        await client.resolve(run_id, node, result=value, reason=reason, step_id=step_id)
        return "Resolved: the effect happened, with this result."
    if choice == "error":
        message = fields.get("error", "").strip()
        if not message:
            raise InvalidArgument("say what the error was")
        await client.resolve(run_id, node, error=message, reason=reason, step_id=step_id)
        return "Resolved: the effect happened and failed."
    if choice == "discard":
        await client.resolve(run_id, node, discard=True, reason=reason, step_id=step_id)
        return "Resolved: the effect did not happen; the step runs again."
    raise InvalidArgument("choose what you found: result, error or discard")


async def needs_person(request: Request) -> Response:
    return await _needs_person(request, "attention.html")


async def needs_person_live(request: Request) -> Response:
    return await _needs_person(request, "_attention_live.html")


async def _needs_person(request: Request, template: str) -> Response:
    found = await survey.attention(client_of(request), dt.datetime.now(dt.UTC))
    return render(request, template, {"found": found, "sample": survey.SAMPLE_RUNS})


async def workers(request: Request) -> Response:
    seen, activity, sampled = await survey.workers(client_of(request))
    return render(
        request,
        "workers.html",
        {"workers": seen, "activity": activity, "sampled": sampled, "sample": survey.SAMPLE_RUNS},
    )


def _safe_next(target: str) -> str:
    """Only paths of this console: never another site (no scheme, no //host)."""
    return target if target.startswith("/") and not target.startswith("//") else "/runs"


async def login(request: Request) -> Response:
    target = _safe_next(request.query_params.get("next", "/runs"))
    return render(request, "login.html", {"next": target, "error": None})


async def login_post(request: Request) -> Response:
    form = form_of(request)
    token = form.get("token", "").strip()
    target = _safe_next(form.get("next", "/runs"))
    sessions = request.app.state.sessions
    trial = sessions.renew(session_of(request))
    trial.token = token or None
    request.state.session = trial
    try:
        await client_of(request).list_runs(page_size=1)
    except (Unauthenticated, PermissionDenied) as exc:
        trial.token = None
        return render(request, "login.html", {"next": target, "error": exc}, status_code=401)
    return RedirectResponse(target, status_code=303)


async def logout(request: Request) -> Response:
    request.state.session = request.app.state.sessions.renew(session_of(request))
    return RedirectResponse("/login", status_code=303)


routes = [
    Route("/", home),
    Route("/runs", runs),
    Route("/runs/live", runs_live),
    Route("/runs/counts", run_counts),
    Route("/runs/{run_id}", run_page),
    Route("/runs/{run_id}/live", run_live),
    Route("/runs/{run_id}/act/{action}", confirm, methods=["GET"]),
    Route("/runs/{run_id}/act/{action}", act, methods=["POST"]),
    Route("/attention", needs_person),
    Route("/attention/live", needs_person_live),
    Route("/workers", workers),
    Route("/login", login, methods=["GET"]),
    Route("/login", login_post, methods=["POST"]),
    Route("/logout", logout, methods=["POST"]),
]
