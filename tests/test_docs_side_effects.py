"""docs/side-effects.md: its Python examples compile and its cyclone commands parse."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pyclient import cli

PAGE = Path(__file__).resolve().parent.parent / "docs" / "side-effects.md"
BLOCKS = re.findall(r"^```(\w*)\n(.*?)^```", PAGE.read_text(), re.MULTILINE | re.DOTALL)


def test_the_page_has_python_examples_and_commands():
    languages = [lang for lang, _ in BLOCKS]
    assert languages.count("python") >= 5
    assert len(_commands()) >= 5


@pytest.mark.parametrize("code", [code for lang, code in BLOCKS if lang == "python"])
def test_each_python_example_on_the_page_compiles(code):
    compile(code, str(PAGE), "exec")


def _commands() -> list[str]:
    found = []
    for _, code in BLOCKS:
        for line in code.splitlines():
            line = line.removeprefix("$ ")
            if line.startswith("cyclone "):
                found.append(line)
    return found


@pytest.mark.parametrize("line", _commands())
def test_command_parses_with_the_real_command_line(line):
    args = cli.build_parser().parse_args(shlex.split(line)[1:])
    if args.command == "resolve":
        assert args.reason
