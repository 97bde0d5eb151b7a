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


# General rules of the code's shape: modules import each other without cycles, and no
# module or function grows past what a reader can hold. Each rule is parametrized by
# folder, so that a folder is added to a rule by adding it to the rule's list.

#: Import name of each folder's package, for the folders these rules look at.
PACKAGES = {
    "service": "service",
    "pyclient": "pyclient",
    "core/cyclone": "cyclone",
    "console": "console",
}
#: Generated code, which these rules do not judge.
GENERATED = ("core/cyclone/v1",)

#: The folders whose modules must not import each other around a cycle.
ACYCLIC = ["service", "pyclient", "core/cyclone", "console"]
#: The folders whose modules and functions must stay under the sizes below.
SIZED = ["service", "pyclient", "core/cyclone", "console"]
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def _sources(folder: str) -> list[Path]:
    return sorted(
        path
        for path in (ROOT / folder).rglob("*.py")
        if not any(path.is_relative_to(ROOT / generated) for generated in GENERATED)
    )


def _modules(folder: str) -> dict[str, Path]:
    """{dotted module name: its file} for the package in ``folder``."""
    found = {}
    for path in _sources(folder):
        parts = [PACKAGES[folder], *path.relative_to(ROOT / folder).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports, anywhere in its body
    (under ``TYPE_CHECKING`` and inside functions too). ``from pkg import sub`` depends
    on the submodule ``pkg.sub`` only, not on ``pkg``'s ``__init__``."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            submodules = {f"{origin}.{alias.name}" for alias in node.names} & known.keys()
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(origin)
    return (found & known.keys()) - {name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted, then sorted by their first module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def test_import_graph_counts_every_import_and_a_submodule_as_itself(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    sources = {
        "__init__.py": "from pkg.a import thing\n",
        "a.py": "from pkg import b\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.c import C\n",
        "c.py": "def f():\n    from . import d\n",
        "d.py": "from pkg import VALUE\n",
    }
    for name, text in sources.items():
        (package / name).write_text(text)
    known = {"pkg": package / "__init__.py"} | {
        f"pkg.{name[:-3]}": package / name for name in sources if name != "__init__.py"
    }
    graph = {name: _imports(name, path, known) for name, path in known.items()}
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},  # the submodule, not the package's __init__
        "pkg.b": {"pkg.c"},  # under TYPE_CHECKING
        "pkg.c": {"pkg.d"},  # inside a function, relative
        "pkg.d": {"pkg"},  # a name of the package's __init__
    }
    assert _cycles(graph) == [["pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"]]


def test_cycle_finder_finds_cycles_and_only_them():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert _cycles(graph) == [["a", "b", "c"], ["d", "e"]]


@pytest.mark.parametrize("folder", ACYCLIC)
def test_modules_import_each_other_without_cycles(folder):
    modules = _modules(folder)
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycles = _cycles(graph)
    assert not cycles, "modules that reach each other by imports, one group a line:\n" + (
        "\n".join(", ".join(cycle) for cycle in cycles)
    )


@pytest.mark.parametrize("folder", SIZED)
def test_no_module_is_over_600_lines(folder):
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _sources(folder)}
    over = {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


@pytest.mark.parametrize("folder", SIZED)
def test_no_function_is_over_80_lines(folder):
    long = {}
    for path in _sources(folder):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


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


def _wing_query_names(path: Path) -> set[str]:
    """The names of the named queries a db module runs: the literal first argument of
    _all, _one and _logged (the second of _run and _all_on, the third of _on_shard), or
    a literal assigned to ``name``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            position = {
                "_all": 0,
                "_one": 0,
                "_logged": 0,
                "_run": 1,
                "_all_on": 1,
                "_on_shard": 2,
            }.get(node.func.attr)
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
