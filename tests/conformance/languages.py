"""The languages whose conformance workers the suite runs (tests/conformance/README.md).

Each is built once per test session; ``command`` then starts one of its workers, to
which the suite adds the flags of the README."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import missing_tool

ROOT = Path(__file__).resolve().parents[2]
#: Where the workers that need building are built (git-ignored).
BUILD = ROOT / ".cyclone" / "conformance"


@dataclass(frozen=True)
class Language:
    name: str
    #: Builds the worker (needs the language's tools) and returns the command that
    #: starts one, run from the repository's root.
    build: Callable[[], list[str]]


def _python() -> list[str]:
    return [sys.executable, "-m", "tests.conformance.python_worker"]


def _go() -> list[str]:
    """tests/conformance/go, built with `go build` (its go.mod takes the SDK from
    sdk/go through a replace directive)."""
    go = shutil.which("go")
    if go is None:
        missing_tool("the Go conformance worker needs Go (go on PATH)")
    binary = BUILD / "go-worker"
    out = subprocess.run(
        [go, "build", "-o", str(binary), "."],
        cwd=ROOT / "tests" / "conformance" / "go",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, f"go build failed:\n{out.stdout}\n{out.stderr}"
    return [str(binary)]


def _npm(*args: str, cwd: Path) -> None:
    npm = shutil.which("npm")
    assert npm is not None
    out = subprocess.run([npm, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"npm {' '.join(args)} in {cwd} failed:\n{out.stdout}\n{out.stderr}"


def _npm_ci(folder: Path) -> None:
    """`npm ci` in folder, unless its node_modules hold its lock file already."""
    installed = folder / "node_modules" / ".package-lock.json"
    lock = folder / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        _npm("ci", "--no-audit", "--no-fund", cwd=folder)


def _ts() -> list[str]:
    """tests/conformance/ts, compiled on the SDK (sdk/ts) built from this checkout."""
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        missing_tool("node or npm is not installed: the TypeScript conformance worker needs them")
    for folder in (ROOT / "sdk" / "ts", ROOT / "tests" / "conformance" / "ts"):
        _npm_ci(folder)
        _npm("run", "build", cwd=folder)
    return [node, str(ROOT / "tests" / "conformance" / "ts" / "dist" / "worker.js")]


LANGUAGES: dict[str, Language] = {
    language.name: language
    for language in [Language("python", _python), Language("go", _go), Language("ts", _ts)]
}
