"""The `languages` scenario of `make bench`: the throughput scenario's one-node no-op
runs drained by each SDK's worker in turn, 2 processes of 64 slots each, every SDK on
the same server and database in the same run; steps/s and the worker processes' CPU
per step, each also as a ratio to the Python SDK's.

A language's bench worker (bench/workers/) takes ``--address``, ``--action`` and
``--concurrency``, serves that action with a no-op handler through its SDK's Worker
until SIGTERM, and, when CYCLONE_BENCH_STARTUP_DIR is set, writes the CPU seconds it
spent starting (user and system) to a file named after its pid there, before its first
claim: the bench leaves that out of the CPU per step.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Worker processes per SDK, and the slots of each.
PROCESSES = 2
CONCURRENCY = 64


def _python() -> list[str]:
    return [sys.executable, str(ROOT / "bench" / "workers" / "python_worker.py")]


def _go() -> list[str]:
    """bench/workers/go, built with `go build` into .cyclone/bench (git-ignored)."""
    go = shutil.which("go")
    if go is None:
        raise SystemExit("the languages scenario needs Go (go on PATH) for the Go SDK's worker")
    binary = ROOT / ".cyclone" / "bench" / "go-worker"
    subprocess.run(
        [go, "build", "-o", str(binary), "."], cwd=ROOT / "bench" / "workers" / "go", check=True
    )
    return [str(binary)]


def _npm(folder: Path, *args: str) -> None:
    npm = shutil.which("npm")
    assert npm is not None, "npm is not installed: the TypeScript bench worker needs Node.js"
    out = subprocess.run([npm, *args], cwd=folder, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"npm {' '.join(args)} in {folder}:\n{out.stdout}\n{out.stderr}"


def _ts() -> list[str]:
    """bench/workers/ts, compiled on the SDK (sdk/ts) of this checkout."""
    node = shutil.which("node")
    assert node is not None, "node is not installed: the TypeScript bench worker needs it"
    for folder in (ROOT / "sdk" / "ts", ROOT / "bench" / "workers" / "ts"):
        installed = folder / "node_modules" / ".package-lock.json"  # npm dates its install
        if (
            not installed.exists()
            or installed.stat().st_mtime < (folder / "package-lock.json").stat().st_mtime
        ):
            _npm(folder, "ci", "--no-audit", "--no-fund")
        _npm(folder, "run", "build")
    return [node, str(ROOT / "bench" / "workers" / "ts" / "dist" / "worker.js")]


#: Each SDK's bench worker: builds it (once) and returns the command that starts one.
LANGUAGES: dict[str, Callable[[], list[str]]] = {"python": _python, "go": _go, "ts": _ts}


def drain(
    bench: Any, server: Any, database_url: str, runs: int, action: str, command: list[str]
) -> dict:
    """``runs`` one-node runs of ``action`` drained by PROCESSES workers of ``command``."""
    import psycopg

    bench.submit_many(server.address, [bench.one_node("one", action)] * runs)
    with bench.CpuMeter(server) as cpu, psycopg.connect(database_url, autocommit=True) as conn:
        flags = ["--address", server.address, "--action", action, "--concurrency", str(CONCURRENCY)]
        procs = [subprocess.Popen([*command, *flags], cwd=ROOT) for _ in range(PROCESSES)]
        bench.wait_drained(conn, action, runs, lambda: any(p.poll() is not None for p in procs))
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(60) for p in procs]
    assert codes == [0] * PROCESSES, f"{command[0]}: worker exit statuses {codes}"
    n, rate = bench.steps_per_second(database_url, action)
    assert n == runs, f"{n} of {runs} steps completed"
    return {
        "steps": n,
        "steps_per_s": round(rate, 1),
        "cpu_ms_per_step": cpu.per_step(n, "server", "workers", "postgres"),
        "worker_startup_cpu_ms": cpu.startup_ms(),
    }


def scenario(bench: Any, server: Any, database_url: str, runs: int) -> dict:
    """Every SDK's drain, then each one's ratios to Python's."""
    results = {}
    for name, build in LANGUAGES.items():
        results[name] = drain(bench, server, database_url, runs, f"lang-{name}", build())
        print("languages", name, results[name], flush=True)
    python = results["python"]
    for result in results.values():
        result["rate_vs_python"] = round(result["steps_per_s"] / python["steps_per_s"], 2)
        result["workers_cpu_vs_python"] = round(
            result["cpu_ms_per_step"]["workers"] / python["cpu_ms_per_step"]["workers"], 2
        )
    return results
