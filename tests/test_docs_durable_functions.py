"""docs/durable-functions.md: its Python examples compile, its cyclone commands parse,
and the ported seed examples run, with fake outside systems, through the test the page
shows (pyclient.testing.DurableNode)."""

from __future__ import annotations

import datetime
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from pyclient import Worker, cli, current, step

PAGE = Path(__file__).resolve().parent.parent / "docs" / "durable-functions.md"
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]


def test_the_page_has_python_examples_and_the_three_resolve_commands():
    assert len(PYTHON) >= 6
    resolves = [line for line in _commands() if line.startswith("cyclone resolve")]
    assert [shlex.split(line)[4] for line in resolves] == ["--result", "--error", "--discard"]


@pytest.mark.parametrize("code", PYTHON)
def test_each_python_example_on_the_page_compiles(code):
    compile(code, str(PAGE), "exec")


def _commands() -> list[str]:
    lines = (line.removeprefix("$ ") for _, code in BLOCKS for line in code.splitlines())
    return [line for line in lines if line.startswith("cyclone ")]


@pytest.mark.parametrize("line", _commands())
def test_command_parses_with_the_real_command_line(line):
    args = cli.build_parser().parse_args(shlex.split(line.replace("<run_id>", "RUN"))[1:])
    assert args.command in ("resolve", "run", "journal", "query", "update")


class Fake:
    """An outside system that counts its calls."""

    def __init__(self, **answers: Any):
        self.answers = answers
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args))
            return self.answers.get(name)

        return call


#: What `cyclone journal export` would write for a run of the page's "order" that waits
#: for its approval on the code before the patch: the page's replay check reads it.
ORDER_EXPORT = {
    "format": "cyclone.journals/1",
    "nodes": [
        {
            "run_id": "01a22dbb-6f57-706a-909d-463f7a41e66b",
            "node": "order",
            "action": "order",
            "run_input": {"id": "o-1", "amount": 42},
            "journal": [
                {"step_id": "reserve", "seq": 1, "function": "reserve", "status": "succeeded"},
                {
                    "step_id": "event:approved",
                    "seq": 2,
                    "function": "cyclone.event",
                    "status": "waiting",
                },
            ],
        }
    ],
}


def test_the_ported_examples_run_and_the_page_s_own_test_passes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests" / "journals").mkdir(parents=True)
    (tmp_path / "tests" / "journals" / "order.json").write_text(json.dumps(ORDER_EXPORT))
    # What the first block imports and makes, which the later ones use.
    namespace: dict[str, Any] = {
        "step": step,
        "current": current,
        "worker": Worker("127.0.0.1:1"),
        "billing_api": Fake(charge={"charge_id": "ch_123"}),
        "stock_api": Fake(reserve="r-1"),
        "cloud_api": Fake(),
        "datetime": datetime.datetime,
        "UTC": datetime.UTC,
    }
    # Every block but the first, which starts a worker and a client.
    for code in PYTHON[1:]:
        exec(compile(code, str(PAGE), "exec"), namespace)
    tests = [name for name in namespace if name.startswith("test_")]
    assert tests, "the page shows no test"
    for name in tests:
        namespace[name]()
    # The unsafe charge ran once, though the worker died in the middle of it.
    assert [c for c, _ in namespace["billing_api"].calls] == ["charge"]
