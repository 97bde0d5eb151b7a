"""The console's pages and actions. Each reads or acts through one or a few RPCs; the
server's answer (including a refusal) is what the page shows."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from console import graph, streams, survey
from console.pages import Console, client_of, form_of, render, session_of
from console.sessions import Sessions
from pyclient import _states as states
from pyclient.async_client import AsyncClient
from pyclient.errors import CycloneError, InvalidArgument, PermissionDenied, Unauthenticated
from pyclient.models import Explanation, LogLine, Run, RunStatus, Step, StepStatus
from pyclient.workflow import EVENT_ACTION, Workflow

PAGE_SIZES = (20, 50, 100, 200)
#: Counts by status are exact up to this many, then shown as "1,000+" (CountRuns).
COUNT_LIMIT = 1000
#: Seconds between refreshes of a live region.
POLL_S = 2


#: How the runs page matches a workflow and a key: by their start, or whole.
MATCHES = ("prefix", "exact")


@dataclass(frozen=True, slots=True)
class RunFilters:
    workflow: str
    statuses: tuple[str, ...]
    after: str  # as typed: YYYY-MM-DDTHH:MM, UTC
    before: str
    key: str
    size: int
    page: str
    run: str = ""  # a run id, or its first hex digits
    match: str = "prefix"  # MATCHES
    tags: str = ""  # as typed: KEY=VALUE pairs separated by blanks

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
            run=q.get("run", "").strip(),
            match="exact" if q.get("match") == "exact" else "prefix",
            tags=q.get("tags", "").strip(),
        )

    def query(self, **change: Any) -> str:
        values = {
            "run": self.run,
            "workflow": self.workflow,
            "key": self.key,
            "match": self.match if self.match != "prefix" else "",
            "tags": self.tags,
            "status": list(self.statuses),
            "after": self.after,
            "before": self.before,
            "size": self.size,
            "page": self.page,
        }
        values.update(change)
        return urlencode({k: v for k, v in values.items() if v}, doseq=True)

    def api(self) -> dict[str, Any]:
        """The ListRuns and CountRuns filters (without statuses and paging)."""
        exact = self.match == "exact"
        return {
            "workflow": (self.workflow if exact else None) or None,
            "key": (self.key if exact else None) or None,
            "workflow_prefix": (None if exact else self.workflow) or None,
            "key_prefix": (None if exact else self.key) or None,
            "run_id_prefix": self.run or None,
            "created_after": _instant(self.after, "created after"),
            "created_before": _instant(self.before, "created before"),
            "tags": _tags(self.tags),
        }


def _tags(text: str) -> dict[str, str] | None:
    """The tags filter as typed (``env=prod team=red``): every one must match."""
    tags = {}
    for pair in text.split():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"tags: {pair[:60]!r} is not KEY=VALUE")
        tags[key] = value
    return tags or None


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
    try:
        page = await client_of(request).list_runs(
            status=f.statuses or None, page_size=f.size, page_token=f.page, **f.api()
        )
        context.update(
            runs=page.runs,
            next_page=page.next_page_token,
            prev_page=page.prev_page_token,
            error=None,
        )
    except (InvalidArgument, PermissionDenied) as exc:
        context.update(runs=(), next_page="", prev_page="", error=exc)
    return render(request, template, context)


async def run_counts(request: Request) -> Response:
    f = RunFilters.of(request)
    try:
        counts = await _counts(request, f)
    except (InvalidArgument, PermissionDenied):
        counts = {}  # the list beside says why
    return render(request, "_run_counts.html", {"f": f, "counts": counts})


async def _counts(request: Request, f: RunFilters) -> dict[str, str]:
    counted = await client_of(request).count_runs(limit=COUNT_LIMIT, **f.api())
    return {s.value: str(counted[s.value]) for s in RunStatus if s.value in counted}


async def run_page(request: Request) -> Response:
    return await _run(request, "run.html")


async def run_live(request: Request) -> Response:
    return await _run(request, "_run_live.html")


async def _run(request: Request, template: str) -> Response:
    client = client_of(request)
    node = request.query_params.get("node", "")
    run = await _run_with_logs(client, request.path_params["run_id"], node)
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
        "status_of": {s.node: states.shown_status(s) for s in run.steps},
        "states": states,
        "logs_by_attempt": _logs_by_attempt(step) if step else {},
        "sinks": [s for s in run.steps if s.node not in dependents],
        "actions": run_actions(run),
        "step_actions": step_actions(run, step) if step else [],
        "live": not RunStatus(run.status).finished,
        "done": request.query_params.get("done", ""),
        "poll_s": POLL_S,
    }
    if template == "run.html":
        live = not RunStatus(run.status).finished
        context |= await streams.context_of(client, run.run_id, live)
    return render(request, template, context)


async def _run_with_logs(client: AsyncClient, run_id: str, node: str) -> Run:
    """The run, with the selected node's log lines (none for a node name the server
    refuses: the page says there is no such node)."""
    if not node:
        return await client.get_run(run_id)
    try:
        return await client.get_run(run_id, logs=True, logs_node=node)
    except InvalidArgument:
        return await client.get_run(run_id)


def _logs_by_attempt(step: Step) -> dict[int, list[LogLine]]:
    """The node's log lines by attempt, newest attempt first."""
    found: dict[int, list[LogLine]] = {}
    for line in sorted(step.logs, key=lambda line: -line.attempt):
        found.setdefault(line.attempt, []).append(line)
    return found


