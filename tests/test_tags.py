"""Run tags: given at submit, shown by GetRun and ListRuns, filtering ListRuns and
CountRuns (with the other filters, paged both ways), refused when out of bounds,
changed only through the audited SetRunTags, and purged with their run; against a
real server."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from cyclone.v1 import admin_service_pb2 as A
from cyclone.v1 import types_pb2
from cyclone.v1 import workflow_service_pb2 as W
from tests.helpers import drain, get_run, node, rpc_error, table_counts, workflow

DAY = 86400


def submit_tagged(server: Any, name: str, tags: dict[str, str], action: str = "work") -> str:
    request = W.SubmitRequest(workflow=workflow(name, node("a", action=action)), tags=tags)
    return str(server.workflows.Submit(request).run_id)


def listed(server: Any, **fields: Any) -> list[str]:
    return [r.run_id for r in server.workflows.ListRuns(W.ListRunsRequest(**fields)).runs]


def counted(server: Any, **fields: Any) -> dict[int, int]:
    reply = server.workflows.CountRuns(W.CountRunsRequest(**fields))
    return {c.status: c.count for c in reply.counts if c.count}


def test_tags_are_stored_and_shown_by_get_run_and_list_runs(cyclone_server: Any) -> None:
    tags = {"env": "prod", "team/owner": "billing:eu", "ticket.id": "T-17", "empty": ""}
    run_id = submit_tagged(cyclone_server, "orders", tags)
    plain = submit_tagged(cyclone_server, "orders", {})
    assert dict(get_run(cyclone_server, run_id).tags) == tags
    assert dict(get_run(cyclone_server, plain).tags) == {}
    shown = {
        r.run_id: dict(r.tags)
        for r in cyclone_server.workflows.ListRuns(W.ListRunsRequest(workflow="orders")).runs
    }
    assert shown == {run_id: tags, plain: {}}


def test_list_and_count_by_one_and_two_tags_with_status_and_workflow(cyclone_server: Any) -> None:
    a = submit_tagged(cyclone_server, "orders", {"env": "prod", "team": "red"})
    b = submit_tagged(cyclone_server, "orders", {"env": "prod", "team": "blue"})
    c = submit_tagged(cyclone_server, "reports", {"env": "prod", "team": "red"})
    d = submit_tagged(cyclone_server, "orders", {"env": "dev", "team": "red"}, action="idle")
    submit_tagged(cyclone_server, "orders", {})
    drain(cyclone_server, "work")  # a, b, c complete; d stays running

    assert listed(cyclone_server, tags={"env": "prod"}) == [c, b, a]
    assert listed(cyclone_server, tags={"env": "prod", "team": "red"}) == [c, a]
    assert listed(cyclone_server, tags={"team": "red"}, workflow="orders") == [d, a]
    running = [types_pb2.RUN_STATUS_RUNNING]
    assert listed(cyclone_server, tags={"team": "red"}, statuses=running) == [d]
    assert listed(cyclone_server, tags={"team": "red", "env": "dev"}, workflow="reports") == []
    assert listed(cyclone_server, tags={"env": "staging"}) == []
    # A tag matches its whole value, never a part of it or another key's.
    assert listed(cyclone_server, tags={"env": "pro"}) == []
    assert listed(cyclone_server, tags={"team": "prod"}) == []

    completed = types_pb2.RUN_STATUS_COMPLETED
    assert counted(cyclone_server, tags={"env": "prod"}) == {completed: 3}
    assert counted(cyclone_server, tags={"team": "red"}) == {
        completed: 2,
        types_pb2.RUN_STATUS_RUNNING: 1,
    }
    assert counted(cyclone_server, tags={"team": "red", "env": "prod"}, workflow="orders") == {
        completed: 1
    }
    assert counted(cyclone_server, tags={"team": "red"}, statuses=running) == {
        types_pb2.RUN_STATUS_RUNNING: 1
    }


def test_a_tag_filter_pages_to_older_runs_and_back(cyclone_server: Any) -> None:
    ids = [submit_tagged(cyclone_server, "paged", {"batch": "b1"}) for _ in range(5)]
    for _ in range(3):
        submit_tagged(cyclone_server, "paged", {"batch": "b2"})
    newest_first = ids[::-1]

    def page(token: str = "") -> W.ListRunsResponse:
        request = W.ListRunsRequest(tags={"batch": "b1"}, page_size=2, page_token=token)
        return cyclone_server.workflows.ListRuns(request)

    first = page()
    assert [r.run_id for r in first.runs] == newest_first[:2]
    second = page(first.next_page_token)
    assert [r.run_id for r in second.runs] == newest_first[2:4]
    last = page(second.next_page_token)
    assert [r.run_id for r in last.runs] == newest_first[4:]
    assert not last.next_page_token
    back = page(last.prev_page_token)
    assert [r.run_id for r in back.runs] == newest_first[2:4]
    front = page(back.prev_page_token)
    assert [r.run_id for r in front.runs] == newest_first[:2]
    assert not front.prev_page_token


def test_submit_once_repeated_keeps_the_first_calls_tags(cyclone_server: Any) -> None:
    def once(tags: dict[str, str]) -> W.SubmitOnceResponse:
        request = W.SubmitOnceRequest(
            workflow=workflow("keyed", node("a")), key="order-9", tags=tags
        )
        return cyclone_server.workflows.SubmitOnce(request)

    first = once({"env": "prod"})
    again = once({"env": "dev", "extra": "x"})
    assert first.created and not again.created and again.run_id == first.run_id
    assert dict(get_run(cyclone_server, first.run_id).tags) == {"env": "prod"}
    # A bad tag is refused even when the key exists already.
    error = rpc_error(
        cyclone_server.workflows.SubmitOnce,
        W.SubmitOnceRequest(
            workflow=workflow("keyed", node("a")), key="order-9", tags={"bad key": "x"}
        ),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


HOSTILE_TAGS = [
    ({f"k{i}": "v" for i in range(17)}, "17 tags; at most 16"),
    ({"k" * 65: "v"}, "65 characters; at most 64"),
    ({"a b": "v"}, "may hold only ASCII letters"),
    ({"é": "v"}, "may hold only ASCII letters"),
    ({"k": "v" * 257}, "257 characters; at most 256"),
    ({"k\x00": "v"}, "may hold only ASCII letters"),
    ({"k": "v\x00"}, "contains a NUL character"),
    ({"": "v"}, "a tag key is empty"),
]


@pytest.mark.parametrize("tags, says", HOSTILE_TAGS)
def test_bad_tags_are_refused_at_submit_and_nothing_is_written(
    cyclone_server: Any, tags: dict[str, str], says: str
) -> None:
    for call, request in (
        (
            cyclone_server.workflows.Submit,
            W.SubmitRequest(workflow=workflow("w", node("a")), tags=tags),
        ),
        (
            cyclone_server.workflows.SubmitOnce,
            W.SubmitOnceRequest(workflow=workflow("w", node("a")), key="k-1", tags=tags),
        ),
    ):
        error = rpc_error(call, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in error.details()
        assert error.details().startswith("tags")
        assert len(error.details()) < 300  # the bad key or value is excerpted
    assert table_counts(cyclone_server)["runs"] == 0
    assert table_counts(cyclone_server)["submit_keys"] == 0


@pytest.mark.parametrize(
    "tags, says",
    [
        ({f"k{i}": "v" for i in range(5)}, "5 tags; at most 4"),
        ({"": "v"}, "a tag key is empty"),
        ({"k": "v\x00"}, "contains a NUL character"),
        ({"k" * 65: "v"}, "at most 64"),
    ],
)
def test_bad_tag_filters_are_refused(cyclone_server: Any, tags: dict[str, str], says: str) -> None:
    for call, request in (
        (cyclone_server.workflows.ListRuns, W.ListRunsRequest(tags=tags)),
        (cyclone_server.workflows.CountRuns, W.CountRunsRequest(tags=tags)),
    ):
        error = rpc_error(call, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in error.details()


def set_tags(server: Any, run_id: str, actor: str = "alice", **fields: Any) -> Any:
    request = A.SetRunTagsRequest(run_id=run_id, **fields)
    return server.admin.SetRunTags(request, metadata=[("cyclone-actor", actor)])


def test_set_run_tags_changes_them_with_an_audit_entry(cyclone_server: Any) -> None:
    run_id = submit_tagged(cyclone_server, "w", {"env": "prod", "team": "red"})
    reply = set_tags(
        cyclone_server,
        run_id,
        set_tags={"team": "blue", "ticket": "T-1"},
        remove_keys=["env"],
        reason="moved to the blue team",
    )
    assert dict(reply.run.tags) == {"team": "blue", "ticket": "T-1"}
    run = get_run(cyclone_server, run_id)
    assert dict(run.tags) == {"team": "blue", "ticket": "T-1"}
    [entry] = run.audit
    assert entry.action == "set_tags"
    assert entry.actor == "alice"
    assert entry.reason == "moved to the blue team"
    details = entry.details.struct_value
    assert dict(details.fields["before"].struct_value) == {"env": "prod", "team": "red"}
    assert dict(details.fields["after"].struct_value) == {"team": "blue", "ticket": "T-1"}
    # The filters see the change at once.
    assert listed(cyclone_server, tags={"team": "blue"}) == [run_id]
    assert listed(cyclone_server, tags={"env": "prod"}) == []
    # Removing every tag leaves none.
    set_tags(cyclone_server, run_id, remove_keys=["team", "ticket"], reason="cleanup")
    assert dict(get_run(cyclone_server, run_id).tags) == {}
    assert [e.action for e in get_run(cyclone_server, run_id).audit] == ["set_tags"] * 2


def test_set_run_tags_refusals(cyclone_server: Any) -> None:
    run_id = submit_tagged(cyclone_server, "w", {f"k{i}": "v" for i in range(15)})
    unknown = "01890000-0000-7000-8000-000000000000"
    cases = [
        (unknown, {"set_tags": {"a": "b"}}, grpc.StatusCode.NOT_FOUND, "not found"),
        (run_id, {}, grpc.StatusCode.INVALID_ARGUMENT, "set_tags or remove_keys"),
        (run_id, {"set_tags": {"a b": "c"}}, grpc.StatusCode.INVALID_ARGUMENT, "set_tags"),
        (run_id, {"remove_keys": [""]}, grpc.StatusCode.INVALID_ARGUMENT, "empty"),
        (
            run_id,
            {"set_tags": {"x": "1", "y": "2"}},
            grpc.StatusCode.INVALID_ARGUMENT,
            "would carry 17 tags",
        ),
    ]
    for target, fields, code, says in cases:
        error = rpc_error(set_tags, cyclone_server, target, **fields)
        assert error.code() == code, (fields, error.details())
        assert says in error.details()
    run = get_run(cyclone_server, run_id)
    assert len(run.tags) == 15 and not run.audit
    # Replacing one and adding one stays within the cap.
    set_tags(cyclone_server, run_id, set_tags={"x": "1"}, remove_keys=["k0"])
    assert len(get_run(cyclone_server, run_id).tags) == 15


def test_retention_purges_a_runs_tags_with_it(server_factory: Any) -> None:
    server = server_factory(retention_s=DAY)
    old = submit_tagged(server, "w", {"env": "prod"})
    drain(server, "work")
    server.advance_clock(2 * DAY)
    kept = submit_tagged(server, "w", {"env": "prod"})
    assert server.call(server.server.purge) == 1
    assert listed(server, tags={"env": "prod"}) == [kept]
    assert counted(server, tags={"env": "prod"}) == {types_pb2.RUN_STATUS_RUNNING: 1}
    assert server.sql("SELECT count(*) FROM cyclone.runs WHERE run_id = %s", old) == [(0,)]


def test_the_client_and_the_cli_submit_list_show_and_change_tags(
    cyclone_server: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyclient import Client, InvalidArgument, Workflow, cli

    wf = Workflow("tagged")
    wf.node("a")
    with Client(cyclone_server.address) as client:
        first = client.submit(wf, tags={"env": "prod", "team": "red"})
        once = client.submit_once(wf, "k-1", tags={"env": "dev"})
        assert [r.run_id for r in client.list_runs(tags={"env": "prod"}).runs] == [first]
        assert client.get_run(once.run_id).tags == {"env": "dev"}
        counts = client.count_runs(tags={"team": "red"})
        assert counts["running"].count == 1
        changed = client.set_run_tags(first, set={"team": "blue"}, reason="moved")
        assert changed.tags == {"env": "prod", "team": "blue"}
        with pytest.raises(InvalidArgument, match="at most 4"):
            client.list_runs(tags={f"k{i}": "v" for i in range(5)})

        path = tmp_path / "wf.yaml"
        path.write_text("name: tagged\nnodes:\n  - name: a\n")
        argv = ["submit", str(path), "--tag", "env=prod", "--tag", "ticket=T-9", "--json"]
        assert cli.main(argv, client=client) == 0
        made = json.loads(capsys.readouterr().out)["run_id"]
        assert client.get_run(made).tags == {"env": "prod", "ticket": "T-9"}

        def run_ids(*flags: str) -> list[str]:
            assert cli.main(["runs", "list", "--json", *flags], client=client) == 0
            return [r["run_id"] for r in json.loads(capsys.readouterr().out)]

        assert run_ids("--tag", "env=prod") == [made, first]
        assert run_ids("--tag", "env=prod", "--tag", "ticket=T-9") == [made]
        argv = ["set-tags", made, "--set", "ticket=T-10", "--remove", "env", "--reason", "typo"]
        assert cli.main(argv, client=client) == 0
        capsys.readouterr()
        assert cli.main(["run", "show", made], client=client) == 0
        shown = capsys.readouterr().out
        assert "tags ticket=T-10" in shown and "set_tags by" in shown and "typo" in shown
        # A tag that is not KEY=VALUE, or a key given twice, is refused before any call.
        with pytest.raises(SystemExit):
            cli.main(["runs", "list", "--tag", "env"], client=client)
        assert cli.main(["runs", "list", "--tag", "a=1", "--tag", "a=2"], client=client) == 1
        assert "given twice" in capsys.readouterr().err


def test_the_console_filters_runs_by_tags_and_shows_a_runs_tags(cyclone_server: Any) -> None:
    from tests.console_thread import ConsoleThread
    from tests.test_console_html import Browserless
    from tests.test_console_lists import rows_of

    prod = submit_tagged(cyclone_server, "orders", {"env": "prod", "team": "red"})
    dev = submit_tagged(cyclone_server, "orders", {"env": "dev", "team": "red"})
    console = ConsoleThread(cyclone_server.address)
    try:
        visitor = Browserless(console.url)
        assert rows_of(visitor.get("/runs?tags=env%3Dprod").text) == [prod]
        assert rows_of(visitor.get("/runs?tags=team%3Dred").text) == [dev, prod]
        assert rows_of(visitor.get("/runs?tags=team%3Dred+env%3Ddev").text) == [dev]
        counts = visitor.get("/runs/counts?tags=team%3Dred").text
        assert 'data-status="running">2<' in counts
        bad = visitor.get("/runs?tags=env").text
        assert rows_of(bad) == [] and "is not KEY=VALUE" in bad
        page = visitor.get(f"/runs/{prod}").text
        assert "env=prod" in page and "team=red" in page
    finally:
        console.stop()
