"""Starting a run from the console: of a workflow already seen, with the definition its
latest run was submitted with, as that run's steps keep it, and an input typed as JSON.

A run keeps, per node, its action, dependencies, trigger rule, retry policy, timeout,
static input, priority, concurrency limit and event wait, and the page rebuilds the
workflow from those (GetRun's steps). A concurrency key is kept as it was evaluated
for that run's input, not as the template it may have come from. The definition is
shown, and can be edited, before the run starts. Submit (or SubmitOnce,
with a key) validates everything and writes the run in one transaction: a refused
definition or input leaves nothing behind and is shown on the form."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from console.pages import client_of, form_of, http_status, render
from pyclient.errors import CycloneError, InvalidArgument, NotFound, PermissionDenied
from pyclient.models import Run, Step
from pyclient.workflow import EVENT_ACTION, Workflow

#: Runs read, newest first, for the names of the workflows seen.
SEEN_RUNS = 200


async def workflows_seen(request: Request) -> list[str]:
    """The names of the workflows of the latest SEEN_RUNS runs, latest first."""
    page = await client_of(request).list_runs(page_size=SEEN_RUNS)
    return list(dict.fromkeys(r.workflow for r in page.runs))


async def latest_run(request: Request, workflow: str) -> Run:
    """The latest run of ``workflow``, with its steps; NotFound when none is kept."""
    client = client_of(request)
    page = await client.list_runs(workflow=workflow, page_size=1)
    if not page.runs:
        raise NotFound(f"no run of workflow {workflow[:200]!r} is kept: nothing to start from")
    return await client.get_run(page.runs[0].run_id)


def definition_of(run: Run) -> dict[str, Any]:
    """The workflow of ``run`` as Workflow.from_dict reads it, rebuilt from its steps."""
    nodes: list[dict[str, Any]] = []
    for s in run.steps:
        node: dict[str, Any] = {"name": s.node}
        if s.depends_on:
            node["depends_on"] = list(s.depends_on)
        if s.trigger_rule != "all_success":
            node["trigger_rule"] = s.trigger_rule
        if s.action == EVENT_ACTION and isinstance(s.input, Mapping):
            node["event"] = s.input.get("event")
            if s.input.get("timeout_s") is not None:
                node["event_timeout"] = s.input["timeout_s"]
            nodes.append(node)
            continue
        node["action"] = s.action
        node["retry"] = _retry_of(s)
        if s.timeout_s is not None:
            node["timeout"] = s.timeout_s
        if s.input is not None:
            node["input"] = s.input
        if s.priority != run.priority:
            node["priority"] = s.priority
        if s.concurrency_key and s.concurrency_limit:
            node["concurrency"] = {"key": s.concurrency_key, "limit": s.concurrency_limit}
        nodes.append(node)
    return {"name": run.workflow, "nodes": nodes}


def _retry_of(step: Step) -> dict[str, Any]:
    """The node's retry policy as submitted; from a server that does not say, only its
    attempt limit (which an operator's retry may have raised)."""
    policy = step.retry
    if policy is None:
        return {"max_attempts": step.max_attempts}
    return {
        "max_attempts": policy.max_attempts,
        "initial_backoff": policy.initial_backoff,
        "max_backoff": policy.max_backoff,
        "multiplier": policy.multiplier,
    }


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


async def start_form(request: Request) -> Response:
    workflow = request.query_params.get("workflow", "").strip()
    form = {"workflow": workflow, "definition": "", "input": "", "key": "", "priority": "0"}
    error: CycloneError | None = None
    if workflow:
        try:
            run = await latest_run(request, workflow)
        except NotFound as exc:
            error = exc
        else:
            form.update(
                definition=_pretty(definition_of(run)),
                input=_pretty(run.input),
                priority=str(run.priority),
                source=run.run_id,
            )
    return await _page(request, form, error)


async def _page(request: Request, form: Mapping[str, str], error: CycloneError | None) -> Response:
    try:
        seen = await workflows_seen(request)
    except PermissionDenied:
        seen = []
    return render(
        request,
        "start.html",
        {"form": form, "seen": seen, "error": error, "seen_runs": SEEN_RUNS},
        status_code=200 if error is None else http_status(error),
    )


def _parsed(form: Mapping[str, str]) -> tuple[Workflow, Any, int]:
    """The workflow, input and priority of the form; InvalidArgument names the field."""
    try:
        definition = json.loads(form.get("definition", ""))
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"the definition is not valid JSON: {exc}") from None
    workflow = Workflow.from_dict(definition)
    if workflow.name != form.get("workflow", "").strip():
        raise InvalidArgument(
            f"the definition names workflow {workflow.name[:200]!r}, not the one chosen; "
            "choose it again to start from its latest run"
        )
    text = form.get("input", "").strip()
    try:
        run_input = json.loads(text) if text else None
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"the input is not valid JSON: {exc}") from None
    priority = form.get("priority", "").strip() or "0"
    if not priority.lstrip("-").isdigit():
        raise InvalidArgument(f"priority: not a whole number ({priority[:40]!r})")
    workflow.validate()
    return workflow, run_input, int(priority)


async def start_submit(request: Request) -> Response:
    form = {k: v for k, v in form_of(request).items() if k != "csrf"}
    key = form.get("key", "").strip()
    client = client_of(request)
    try:
        workflow, run_input, priority = _parsed(form)
        if key:
            made = await client.submit_once(workflow, key, run_input, priority=priority)
            run_id, created = made.run_id, made.created
        else:
            run_id = await client.submit(workflow, run_input, priority=priority)
            created = True
    except CycloneError as exc:
        return await _page(request, form, exc)
    done = "Run started." if created else f"A run with key {key} exists already: this is it."
    return RedirectResponse(f"/runs/{run_id}?" + urlencode({"done": done}), status_code=303)
