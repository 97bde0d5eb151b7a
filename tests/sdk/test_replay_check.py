"""The replay check: `cyclone journal export` takes durable nodes' journals from a real
server, and pyclient.testing.replay replays them against today's code in a unit test,
passing a compatible change and failing a breaking one, without running a step."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyclient import Client, cli, testing
from tests.helpers import PATIENCE, eventually
from tests.sdk.patch_bodies import VERSIONS

WORKER_SCRIPT = Path(__file__).with_name("patch_worker_process.py")


def _node(journal: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "run_id": "r-1",
        "node": "order",
        "action": "order",
        "input": "o-1",
        **fields,
        "journal": journal,
    }


def _entry(seq: int, step_id: str, function: str, output: Any = None, **fields: Any) -> dict:
    return {
        "step_id": step_id,
        "seq": seq,
        "function": function,
        "status": "succeeded",
        "output": output,
        **fields,
    }


WAITING_ON_V1 = [
    _entry(1, "reserve", "reserve", "reserve:o-1"),
    _entry(2, "event:go", "cyclone.event", status="waiting"),
]


@pytest.fixture
def step_log(tmp_path, monkeypatch) -> Path:
    log = tmp_path / "steps.log"
    monkeypatch.setenv("CYCLONE_PATCH_LOG", str(log))
    return log


# -- in memory, from hand-made exports


CANCELLED_ON_V1 = [WAITING_ON_V1[0], {**WAITING_ON_V1[1], "status": "cancelled"}]


@pytest.mark.parametrize("journal", [WAITING_ON_V1, CANCELLED_ON_V1], ids=["waiting", "cancelled"])
def test_a_compatible_change_passes_and_runs_no_step(step_log, journal) -> None:
    """A cancelled run's wait (GetRun says cancelled) stops the replay as a wait does."""
    export = {"nodes": [_node(journal)]}
    for version in ("v1", "v2"):
        report = testing.replay(VERSIONS[version], export, action="order")
        assert report.ok
        result = report.results[0]
        assert result.replayed == 1 and result.stopped_at == "call #2 'event:go' (cyclone.event)"
    assert not step_log.exists()  # no step function ran


def test_a_breaking_change_fails_naming_the_run_the_node_and_both_calls(step_log) -> None:
    export = {"nodes": [_node(WAITING_ON_V1), _node(WAITING_ON_V1[:1], run_id="r-2")]}
    with pytest.raises(AssertionError) as failed:
        testing.replay(VERSIONS["breaking"], export, action="order")
    message = str(failed.value)
    assert "1 of 2 journals do not replay" in message
    assert "run r-1 node order (order): ReplayMismatch" in message
    assert "call #2 recorded step 'event:go' of cyclone.event" in message
    assert "this replay makes step 'check_fraud' of check_fraud there" in message
    assert "r-2" not in message  # its journal ends before the change: it passes
    assert isinstance(failed.value, testing.ReplayCheckFailed)
    assert [r.ok for r in failed.value.results] == [False, True]
    assert not step_log.exists()


def test_a_finished_journal_replays_to_the_body_s_end() -> None:
    journal = [
        *WAITING_ON_V1[:1],
        _entry(2, "event:go", "cyclone.event"),
        _entry(3, "charge", "charge", "charge:o-1"),
    ]
    report = testing.replay(VERSIONS["v1"], {"nodes": [_node(journal)]}, action="order")
    assert report.ok and report.results[0].stopped_at is None
    assert report.results[0].replayed == 3
    # v2's patch after the wait: the finished run went past it on v1, and replays.
    assert testing.replay(VERSIONS["v2"], {"nodes": [_node(journal)]}, action="order").ok
    # v3 deleted fraud's old branch: a run that took it (on v1) cannot replay on v3.
    with pytest.raises(testing.ReplayCheckFailed, match="makes step 'check_fraud'"):
        testing.replay(VERSIONS["v3"], {"nodes": [_node(journal)]}, action="order")


def test_an_export_without_the_body_s_action_is_an_error_not_a_pass() -> None:
    with pytest.raises(AssertionError, match="no journal of action 'order'"):
        testing.replay(VERSIONS["v1"], {"nodes": [_node([], action="other")]}, action="order")
    with pytest.raises(ValueError, match="not a journal export"):
        testing.replay(VERSIONS["v1"], {"runs": []})


# -- from a real server: the CLI export, then the replay


@pytest.fixture
def v1_worker(cyclone_server, tmp_path) -> Iterator[None]:
    log = tmp_path / "steps.log"
    proc = subprocess.Popen(
        [sys.executable, str(WORKER_SCRIPT), cyclone_server.address, str(log), "v1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=PATIENCE)
        assert proc.returncode == 0, stderr
    finally:
        proc.kill()
        proc.communicate()


def _waiting(client: Client, run_id: str) -> bool:
    return client.get_run(run_id).steps[0].waiting_for == "event go"


@pytest.mark.slow
def test_export_from_a_server_then_replay(cyclone_server, client, v1_worker, tmp_path, capsys):
    waiting = client.start("order", "o-1")
    finished = client.start("order", "o-2")
    client.send_event(finished, "go")
    assert client.wait(finished, timeout=PATIENCE).status == "completed"
    eventually(lambda: _waiting(client, waiting), "the run waiting for its event")

    path = tmp_path / "journals.json"
    address = ["--address", cyclone_server.address]
    assert cli.main([*address, "journal", "export", waiting, finished, "-o", str(path)]) == 0
    assert "wrote 2 journal(s) of 2 run(s)" in capsys.readouterr().out
    exported = json.loads(path.read_text())
    by_run = {n["run_id"]: n for n in exported["nodes"]}
    assert by_run[waiting]["action"] == "order" and by_run[waiting]["run_input"] == "o-1"
    assert [e["step_id"] for e in by_run[finished]["journal"]] == [
        "reserve",
        "event:go",
        "charge",
    ]
    assert by_run[finished]["journal"][2]["output"] == "charge:o-2"

    # The filter form, to stdout.
    assert cli.main([*address, "journal", "export", "--workflow", "order", "--limit", "5"]) == 0
    assert {n["run_id"] for n in json.loads(capsys.readouterr().out)["nodes"]} == {
        waiting,
        finished,
    }
    assert cli.main([*address, "journal", "export", "--workflow", "order", "--limit", "1"]) == 0
    assert len(json.loads(capsys.readouterr().out)["nodes"]) == 1

    # The patched code replays both; the unpatched change breaks both.
    assert testing.replay(VERSIONS["v2"], path, action="order").ok
    with pytest.raises(testing.ReplayCheckFailed) as failed:
        testing.replay(VERSIONS["breaking"], str(path), action="order")
    message = str(failed.value)
    assert "2 of 2 journals do not replay" in message
    assert f"run {waiting} node order (order): ReplayMismatch" in message
    assert f"run {finished} node order (order): ReplayMismatch" in message
