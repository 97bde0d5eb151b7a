"""The server and the SDK share only the core package (cyclone); neither imports the
other, and the core imports neither. The console reaches the server through the SDK only."""

import ast
import re
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


# The server's wings ------------------------------------------------------------------
#
# service/ is three wings, each a package importing only downward:
#   service/api     the gRPC services, request validation, protobuf building, the Work
#                   stream's protocol and the error-to-status boundary; may import the
#                   engine and the db wing;
#   service/engine  the claim loop, completions' accounting, waits, Explain, schedule
#                   firing, the dispatcher and the upkeep passes; may import the db wing;
#   service/db      the pool, the translation of database errors, and one module (with
#                   its .sql file of named queries) per table family.
# The top level keeps the wiring (server.py, main.py) and what every wing may use
# (config, errors, logs, loop, metrics, tls, embedded, migrate).

WINGS_ROOT = ROOT / "service"
#: Top-level modules that may speak gRPC: the wiring (server.py builds the gRPC server
#: and registers the api wing's servicers), metrics.py (its interceptor counts RPCs)
#: and tls.py (the server's credentials).
GRPC_OUTSIDE_API = {"service/server.py", "service/metrics.py", "service/tls.py"}
GRPC_PACKAGES = ("grpc", "grpc_health", "grpc_reflection", "google.protobuf", "cyclone.v1")
SQL_START = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH")


def _wing_imports(path: Path) -> set[str]:
    """The modules ``path`` imports, absolute dotted names (``from a import b`` gives
    both a and a.b)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _wing_modules(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def _wing_under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _wing_rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_only_the_api_wing_and_the_wiring_speak_grpc_and_protobuf():
    speaking = {
        _wing_rel(path): sorted(n for n in _wing_imports(path) if _wing_under(n, GRPC_PACKAGES))
        for path in _wing_modules(WINGS_ROOT)
        if not _wing_rel(path).startswith("service/api/")
        and _wing_rel(path) not in GRPC_OUTSIDE_API
    }
    assert {path: names for path, names in speaking.items() if names} == {}


def test_the_engine_wing_imports_neither_the_api_nor_grpc_and_holds_no_sql():
    for path in _wing_modules(WINGS_ROOT / "engine"):
        imported = _wing_imports(path)
        assert not sorted(n for n in imported if _wing_under(n, ("service.api", *GRPC_PACKAGES))), (
            path
        )
        texts = [
            node.value.lstrip()
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        ]
        assert [t for t in texts if t.upper().startswith(SQL_START) and t[:6].isupper()] == [], path


def test_the_db_wing_imports_neither_the_api_nor_the_engine():
    found = {
        _wing_rel(path): sorted(
            n for n in _wing_imports(path) if _wing_under(n, ("service.api", "service.engine"))
        )
        for path in _wing_modules(WINGS_ROOT / "db")
    }
    assert {path: names for path, names in found.items() if names} == {}


def test_no_module_of_the_server_is_over_600_lines_nor_a_function_over_80():
    long_modules = {}
    long_functions = {}
    for path in _wing_modules(WINGS_ROOT):
        source = path.read_text()
        if source.count("\n") > 600:
            long_modules[_wing_rel(path)] = source.count("\n")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long_functions[f"{_wing_rel(path)}:{node.name}"] = lines
    assert long_modules == {}
    assert long_functions == {}


def _wing_query_names(path: Path) -> set[str]:
    """The names of the named queries a db module runs: the literal first argument of
    _all, _one and _logged (the second of _run), or a literal assigned to ``name``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            position = {"_all": 0, "_one": 0, "_logged": 0, "_run": 1}.get(node.func.attr)
            if position is not None and len(node.args) > position:
                argument = node.args[position]
                if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                    names.add(argument.value)
        elif isinstance(node, ast.Assign) and [
            t.id for t in node.targets if isinstance(t, ast.Name)
        ] == ["name"]:
            for value in ast.walk(node.value):
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    names.add(value.value)
    return names


def test_every_named_query_the_db_wing_runs_exists_and_every_one_is_run():
    from service.db.pool import Q

    run = set().union(*(_wing_query_names(path) for path in _wing_modules(WINGS_ROOT / "db")))
    assert sorted(run - Q.keys()) == []
    assert sorted(Q.keys() - run) == []


def test_each_named_query_lives_in_the_sql_file_of_its_family():
    """Each .sql file of service/db/ sits beside the module of its table family, and
    that module runs its queries (pool.py runs the few every family shares)."""
    shared = _wing_query_names(WINGS_ROOT / "db" / "pool.py")
    for sql in sorted((WINGS_ROOT / "db").glob("*.sql")):
        names = set(re.findall(r"^-- name: (\w+)\s*$", sql.read_text(), re.M))
        module = sql.with_suffix(".py")
        assert module.exists(), sql
        assert names, sql
        assert names <= _wing_query_names(module) | shared | _wing_query_names(
            WINGS_ROOT / "db" / "shards.py"
        ), sql
