"""The cyclone command line: parsing, what it asks the client, what it prints."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pyclient import (
    AuditEntry,
    NotFound,
    Run,
    RunStatus,
    Step,
    StepError,
    StepStatus,
    Submitted,
    cli,
)
from pyclient import _render as render
from pyclient.models import Retried, RunError, StepCall, StepCallError

WORKFLOW_YAML = """\
name: order
input: {order_id: o-1, amount: 42}
nodes:
  - name: charge
    timeout: 30
    retry: {max_attempts: 5}
  - name: send_receipt
    depends_on: [charge]
  - name: audit
    depends_on: [send_receipt]
    trigger_rule: all_done
"""


def _step(node: str, status: str, deps: tuple[str, ...] = (), **kw: Any) -> Step:
    fields: dict[str, Any] = {
        "node": node,
        "action": node,
        "status": StepStatus(status),
        "attempt": 1,
        "max_attempts": 3,
        "depends_on": deps,
        "trigger_rule": "all_success",
        "input": None,
        "output": None,
        "errors": (),
        "worker_id": "",
        "lease_expires_at": None,
        "available_at": None,
        "started_at": None,
        "finished_at": None,
        "effect_uncertain": False,
        "timeout_s": 300.0,
        "progress": None,
    }
    return Step(**{**fields, **kw})


def _run(status: str = "failed", steps: tuple[Step, ...] = ()) -> Run:
    return Run(
        run_id="r1",
        workflow="order",
        status=RunStatus(status),
        input=None,
        error=RunError("StepDiscarded", "node charge was discarded", "charge", 3, None),
        submit_key="",
        created_at=None,
        updated_at=None,
        finished_at=None,
        steps=steps,
        step_counts={"discarded": 1, "skipped": 2},
    )


class FakeClient:
    def __init__(self, run: Run | None = None, error: Exception | None = None):
        self.calls: list[tuple[str, tuple, dict]] = []
        self.run = run or _run()
        self.error = error

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))
        if self.error:
            raise self.error

    def submit(self, workflow, input=None, **flow):
        self._record("submit", workflow.to_proto(), input, **flow)
        return "r-new"

    def submit_once(self, workflow, key, input=None, **flow):
        self._record("submit_once", workflow.name, key, input, **flow)
        return Submitted("r-old", False)

    def get_run(self, run_id, logs=False):
        self._record("get_run", run_id)
        return self.run

    def iter_runs(self, **kwargs):
        self._record("iter_runs", **kwargs)
        return iter([self.run])

    def retry(self, run_id, node, reason=""):
        self._record("retry", run_id, node, reason)
        return self.run

    def retry_all(self, run_id, reason=""):
        self._record("retry_all", run_id, reason)
        return Retried(("charge",), self.run)

    def resolve(self, run_id, target, **kwargs):
        self._record("resolve", run_id, target, **kwargs)
        return self.run

    def cancel(self, run_id, reason="", *, keep_children=False):
        self._record("cancel", run_id, reason, *(["keep_children"] if keep_children else []))
        return self.run


@pytest.fixture
def workflow_file(tmp_path):
    path = tmp_path / "order.yaml"
    path.write_text(WORKFLOW_YAML)
    return str(path)


def test_submit_reads_the_yaml_file_and_prints_the_run_id(workflow_file, capsys):
    client = FakeClient()
    assert cli.main(["submit", workflow_file], client=client) == 0
    name, (proto, run_input), _ = client.calls[0]
    assert name == "submit"
    assert [n.name for n in proto.nodes] == ["charge", "send_receipt", "audit"]
    assert proto.nodes[0].retry.max_attempts == 5
    assert run_input == {"order_id": "o-1", "amount": 42}
    assert capsys.readouterr().out == "r-new\n"


def test_submit_with_a_key_says_when_the_run_already_existed(workflow_file, capsys):
    client = FakeClient()
    argv = ["submit", workflow_file, "--key", "o-1", "--input", '{"amount": 1}', "--json"]
    assert cli.main(argv, client=client) == 0
    assert client.calls[0] == ("submit_once", ("order", "o-1", {"amount": 1}), {})
    assert json.loads(capsys.readouterr().out) == {"run_id": "r-old", "created": False}


def test_submit_passes_a_start_time_and_a_priority(workflow_file):
    client = FakeClient()
    argv = ["submit", workflow_file, "--start-at", "90m", "--priority", "3"]
    assert cli.main(argv, client=client) == 0
    assert client.calls[0][2] == {"start_at": dt.timedelta(minutes=90), "priority": 3}
    client = FakeClient()
    argv = ["submit", workflow_file, "--key", "k", "--start-at", "2026-12-01T09:00:00+01:00"]
    assert cli.main(argv, client=client) == 0
    assert client.calls[0][2] == {
        "start_at": dt.datetime(2026, 12, 1, 8, tzinfo=dt.UTC),
    }


@pytest.mark.parametrize("when", ["2026-12-01T09:00:00", "soon", "5x"])
def test_submit_refuses_a_start_time_without_a_zone_or_unit(workflow_file, when, capsys):
    with pytest.raises(SystemExit):
        cli.main(["submit", workflow_file, "--start-at", when], client=FakeClient())
    assert "--start-at" in capsys.readouterr().err


def test_an_invalid_workflow_file_is_an_error_with_the_reason(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"name": "w", "nodes": [{"name": "a", "depends_on": ["b"]}]}))
    assert cli.main(["submit", str(path)], client=FakeClient()) == 1
    assert "node 'a' depends on unknown node 'b'" in capsys.readouterr().err


def test_run_show_prints_steps_as_a_tree_with_attempts_errors_and_tracebacks(capsys):
    at = dt.datetime(2026, 11, 30, 18, 0, 43, tzinfo=dt.UTC)
    traceback = "Traceback (most recent call last):\n  File x\nValueError: card declined"
    errors = (
        StepError(1, "handler", "ValueError", "card declined", "old traceback", True, at),
        StepError(2, "lease_expired", "LeaseExpired", "no heartbeat", "", True, at),
        StepError(3, "handler", "ValueError", "card declined", traceback, False, at),
    )
    steps = (
        _step("charge", "discarded", attempt=3, errors=errors, started_at=at),
        _step("send_receipt", "skipped", ("charge",), attempt=0),
        _step("refund", "completed", ("charge",), trigger_rule="one_failed"),
        _step("audit", "completed", ("send_receipt", "refund"), trigger_rule="all_done"),
    )
    assert cli.main(["run", "show", "r1"], client=FakeClient(_run(steps=steps))) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out and not any(line.endswith(" ") for line in out.splitlines())
    assert "run r1  workflow order  FAILED" in out
    assert "StepDiscarded: node charge was discarded (node charge, attempt 3)" in out
    lines = out.splitlines()
    assert lines[4].split() == ["NODE", "STATUS", "ATTEMPT", "STARTED", "DETAIL"]
    charge = next(line for line in lines if line.startswith("charge "))
    local = at.astimezone()
    assert f"attempt 3 (3 failed)  {local:%Y-%m-%d %H:%M:%S} {local.tzname()}" in charge
    assert "last error (attempt 3): ValueError: card declined" in charge
    assert any("├─ send_receipt" in line and "not started" in line for line in lines)
    assert any("└─ refund" in line and "one_failed" in line for line in lines)
    assert any("└─ audit" in line and "after send_receipt, refund" in line for line in lines)
    # Every error on a line, then the last one's traceback, indented.
    at_errors = lines.index("errors of charge:")
    assert "attempt 1" in lines[at_errors + 1] and "(retried)" in lines[at_errors + 1]
    assert "lease_expired  LeaseExpired: no heartbeat" in lines[at_errors + 2]
    assert lines[at_errors + 4 : at_errors + 7] == [
        "      Traceback (most recent call last):",
        "        File x",
        "      ValueError: card declined",
    ]
    assert "old traceback" not in out


def test_attempts_say_what_they_are_made_of():
    reset = StepError(3, "reset", "Reset", "retried by carol", "", True, None)
    failed = StepError(1, "handler", "ValueError", "x", "", True, None)
    assert render.attempts(_step("a", "pending", attempt=0)) == "not started"
    assert render.attempts(_step("a", "completed")) == "attempt 1"
    assert render.attempts(_step("a", "running", attempt=2, errors=(failed,))) == (
        "attempt 2 (1 failed, 1 left)"
    )
    # Retried by an operator after 3 failures, then resumed twice after durable sleeps.
    step = _step(
        "a",
        "running",
        attempt=6,
        resumes=2,
        max_attempts=6,
        errors=(failed, failed, failed, reset),
    )
    assert render.attempts(step) == (
        "attempt 6 (try 4 of 6, 3 failed, 2 resumed, 1 operator retry, 2 left)"
    )


def test_run_show_lists_each_nodes_journal_and_the_advice_once(capsys):
    at = dt.datetime(2026, 11, 30, 18, 0, 43, 780368, tzinfo=dt.UTC)
    journal = (
        StepCall("reserve", 1, "shop.reserve", "succeeded", False, {"id": "r-1"}, None, 1, at, at),
        StepCall("charge", 2, "shop.charge", "started", True, None, None, 1, at, None),
        StepCall(
            "tag#2",
            3,
            "tag",
            "failed",
            False,
            None,
            StepCallError("Timeout", "x" * 200, ""),
            1,
            at,
            at + dt.timedelta(seconds=2),
        ),
    )
    steps = (
        _step("fulfil", "uncertain", attempt=2, effect_uncertain=True, journal=journal),
        _step("notify", "pending", ("fulfil",), attempt=0),
    )
    run = replace(_blocked_on_a_step_call(), steps=steps)
    assert cli.main(["run", "show", "r1"], client=FakeClient(run)) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "(node fulfil, step call charge, attempt 1)" in lines[2]
    at_fulfil = next(i for i, line in enumerate(lines) if line.startswith("fulfil "))
    reserve, charge, tag = lines[at_fulfil + 1 : at_fulfil + 4]
    local = at.astimezone()
    assert reserve.split()[:6] == ["│", "·", "1", "reserve", "succeeded", "attempt"]
    assert f"ended {local:%H:%M:%S} {local.tzname()}" in reserve
    assert reserve.endswith('-> {"id": "r-1"}')
    assert charge.split()[:7] == ["│", "·", "2", "charge", "started", "attempt", "1"]
    assert f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}" in charge
    assert charge.endswith("unsafe  fn shop.charge  no outcome")
    assert "error Timeout: xxx" in tag and tag.endswith("…") and len(tag) < 250
    assert lines[at_fulfil + 4].startswith("└─ notify")


def test_run_show_json_is_the_run_as_a_dict(capsys):
    assert cli.main(["run", "show", "r1", "--json"], client=FakeClient()) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["run_id"], data["status"], data["error"]["kind"]) == (
        "r1",
        "failed",
        "StepDiscarded",
    )


def test_runs_list_passes_filters_and_prints_a_table(capsys):
    client = FakeClient()
    argv = ["runs", "list", "--workflow", "order", "--status", "failed", "--status", "blocked"]
    assert cli.main([*argv, "--key", "o-7", "--limit", "5"], client=client) == 0
    # One more than the limit: whether more runs match is said.
    assert client.calls[0][2] == {
        "workflow": "order",
        "status": ["failed", "blocked"],
        "key": "o-7",
        "run_id_prefix": None,
        "workflow_prefix": None,
        "key_prefix": None,
        "tags": None,
        "created_after": None,
        "created_before": None,
        "page_size": 6,
        "limit": 6,
    }
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["RUN", "WORKFLOW", "STATUS", "CREATED", "STEPS"]
    assert "1 discarded, 2 skipped" in out[1]


def test_runs_list_refuses_an_unknown_status(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["runs", "list", "--status", "lost"], client=FakeClient())
    assert info.value.code == 2


@pytest.mark.parametrize(
    ("flags", "kwargs"),
    [
        (["--result", '{"charge_id": "ch_1"}'], {"result": {"charge_id": "ch_1"}}),
        (["--result", "null"], {"result": None}),
        (["--error", "declined"], {"error": "declined"}),
        (["--discard"], {"discard": True}),
    ],
)
def test_resolve_sends_the_one_resolution_given(flags, kwargs):
    client = FakeClient(_run("blocked"))
    assert cli.main(["resolve", "r1", "charge", *flags, "--reason", "checked"], client=client) == 0
    [(name, args, sent)] = client.calls
    assert (name, args, sent["reason"]) == ("resolve", ("r1", "charge"), "checked")
    expected = {"error": None, "discard": False, "node": None, **kwargs}
    assert {k: v for k, v in sent.items() if k != "reason"} == expected


def _blocked_on_a_step_call() -> Run:
    run = _run("blocked")
    error = RunError("EffectUncertain", "node fulfil: step call ...", "fulfil", 1, None, "charge")
    return replace(run, error=error)


def test_resolve_hands_target_to_the_client_which_takes_the_same_words():
    """Client.resolve tells a step id from a node as the CLI's TARGET does
    (tests/sdk/test_client_fake_channel.py checks how)."""
    client = FakeClient()
    argv = ["resolve", "r1", "charge", "--result", '{"charge_id": "ch_1"}']
    assert cli.main(argv, client=client) == 0
    assert client.calls == [
        (
            "resolve",
            ("r1", "charge"),
            {
                "result": {"charge_id": "ch_1"},
                "node": None,
                "error": None,
                "discard": False,
                "reason": "",  # optional: the actor is recorded either way
            },
        )
    ]


def test_resolve_with_node_names_the_node_of_the_step_call():
    client = FakeClient()
    argv = ["resolve", "r1", "charge#2", "--node", "fulfil", "--error", "declined"]
    assert cli.main(argv, client=client) == 0
    [(name, args, sent)] = client.calls
    assert (name, args, sent["node"], sent["error"]) == (
        "resolve",
        ("r1", "charge#2"),
        "fulfil",
        "declined",
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["resolve", "r1", "--discard"],
        ["resolve", "r1", "charge", "--reason", "x"],
        ["resolve", "r1", "charge", "--discard", "--error", "e", "--reason", "x"],
        ["resolve", "r1", "charge", "--result", "{oops", "--reason", "x"],
    ],
    ids=["no-target", "no-choice", "two-choices", "bad-json"],
)
def test_resolve_refuses_bad_usage_with_exit_code_2(argv):
    with pytest.raises(SystemExit) as info:
        cli.main(argv, client=FakeClient())
    assert info.value.code == 2


def test_retry_retry_all_and_cancel_call_the_client(capsys):
    client = FakeClient()
    assert cli.main(["retry", "r1", "charge", "--reason", "fixed"], client=client) == 0
    assert cli.main(["retry-all", "r1"], client=client) == 0
    assert cli.main(["cancel", "r1", "--reason", "dup"], client=client) == 0
    assert cli.main(["cancel", "r2", "--keep-children"], client=client) == 0
    assert [(c[0], c[1]) for c in client.calls] == [
        ("retry", ("r1", "charge", "fixed")),
        ("retry_all", ("r1", "")),
        ("cancel", ("r1", "dup")),
        ("cancel", ("r2", "", "keep_children")),
    ]
    assert "reopened charge" in capsys.readouterr().out


def test_server_errors_exit_1_with_the_message(capsys):
    client = FakeClient(error=NotFound("run r9 not found"))
    assert cli.main(["run", "show", "r9"], client=client) == 1
    assert capsys.readouterr().err == "cyclone: error: run r9 not found\n"


def test_options_after_the_command_override_the_environment(monkeypatch):
    monkeypatch.setenv("CYCLONE_ADDRESS", "10.0.0.1:1")
    monkeypatch.setenv("CYCLONE_TOKEN", "env-token")
    args = cli.build_parser().parse_args(["run", "show", "r1", "--address", "h:2"])
    assert (args.address, args.token, args.json) == ("h:2", "env-token", False)
    args = cli.build_parser().parse_args(["--json", "cancel", "r1"])
    assert (args.address, args.json) == ("10.0.0.1:1", True)


def test_every_command_has_help(capsys):
    for argv in (["--help"], ["submit", "--help"], ["resolve", "--help"], ["run", "show", "-h"]):
        with pytest.raises(SystemExit) as info:
            cli.main(argv, client=FakeClient())
        assert info.value.code == 0
    assert "--discard" in capsys.readouterr().out


def test_resolve_help_gives_the_shape_and_explains_each_choice(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["resolve", "--help"], client=FakeClient())
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "[--node NODE] (--result JSON | --error MSG | --discard) [--reason TEXT] RUN TARGET" in (
        text
    )
    assert "TARGET is a step id when the run is blocked on a step call" in text
    assert "cyclone resolve RUN charge_card --result" in text
    assert "--result JSON the effect happened; JSON becomes the step's output" in text
    assert "--error MSG the effect happened and failed; a step is recorded failed" in text
    assert "so the body's except block and its cleanup run on replay" in text
    assert "--discard the effect did not happen; the step runs again" in text
    assert "false alarm" in text and "--reason is optional" in text


def test_the_exit_status_table_in_the_docs_and_help_is_the_one_the_cli_uses():
    docs = (Path(__file__).parents[2] / "docs" / "python-sdk.md").read_text()
    table = docs.split("**Exit status.**", 1)[1].split("\n\n")[1]
    documented = {int(row.split("|")[1]) for row in table.splitlines()[2:]}
    assert documented == set(cli.EXIT_STATUS) == {0, 1, 2, 130, 141}
    described = cli.build_parser().description or ""
    for status in cli.EXIT_STATUS:
        assert f" {status} " in described.split("Exit status:", 1)[1].replace("\n", " ")


def test_run_show_heads_the_audit_trail():
    entry = AuditEntry("resolve", "charge", "ops", "found at the PSP", None, None)
    lines = render.render_run(replace(_run(), audit=(entry,))).splitlines()
    heading = lines.index("audit trail (operator actions):")
    assert "resolve charge by ops: found at the PSP" in lines[heading + 1]
    assert "audit trail" not in render.render_run(_run())


def test_run_show_says_why_an_error_was_not_retried_and_what_it_means():
    spent = StepError(3, "handler", "CardError", "card declined", "", False, None)
    refused = StepError(1, "handler", "CardError", "card stolen", "", False, None)
    timed_out = StepError(
        1, "lease_expired", "LeaseExpired", "no outcome by the deadline", "", True, None
    )
    lost = StepError(2, "lease_expired", "WorkerLost", "worker w-1 lost", "", True, None)
    retried = StepError(1, "handler", "CardError", "declined", "", True, None)
    run = _run(
        steps=(
            _step("charge", "discarded", attempt=3, errors=(retried, retried, spent)),
            _step("refund", "discarded", errors=(refused,)),
            _step("ship", "running", attempt=3, recoveries=1, errors=(timed_out, lost)),
        )
    )
    lines = [line for line in render.render_run(run).splitlines() if line.startswith("  attempt")]
    [exhausted] = [line for line in lines if "card declined" in line]
    assert exhausted.endswith("(retries exhausted: 3 of 3 tries)")
    assert "not retryable" not in exhausted
    [stolen] = [line for line in lines if "card stolen" in line]
    assert stolen.endswith("(not retryable)")
    [limit] = [line for line in lines if "no outcome by the deadline" in line]
    assert "(the step's time limit (its timeout) was reached with no outcome)" in limit
    [worker] = [line for line in lines if "worker w-1 lost" in line]
    assert "its worker stopped answering" in worker
    assert worker.endswith("(retried)")
    # An unsafe node whose worker was lost is not retried: the next claim blocked its run.
    blocked = _run(
        status="blocked", steps=(_step("pay", "uncertain", recoveries=1, errors=(lost,)),)
    )
    [line] = [x for x in render.render_run(blocked).splitlines() if x.startswith("  attempt 2")]
    assert line.endswith("(not retried: its effect is uncertain)"), line


def test_effect_uncertain_is_said_only_when_it_matters():
    at = dt.datetime(2026, 11, 30, 18, 0, tzinfo=dt.UTC)
    unsafe_call = StepCall("pay", 1, "shop.pay", "succeeded", True, None, None, 1, at, at)
    safe = _step("a", "running", attempt=2, effect_uncertain=True)
    assert "effect uncertain" not in render.detail(safe, "running")
    assert "effect uncertain" in render.detail(safe, "blocked")
    assert "effect uncertain" in render.detail(replace(safe, unsafe=True), "running")
    assert "effect uncertain" in render.detail(replace(safe, journal=(unsafe_call,)), "running")


def test_a_cancelled_runs_waits_read_cancelled():
    at = dt.datetime(2026, 11, 30, 18, 0, tzinfo=dt.UTC)
    wait = StepCall("event:go", 1, "cyclone.event", "waiting", False, None, None, 1, at, None)
    wait = replace(wait, waiting_for="event go")
    step = _step("a", "cancelled", resumes=1, journal=(wait,))
    shown = render.render_run(replace(_run("cancelled", (step,)), error=None))
    [row] = [line for line in shown.splitlines() if "event:go" in line]
    assert row.split()[3] == "cancelled" and "waiting" not in row.split()[3]
    assert "the run was cancelled" in row
    # The wait never ended: no resume, one try.
    assert render.attempts(step) == "attempt 1"