def run_actions(run: Run) -> list[str]:
    """What the page offers for the run; the server decides in the end."""
    offered = []
    if run.status == RunStatus.BLOCKED and run.error is not None and run.error.node:
        offered.append("resolve")
    if run.status == RunStatus.FAILED:
        offered.append("retry-all")
    if run.pause is not None:
        offered.append("resume")
    elif run.status in (RunStatus.RUNNING, RunStatus.BLOCKED):
        offered.append("pause")
    if run.status in (RunStatus.RUNNING, RunStatus.BLOCKED, RunStatus.FAILED):
        offered.append("cancel")
    return offered


def step_actions(run: Run, step: Step) -> list[str]:
    offered = []
    if step.status == StepStatus.DISCARDED and run.status != RunStatus.CANCELLED:
        offered.append("retry")
    if run.status == RunStatus.BLOCKED and run.error is not None and run.error.node == step.node:
        offered.append("resolve")
    if awaited_event(step) and not RunStatus(run.status).finished:
        offered.append("event")
    return offered


def awaited_event(step: Step) -> str:
    """The name of the event the node waits for now; "" when it waits for none."""
    if step.waiting_for.startswith("event "):
        return step.waiting_for.removeprefix("event ")
    unfinished = step.status in (StepStatus.PENDING, StepStatus.AVAILABLE, StepStatus.RUNNING)
    if step.action == EVENT_ACTION and unfinished and isinstance(step.input, Mapping):
        name = step.input.get("event")
        return name if isinstance(name, str) else ""
    return ""


