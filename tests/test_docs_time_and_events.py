"""docs/time-and-events.md: its Python examples compile, its cyclone commands parse, and
its first example runs as written against a live server."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from pyclient import cli

PAGE = Path(__file__).resolve().parent.parent / "docs" / "time-and-events.md"
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
COMMANDS = [
    line for lang, code in BLOCKS if lang == "sh" for line in code.splitlines() if line.strip()
]


@pytest.mark.parametrize("code", PYTHON)
def test_each_python_example_compiles(code):
    compile(code, str(PAGE), "exec")


@pytest.mark.parametrize("line", COMMANDS)
def test_each_command_parses_with_the_real_command_line(line):
    args = cli.build_parser().parse_args(shlex.split(line)[1:])
    assert (args.command, args.event_command) == ("event", "send")


def test_the_first_example_runs_as_written(cyclone_server):
    code = PYTHON[0].replace("127.0.0.1:50051", cyclone_server.address)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(PAGE), "exec"), {"__name__": "time_and_events_example"})
    printed = out.getvalue().splitlines()
    assert printed[-1] == "confirmed", printed
    assert printed.count("mail to ann@example.com: welcome") == 1
    assert "mail to ann@example.com: thanks, Ann" in printed
