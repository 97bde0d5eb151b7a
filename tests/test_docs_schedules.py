"""docs/schedules.md runs as written against a live server: its Python example, then
its `cyclone schedule` commands, in order."""

from __future__ import annotations

import re
import shlex
from datetime import UTC

from pyclient import Client, cli
from tests.conftest import ROOT

PAGE = (ROOT / "docs" / "schedules.md").read_text()
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", PAGE, re.MULTILINE | re.DOTALL)
DOC_ADDRESS = "127.0.0.1:50051"
REPORT_YAML = """\
name: report
input: {scope: daily}
nodes:
  - {name: build, action: build_report}
  - {name: mail, action: mail_report, depends_on: [build]}
"""


def test_the_python_example_and_the_commands_work_as_written(
    cyclone_server, tmp_path, monkeypatch, capsys
):
    [python] = [code for lang, code in BLOCKS if lang == "python"]
    exec(compile(python.replace(DOC_ADDRESS, cyclone_server.address), "schedules.md", "exec"), {})
    printed = capsys.readouterr().out.strip()
    with Client(cyclone_server.address) as client:
        nightly = client.get_schedule("nightly-report")
        assert printed == str(nightly.next_fire_at)
        assert nightly.next_fire_at.astimezone(UTC).minute == 30
        poll = client.get_schedule("poll-orders")
        assert (poll.overlap, poll.catch_up, poll.interval.total_seconds()) == ("allow", "all", 300)
        client.delete_schedule("nightly-report")
        client.delete_schedule("poll-orders")

    monkeypatch.chdir(tmp_path)
    (tmp_path / "report.yaml").write_text(REPORT_YAML)
    commands = [
        line
        for lang, code in BLOCKS
        if lang == "sh"
        for line in code.splitlines()
        if line.startswith("cyclone schedule ")
    ]
    assert [shlex.split(c)[2] for c in commands] == [
        "create",
        "create",
        "list",
        "get",
        "pause",
        "resume",
        "delete",
    ]
    for command in commands:
        assert cli.main([*shlex.split(command)[1:], "--address", cyclone_server.address]) == 0, (
            command
        )
    assert cyclone_server.sql("SELECT name, input FROM cyclone.schedules") == [
        ("nightly-report", {"scope": "daily"})
    ]
