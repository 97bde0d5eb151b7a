"""docs/webhooks.md: its cyclone commands parse with the real command line, and its
signing example is taken by a live server as written."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from pyclient import Client, cli

PAGE = Path(__file__).resolve().parent.parent / "docs" / "webhooks.md"
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
COMMANDS = [
    line for lang, code in BLOCKS if lang == "sh" for line in code.splitlines() if line.strip()
]


@pytest.mark.parametrize("line", COMMANDS)
def test_each_command_parses_with_the_real_command_line(line: str) -> None:
    args = cli.build_parser().parse_args(shlex.split(line)[1:])
    assert args.command == "webhook"


def test_the_signing_example_is_taken_as_written(server_factory: Any) -> None:
    server = server_factory(http_listen="127.0.0.1:0")
    with Client(server.address) as client:
        client.create_webhook(
            "orders", workflow="order", key_pointer="/order/id", secret="whsec-0123456789abcdef"
        )
    [code] = PYTHON
    code = code.replace("https://cyclone.example.com", server.server.http_url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(PAGE), "exec"), {"__name__": "webhooks_example"})
    answer = json.loads(out.getvalue())
    assert answer["status"] == "submitted" and answer["created"] is True
    assert server.sql("SELECT workflow, submit_key FROM cyclone.runs") == [("order", "o-17")]
    assert server.sql("SELECT delivery_id FROM cyclone.webhook_deliveries") == [("evt_1P2x9",)]