#: Each action: its title, and whether it names a node.
ACTIONS: Mapping[str, tuple[str, bool]] = {
    "cancel": ("Cancel the run", False),
    "pause": ("Pause the run: none of its steps is claimed until it is resumed", False),
    "resume": ("Resume the run", False),
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
        elif action in ("pause", "resume"):
            change = client.pause_run if action == "pause" else client.resume_run
            changed = (await change(run_id, reason)).changed
            done = f"Run {action}d." if changed else f"Nothing changed: the run was not {action}d."
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
    found = await survey.attention(client_of(request))
    return render(request, template, {"found": found, "listed": survey.LISTED})


async def workers(request: Request) -> Response:
    found = await client_of(request).list_workers()
    now = dt.datetime.now(dt.UTC)
    states = {w.worker_id: survey.worker_state(w, now) for w in found.workers}
    return render(request, "workers.html", {"found": found, "states": states})


async def schedules(request: Request) -> Response:
    page = await client_of(request).list_schedules(
        page_size=100, page_token=request.query_params.get("page", "")
    )
    return render(
        request,
        "schedules.html",
        {
            "schedules": page.schedules,
            "next_page": page.next_page_token,
            "done": request.query_params.get("done", ""),
        },
    )


#: Each schedule action: its title, and what the page says once it is done.
SCHEDULE_ACTIONS: Mapping[str, tuple[str, str]] = {
    "pause": ("Pause the schedule", "paused: it will not fire until resumed"),
    "resume": ("Resume the schedule", "resumed: it fires again from now on"),
    "delete": ("Delete the schedule", "deleted: its runs are kept"),
}


async def schedule_confirm(request: Request) -> Response:
    return await _schedule_confirm(request, None)


async def _schedule_confirm(request: Request, error: CycloneError | None) -> Response:
    action = request.path_params["action"]
    if action not in SCHEDULE_ACTIONS:
        return render(request, "error.html", {"error": None}, status_code=404)
    schedule = await client_of(request).get_schedule(request.path_params["name"])
    return render(
        request,
        "schedule_confirm.html",
        {
            "schedule": schedule,
            "action": action,
            "title": SCHEDULE_ACTIONS[action][0],
            "error": error,
        },
        status_code=200 if error is None else _status_of(error),
    )


async def schedule_act(request: Request) -> Response:
    action = request.path_params["action"]
    name = request.path_params["name"]
    if action not in SCHEDULE_ACTIONS:
        return render(request, "error.html", {"error": None}, status_code=404)
    client = client_of(request)
    try:
        if action == "pause":
            await client.pause_schedule(name)
        elif action == "resume":
            await client.resume_schedule(name)
        else:
            await client.delete_schedule(name)
    except CycloneError as exc:
        return await _schedule_confirm(request, exc)
    done = f"Schedule {name} {SCHEDULE_ACTIONS[action][1]}."
    return RedirectResponse("/schedules?" + urlencode({"done": done}), status_code=303)


SCHEDULE_FORM = {
    "name": "",
    "when": "cron",
    "cron": "",
    "time_zone": "UTC",
    "every": "",
    "workflow": "",
    "input": "",
    "overlap": "skip",
    "catch_up": "skip",
    "paused": "",
}


async def schedule_new(request: Request) -> Response:
    return render(request, "schedule_new.html", {"form": SCHEDULE_FORM, "error": None})


async def schedule_create(request: Request) -> Response:
    form = {**SCHEDULE_FORM, **{k: v for k, v in form_of(request).items() if k != "csrf"}}
    try:
        workflow = Workflow.from_dict(_json_field(form["workflow"], "the workflow"))
        run_input = _json_field(form["input"], "the input") if form["input"].strip() else None
        if form["when"] == "every":
            try:
                every = float(form["every"])
            except ValueError:
                raise InvalidArgument(
                    f"every: not a number of seconds ({form['every'][:40]!r})"
                ) from None
            spec: dict[str, Any] = {"every": every}
        else:
            spec = {"cron": form["cron"].strip(), "time_zone": form["time_zone"].strip() or None}
        await client_of(request).create_schedule(
            form["name"].strip(),
            workflow,
            run_input,
            overlap=form["overlap"],
            catch_up=form["catch_up"],
            paused=bool(form["paused"]),
            **spec,
        )
    except CycloneError as exc:
        return render(
            request,
            "schedule_new.html",
            {"form": form, "error": exc},
            status_code=_status_of(exc),
        )
    done = f"Schedule {form['name'].strip()} created."
    return RedirectResponse("/schedules?" + urlencode({"done": done}), status_code=303)


def _json_field(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{what} is not valid JSON: {exc}") from None


def _safe_next(target: str) -> str:
    """Only paths of this console: never another site (no scheme, no //host)."""
    return target if target.startswith("/") and not target.startswith("//") else "/runs"


async def login(request: Request) -> Response:
    target = _safe_next(request.query_params.get("next", "/runs"))
    return render(request, "login.html", {"next": target, "error": None})


async def login_post(request: Request) -> Response:
    """Sign in: a session is kept only for a token that a server requiring tokens
    accepts. The browser's previous session, signed in or not, is left behind either
    way (a new id)."""
    form = form_of(request)
    token = form.get("token", "").strip()
    target = _safe_next(form.get("next", "/runs"))
    sessions: Sessions = request.app.state.sessions
    console: Console = request.app.state.console
    request.state.session = sessions.sign_out(session_of(request))
    try:
        await console.client(None).list_runs(page_size=1)
    except Unauthenticated:
        pass  # the server requires a token: try this one
    else:
        # A server that requires none takes any: nothing to keep, the browser stays
        # anonymous (else any string typed here would make a session).
        return RedirectResponse(target, status_code=303)
    try:
        await console.client(token or None).list_runs(page_size=1)
    except (Unauthenticated, PermissionDenied) as exc:
        return render(request, "login.html", {"next": target, "error": exc}, status_code=401)
    request.state.session = sessions.sign_in(token)
    return RedirectResponse(target, status_code=303)


async def logout(request: Request) -> Response:
    request.state.session = request.app.state.sessions.sign_out(session_of(request))
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
    Route("/schedules", schedules),
    Route("/schedules/new", schedule_new, methods=["GET"]),
    Route("/schedules/new", schedule_create, methods=["POST"]),
    Route("/schedules/{name}/act/{action}", schedule_confirm, methods=["GET"]),
    Route("/schedules/{name}/act/{action}", schedule_act, methods=["POST"]),
    Route("/login", login, methods=["GET"]),
    Route("/login", login_post, methods=["POST"]),
    Route("/logout", logout, methods=["POST"]),
]
