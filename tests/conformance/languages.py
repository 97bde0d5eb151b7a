"""The languages whose conformance workers the suite runs (tests/conformance/README.md).

Each is built once per test session; ``command`` then starts one of its workers, to
which the suite adds the flags of the README."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Language:
    name: str
    #: Builds the worker (needs the language's tools) and returns the command that
    #: starts one, run from the repository's root.
    build: Callable[[], list[str]]


def _python() -> list[str]:
    return [sys.executable, "-m", "tests.conformance.python_worker"]


LANGUAGES: dict[str, Language] = {
    language.name: language for language in [Language("python", _python)]
}
