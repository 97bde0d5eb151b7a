"""The server and the SDK share only the core package (cyclone); neither imports the
other, and the core imports neither. The console reaches the server through the SDK only."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imported_packages(folder: Path) -> dict[str, set[str]]:
    """{top-level package imported: files of ``folder`` that import it}."""
    found: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.partition(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("service", {"pyclient"}),
        ("pyclient", {"service"}),
        ("core/cyclone", {"service", "pyclient"}),
        # The console is a client of the API: it calls the server through the SDK only.
        ("console", {"service"}),
    ],
)
def test_server_and_sdk_import_each_other_never_only_the_core(folder, forbidden):
    imported = _imported_packages(ROOT / folder)
    assert "cyclone" in imported or folder in ("core/cyclone", "console")
    assert {name: sorted(imported[name]) for name in forbidden & imported.keys()} == {}
